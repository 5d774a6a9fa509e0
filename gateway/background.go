package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
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
// generation before cancelling it (it is then kept "failed"). Streamed
// ("stream": true), its events go to an eventLog that the request, and
// later GETs with stream=true, follow as it grows; the log is also kept in
// the store, for the other gateways to serve.

// cancelPoll is how often a background response looks for a cancel
// marker left by another gateway; cancelWait is how long a cancel waits
// for the gateway running the response to keep it cancelled, after which
// the response is taken for lost with its gateway and kept cancelled by
// the canceller.
const (
	cancelPoll = 200 * time.Millisecond
	cancelWait = 10 * time.Second
)

// beatEvery is how often the gateway running a background response keeps
// it again, a heartbeat; a running response not kept for lostAfter beats
// is taken for lost with its gateway and kept failed by the next gateway
// that reads it.
const (
	beatEvery = 5 * time.Second
	lostAfter = 6
)

// bgRun is a background response running on this gateway.
type bgRun struct {
	cancel    context.CancelFunc
	cancelled atomic.Bool   // asked to stop (not shut down)
	done      chan struct{} // closed once its last state is kept
	log       *eventLog     // a streamed response's events; nil otherwise
	keeper    *eventKeeper  // keeps log for other gateways
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
	case s.isClosing():
		writeAPIError(w, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "shutting_down", Message: "the server is shutting down"})
		return
	}
	n := rs.j.choices()
	if aerr := s.lim.tryAcquire(rs.tenant, n, s.cfg.RetryAfter); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	ctx, cancel := context.WithCancel(s.base)
	run := &bgRun{cancel: cancel, done: make(chan struct{})}
	rs.bg, rs.w, rs.store = true, nil, true
	if rs.j.stream {
		run.log = newEventLog()
		run.keeper = &eventKeeper{r: s.responses, id: rs.id, tenant: rs.tenant, chunk: s.bgChunk}
		rs.out = &sse{log: run.log}
	}
	queued := rs.object("queued", nil, nil)
	queued["store"] = true
	if err := rs.put(queued, "", nil); err != nil {
		cancel()
		s.lim.release(rs.tenant, n)
		writeAPIError(w, storeError(err))
		return
	}
	if run.log != nil {
		// Other gateways stream it again from this record.
		if err := s.responses.putEvents(r.Context(), rs.id, rs.tenant, eventRecord{}); err != nil {
			cancel()
			s.lim.release(rs.tenant, n)
			writeAPIError(w, storeError(err))
			return
		}
	}
	s.bg.add(rs.id, run)
	started := s.start(true, func() {
		defer close(run.done)
		defer s.bg.remove(rs.id)
		defer s.lim.release(rs.tenant, n)
		defer cancel()
		s.runBackground(ctx, run, rs, received)
	})
	if !started {
		s.bg.remove(rs.id)
		cancel()
		s.lim.release(rs.tenant, n)
		rs.whole("failed", nil, nil, map[string]string{"code": "shutting_down", "message": "the server shut down before the response started"})
		writeAPIError(w, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "shutting_down", Message: "the server is shutting down"})
		return
	}
	if run.log != nil {
		follow(w, r, run.log, -1)
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
	_ = rs.start()                // a stream's first events
	// Cancel markers left by other gateways; a stream's events kept for
	// them, a second apart.
	watched := make(chan struct{})
	wctx, stopWatch := context.WithCancel(ctx)
	go func() {
		defer close(watched)
		t := time.NewTicker(cancelPoll)
		defer t.Stop()
		beat := time.NewTicker(s.bgBeat)
		defer beat.Stop()
		tick := 0
		for {
			select {
			case <-wctx.Done():
				return
			case <-beat.C:
				_ = rs.put(progress, "", nil)
			case <-t.C:
				tick++
				if ok, _ := s.responses.cancelRequested(wctx, rs.id); ok {
					run.cancelled.Store(true)
					run.cancel()
					return
				}
				if run.log != nil && tick%eventsEvery == 0 {
					_ = run.keeper.keep(wctx, run.log)
				}
			}
		}
	}()
	res, err := s.generate(ctx, rs.j.request(rs.id, 0), received, rs.j.newThinkStream(), rs.token)
	stopWatch()
	<-watched
	switch {
	case err == nil && res.finish.Reason != FinishCancelled:
		rs.finish(res)
	case run.cancelled.Load():
		rs.stop("cancelled", nil)
	case s.base.Err() != nil:
		rs.stop("failed", map[string]string{"code": "server_shutdown", "message": "the server shut down before the response was answered"})
	default:
		if err == nil {
			err = errors.New("the generation was cancelled")
		}
		ae := s.backendError(err)
		rs.stop("failed", map[string]string{"code": ae.Code, "message": ae.Message})
	}
	if run.log != nil {
		run.log.end()
		_ = run.keeper.keep(rs.ctx, run.log)
		if rs.held != nil {
			// Unkept, the response reads as lost after lostAfter beats.
			_ = rs.held()
		}
	}
	_ = s.responses.clearCancel(rs.ctx, rs.id)
}

