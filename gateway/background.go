package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Background responses (POST /v1/responses with "background": true): the
// request is validated and admitted as any other, then answered at once
// with the response "queued" while a goroutine the Server owns generates
// it. The response is kept as it goes ("in_progress", then "completed",
// "incomplete", "failed" or "cancelled"), so a client polls it with GET
// /v1/responses/{id} on any gateway sharing the store, and stops it with
// POST /v1/responses/{id}/cancel on any of them: the gateway running it
// cancels at once; another leaves a cancel marker in the store, which the
// running gateway reads every cancelPoll. A background response holds its
// in-flight slots until it ends, and Shutdown waits for it as for any
// generation before cancelling it (it is then kept "failed").

// cancelPoll is how often a background response looks for a cancel
// marker left by another gateway; cancelWait is how long a cancel waits
// for the gateway running the response to keep it cancelled, after which
// the response is taken for lost with its gateway and kept cancelled by
// the canceller.
const (
	cancelPoll = 200 * time.Millisecond
	cancelWait = 10 * time.Second
)

// bgRun is a background response running on this gateway.
type bgRun struct {
	cancel    context.CancelFunc
	cancelled atomic.Bool   // asked to stop (not shut down)
	done      chan struct{} // closed once its last state is kept
}

// bgRuns are the background responses running on this gateway, by id.
type bgRuns struct {
	mu sync.Mutex
	m  map[string]*bgRun
}

func (b *bgRuns) add(id string, r *bgRun) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]*bgRun{}
	}
	b.m[id] = r
}

func (b *bgRuns) remove(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, id)
}

func (b *bgRuns) get(id string) *bgRun {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[id]
}

// responseState is what the gateway reads of a kept response object.
type responseState struct {
	Status     string `json:"status"`
	Background bool   `json:"background"`
}

// running reports whether the response is still to be answered.
func (st responseState) running() bool { return st.Status == "queued" || st.Status == "in_progress" }

// statusOf reads a kept response object's state.
func statusOf(object json.RawMessage) responseState {
	var st responseState
	_ = json.Unmarshal(object, &st)
	return st
}

// startBackground admits rs's request, keeps it queued, answers with it
// and generates it on a goroutine the Server owns.
func (s *Server) startBackground(w http.ResponseWriter, r *http.Request, rs *responseRun, received time.Time) {
	switch {
	case !s.responses.enabled():
		writeAPIError(w, invalidParam("background", "background responses are kept as they run, and this gateway keeps no responses"))
		return
	case rs.rr.Store != nil && !*rs.rr.Store:
		writeAPIError(w, invalidParam("store", "a background response is kept as it runs: leave store out or set it true"))
		return
	case rs.j.stream:
		writeAPIError(w, badRequest("stream", "unsupported_parameter", "a background response is not streamed here; poll GET /v1/responses/{id} for it"))
		return
	case s.isClosing():
		writeAPIError(w, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "shutting_down", Message: "the server is shutting down"})
		return
	}
	n := rs.j.choices()
	if !s.lim.tryAcquire(n) {
		writeAPIError(w, tooManyRequests("queue_full", "too many requests in flight; retry later", s.cfg.RetryAfter))
		return
	}
	ctx, cancel := context.WithCancel(s.base)
	run := &bgRun{cancel: cancel, done: make(chan struct{})}
	rs.bg, rs.w, rs.store = true, nil, true
	queued := rs.object("queued", nil, nil)
	queued["store"] = true
	if err := rs.put(queued, "", nil); err != nil {
		cancel()
		s.lim.release(n)
		writeAPIError(w, storeError(err))
		return
	}
	s.bg.add(rs.id, run)
	started := s.start(true, func() {
		defer close(run.done)
		defer s.bg.remove(rs.id)
		defer s.lim.release(n)
		defer cancel()
		s.runBackground(ctx, run, rs, received)
	})
	if !started {
		s.bg.remove(rs.id)
		cancel()
		s.lim.release(n)
		rs.whole("failed", nil, nil, map[string]string{"code": "shutting_down", "message": "the server shut down before the response started"})
		writeAPIError(w, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "shutting_down", Message: "the server is shutting down"})
		return
	}
	writeJSON(w, http.StatusOK, queued)
}

// runBackground generates a background response and keeps each of its
// states.
func (s *Server) runBackground(ctx context.Context, run *bgRun, rs *responseRun, received time.Time) {
	progress := rs.object("in_progress", nil, nil)
	progress["store"] = true
	_ = rs.put(progress, "", nil) // a poll sees "queued" a little longer
	// Cancel markers left by other gateways.
	watched := make(chan struct{})
	wctx, stopWatch := context.WithCancel(ctx)
	go func() {
		defer close(watched)
		t := time.NewTicker(cancelPoll)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				if ok, _ := s.responses.cancelRequested(wctx, rs.id); ok {
					run.cancelled.Store(true)
					run.cancel()
					return
				}
			}
		}
	}()
	res, err := s.generate(ctx, rs.j.request(rs.id, 0), received, rs.token)
	stopWatch()
	<-watched
	switch {
	case err == nil && res.finish.Reason != FinishCancelled:
		rs.finish(res)
	case run.cancelled.Load():
		rs.whole("cancelled", nil, nil, nil)
	case s.base.Err() != nil:
		rs.whole("failed", nil, nil, map[string]string{"code": "server_shutdown", "message": "the server shut down before the response was answered"})
	default:
		if err == nil {
			err = errors.New("the generation was cancelled")
		}
		ae := s.backendError(err)
		rs.whole("failed", nil, nil, map[string]string{"code": ae.Code, "message": ae.Message})
	}
	_ = s.responses.clearCancel(rs.ctx, rs.id)
}

// handleCancelResponse stops a background response (POST
// /v1/responses/{id}/cancel) and answers with it as kept: cancelled, or
// as it ended where it had already. Cancelling twice answers the same.
func (s *Server) handleCancelResponse(w http.ResponseWriter, r *http.Request) {
	resp := s.keptResponse(w, r)
	if resp == nil {
		return
	}
	if !statusOf(resp.Object).Background {
		writeAPIError(w, invalidParam("", "only a background response can be cancelled"))
		return
	}
	if resp = s.stopBackground(w, r, resp); resp != nil {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(resp.Object)
	}
}

// stopBackground cancels the background response resp if it is still
// running and returns it as kept once it has ended; where the request
// ended first or the store failed, it has answered and returns nil.
func (s *Server) stopBackground(w http.ResponseWriter, r *http.Request, resp *storedResponse) *storedResponse {
	id := r.PathValue("id")
	if !statusOf(resp.Object).running() {
		return resp
	}
	if run := s.bg.get(id); run != nil {
		run.cancelled.Store(true)
		run.cancel()
		select {
		case <-run.done:
		case <-r.Context().Done():
			return nil
		}
		return s.keptResponse(w, r)
	}
	if err := s.responses.requestCancel(r.Context(), id, resp.Tenant); err != nil {
		writeAPIError(w, storeError(err))
		return nil
	}
	deadline := time.Now().Add(s.bgWait)
	for {
		t := time.NewTimer(cancelPoll / 4)
		select {
		case <-r.Context().Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if resp = s.keptResponse(w, r); resp == nil || !statusOf(resp.Object).running() {
			return resp
		}
		if time.Now().After(deadline) {
			break
		}
	}
	// No gateway answered the marker: the one running the response is
	// gone. The response is kept cancelled as it was last kept.
	var o map[string]any
	if err := json.Unmarshal(resp.Object, &o); err != nil {
		writeAPIError(w, storeError(err))
		return nil
	}
	o["status"] = "cancelled"
	b, err := json.Marshal(o)
	if err != nil {
		writeAPIError(w, storeError(err))
		return nil
	}
	resp.Object = b
	if err := s.responses.put(r.Context(), id, resp); err != nil {
		writeAPIError(w, storeError(err))
		return nil
	}
	_ = s.responses.clearCancel(r.Context(), id)
	return resp
}