// stop ends a background response as status ("failed" or "cancelled"),
// with failure's error, as far as it came: kept, and on a stream its last
// event (response.failed, or response.cancelled, which the API has not
// named).
func (rs *responseRun) stop(status string, failure any) {
	if rs.out == nil {
		rs.whole(status, nil, nil, failure)
		return
	}
	var calls []ToolCall
	for i, it := range rs.items {
		switch it := it.(type) {
		case responseMessage:
			it.Status, it.Content = "incomplete", []responsePart{textPart(rs.text.String(), rs.lps)}
			rs.items[i] = it
		case responseReasoning:
			rs.items[i] = rs.reasoningItem(it.ID, "incomplete", rs.reason.String())
		case responseCall:
			it.Status = "incomplete"
			rs.items[i] = it
			calls = append(calls, ToolCall{ID: it.CallID, Name: it.Name, Arguments: it.Arguments})
		}
	}
	o := rs.object(status, nil, nil)
	o["error"] = failure
	_ = rs.event("response."+status, map[string]any{"response": rs.keep(o, rs.text.String(), calls)})
}

// eventsEvery is how many cancelPolls apart a streamed background
// response's events are kept for other gateways.
const eventsEvery = 5

// streamAsked reports whether a GET of a response asks for its events:
// stream=true in the query, as the API documents it, or a JSON body
// {"stream": true}, as the official Go client sends it.
func streamAsked(r *http.Request) bool {
	if v := r.URL.Query().Get("stream"); v != "" {
		return v == "true"
	}
	if r.Body == nil || r.ContentLength == 0 {
		return false
	}
	var body struct {
		Stream bool `json:"stream"`
	}
	_ = json.NewDecoder(io.LimitReader(r.Body, 4<<10)).Decode(&body)
	return body.Stream
}

// handleStreamResponse streams a background response's events again (GET
// /v1/responses/{id}?stream=true), those after starting_after: from the
// gateway running it as they come, or from the store, where the gateway
// running it keeps them a second apart and whole at the end.
func (s *Server) handleStreamResponse(w http.ResponseWriter, r *http.Request) {
	after := -1
	if v := r.URL.Query().Get("starting_after"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeAPIError(w, invalidParam("starting_after", "starting_after must be a sequence number, 0 or more"))
			return
		}
		after = n
	}
	resp := s.keptResponse(w, r)
	if resp == nil {
		return
	}
	id, tenant := r.PathValue("id"), tenantOf(r.Context())
	if run := s.bg.get(id); run != nil && run.log != nil {
		follow(w, r, run.log, after)
		return
	}
	// A streamed background response's record is kept before it is
	// answered queued, and ended after its last state is kept; a record
	// that does not end once the response has (its gateway gone) ends the
	// stream after the wait.
	out := &sse{w: w}
	var endBy time.Time
	for {
		rec, err := s.responses.events(r.Context(), id, tenant)
		switch {
		case err != nil:
			if !out.isStarted() {
				writeAPIError(w, storeError(err))
			}
			return
		case rec == nil && out.isStarted():
			return // dropped for newer values
		case rec == nil:
			writeAPIError(w, invalidParam("stream", "response %s was not streamed in the background, or its events are not kept: fetch it whole", truncate(id, 80)))
			return
		}
		// The chunks that hold events after the last sent, then the rest.
		base := 0
		for i, n := range rec.Chunks {
			if after+1 < base+n {
				chunk, err := s.responses.chunk(r.Context(), id, tenant, i, n)
				if err != nil {
					if !out.isStarted() {
						writeAPIError(w, storeError(err))
					}
					return
				}
				for ; after+1 < base+n; after++ {
					if out.framed(chunk[after+1-base]) != nil {
						return
					}
				}
			}
			base += n
		}
		for ; after+1 < base+len(rec.Events); after++ {
			if out.framed(rec.Events[after+1-base]) != nil {
				return
			}
		}
		if rec.Ended {
			if !out.isStarted() {
				_ = out.framed(nil)
			}
			return
		}
		if !statusOf(resp.Object).running() {
			if endBy.IsZero() {
				endBy = time.Now().Add(s.bgWait)
			} else if time.Now().After(endBy) {
				_ = out.framed(nil)
				return
			}
		}
		if !pause(r.Context(), cancelPoll) {
			return
		}
		if resp, err = s.responses.get(r.Context(), id, tenant); err != nil || resp == nil {
			_ = out.framed(nil)
			return
		}
	}
}

// settle returns the kept response resp, or, where it is a background
// response still running by the store but no gateway has kept it for
// lostAfter beats (its gateway gone), the response kept failed
// ("gateway_lost"). Where the store fails it has answered and returns
// nil.
func (s *Server) settle(w http.ResponseWriter, r *http.Request, resp *storedResponse) *storedResponse {
	if resp == nil || resp.Beat == 0 || !statusOf(resp.Object).running() || s.bg.get(r.PathValue("id")) != nil ||
		time.Since(time.UnixMilli(resp.Beat)) < lostAfter*s.bgBeat {
		return resp
	}
	return s.keepEnded(w, r, resp, "failed", map[string]string{"code": "gateway_lost", "message": "the gateway running the response stopped keeping it"})
}

// keepEnded keeps resp, a background response whose gateway is gone, as
// ended with status (and failure's error, where set), and returns it;
// where the store fails it has answered and returns nil.
func (s *Server) keepEnded(w http.ResponseWriter, r *http.Request, resp *storedResponse, status string, failure any) *storedResponse {
	var o map[string]any
	if err := json.Unmarshal(resp.Object, &o); err != nil {
		writeAPIError(w, storeError(err))
		return nil
	}
	o["status"] = status
	if failure != nil {
		o["error"] = failure
	}
	b, err := json.Marshal(o)
	if err != nil {
		writeAPIError(w, storeError(err))
		return nil
	}
	resp.Object, resp.Beat = b, 0
	if err := s.responses.put(r.Context(), r.PathValue("id"), resp); err != nil {
		writeAPIError(w, storeError(err))
		return nil
	}
	return resp
}

// pause waits d, and reports false where ctx ends first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
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
	if resp = s.settle(w, r, resp); resp == nil || !statusOf(resp.Object).running() {
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
	for deadline := time.Now().Add(s.bgWait); time.Now().Before(deadline); {
		if !pause(r.Context(), cancelPoll/4) {
			return nil
		}
		if resp = s.keptResponse(w, r); resp == nil || !statusOf(resp.Object).running() {
			return resp
		}
	}
	// No gateway answered the marker: the one running the response is
	// gone. The response is kept cancelled as it was last kept.
	if resp = s.keepEnded(w, r, resp, "cancelled", nil); resp != nil {
		_ = s.responses.clearCancel(r.Context(), id)
	}
	return resp
}

// eventLog holds a streamed background response's events, framed for
// server-sent events, in order: event i has sequence_number i. Readers
// follow it as it grows.
type eventLog struct {
	mu     sync.Mutex
	events [][]byte
	ended  bool
	grew   chan struct{} // closed, and replaced, as the log grows or ends
}

func newEventLog() *eventLog { return &eventLog{grew: make(chan struct{})} }

func (l *eventLog) append(b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, b)
	close(l.grew)
	l.grew = make(chan struct{})
}

// end marks the log whole.
func (l *eventLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	close(l.grew)
	l.grew = make(chan struct{})
}

// since returns the events after index after, whether the log has ended,
// and a channel closed when it next grows.
func (l *eventLog) since(after int) ([][]byte, bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events[min(max(after+1, 0), len(l.events)):], l.ended, l.grew
}

// record is the log as kept in the store, for gateways other than the
// one running the response.
func (l *eventLog) record() eventRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return eventRecord{Events: slices.Clip(l.events), Ended: l.ended}
}

// eventRecord is a streamed background response's events as kept under
// eventsKey(id): how many events each chunk kept before them holds (under
// chunkKey(id, i)), then the events after those chunks. A chunk holds
// its events alone.
type eventRecord struct {
	Chunks []int    `json:"chunks,omitempty"`
	Events [][]byte `json:"events"`
	Ended  bool     `json:"ended"`
	// Parts, in a chunk of one event larger than a chunk's bytes, is how
	// many values that event is split over: this one holds its first
	// part, partKey(id, i, j) the others.
	Parts int `json:"parts,omitempty"`
}

// eventChunk is about how many bytes of events a chunk of a kept stream
// holds: below the bus's 1 MiB a value once JSON's base64 has widened them.
const eventChunk = 512 << 10

// eventKeeper keeps a streamed background response's events for other
// gateways as they come. Whole chunks of about chunk bytes are written
// once; only the record of the events after them is written again as the
// log grows, so a long stream is neither bounded by a value's size nor
// written over and over. An event larger than a chunk (a long answer's
// last events, which carry its whole text) is a chunk of its own, split
// over values of chunk bytes.
type eventKeeper struct {
	r          keptResponses
	id, tenant string
	chunk      int   // eventChunk; smaller in tests
	chunks     []int // events in each chunk kept
	kept       int   // events the store holds, chunks and record
	ended      bool  // whether the store holds the log's end
}

// keep writes what the store lacks of log.
func (k *eventKeeper) keep(ctx context.Context, log *eventLog) error {
	rec := log.record()
	if len(rec.Events) == k.kept && rec.Ended == k.ended {
		return nil
	}
	sealed := 0 // events in the chunks kept
	for _, n := range k.chunks {
		sealed += n
	}
	for {
		// The events that fill a chunk, sealed where more follow them.
		tail := rec.Events[sealed:]
		n, size := 0, 0
		for n < len(tail) && (n == 0 || size+len(tail[n]) <= k.chunk) {
			size += len(tail[n])
			n++
		}
		if n == len(tail) && size <= k.chunk {
			break
		}
		c := eventRecord{Events: tail[:n:n]}
		if size > k.chunk {
			parts := splitBytes(tail[0], k.chunk)
			for j := 1; j < len(parts); j++ {
				p := eventRecord{Events: parts[j : j+1]}
				if err := k.r.put(ctx, partKey(k.id, len(k.chunks), j), &storedResponse{Tenant: k.tenant, Events: &p}); err != nil {
					return err
				}
			}
			c = eventRecord{Events: parts[:1], Parts: len(parts)}
		}
		if err := k.r.put(ctx, chunkKey(k.id, len(k.chunks)), &storedResponse{Tenant: k.tenant, Events: &c}); err != nil {
			return err
		}
		k.chunks = append(k.chunks, n)
		sealed += n
	}
	head := eventRecord{Chunks: slices.Clip(k.chunks), Events: rec.Events[sealed:], Ended: rec.Ended}
	if err := k.r.putEvents(ctx, k.id, k.tenant, head); err != nil {
		return err
	}
	k.kept, k.ended = len(rec.Events), rec.Ended
	return nil
}

// splitBytes cuts b into pieces of n bytes, the last shorter.
func splitBytes(b []byte, n int) [][]byte {
	var parts [][]byte
	for len(b) > n {
		parts, b = append(parts, b[:n:n]), b[n:]
	}
	return append(parts, b)
}

// follow writes to w the events of log after index after, as they come,
// until the log ends or the client leaves.
func follow(w http.ResponseWriter, r *http.Request, log *eventLog, after int) {
	out := &sse{w: w}
	for {
		events, ended, grew := log.since(after)
		for _, e := range events {
			if out.framed(e) != nil {
				return
			}
			after++
		}
		if ended {
			if !out.isStarted() {
				out.framed(nil)
			}
			return
		}
		select {
		case <-grew:
		case <-r.Context().Done():
			return
		}
	}
}
