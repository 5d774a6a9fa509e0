package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// errStopMatched is returned from emit when a stop string matched.
var errStopMatched = errors.New("stop string matched")

// tokenEvent is one token on its way to a client.
type tokenEvent struct {
	tok        Token
	text       string // text to send: the token's text after stop-string handling
	seq        int    // 1-based position in the completion
	queue      time.Duration
	sinceStart time.Duration // from the gateway receiving the request
	itl        time.Duration // since the previous token; 0 for the first
}

// genResult is how a generation ended, as the client sees it.
type genResult struct {
	finish    Finish
	tail      string // text held back for a possible stop string, released at the end
	reasoning int    // tokens of the completion in a thinking model's reasoning
}

// generate runs req on the backend, applying stop strings and recording metrics. out is
// called for each token in order; an error from it stops the generation and is
// returned. A generation cancelled through ctx ends with reason "cancelled" and no error.
// think, where the model thinks (job.newThinkStream), counts the tokens of
// its reasoning.
func (s *Server) generate(ctx context.Context, req GenerateRequest, received time.Time, think *thinkStream, out func(*tokenEvent) error) (res genResult, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := stopper{stops: req.Stop}
	var (
		seq     int
		prev    time.Time
		stopped bool
		outErr  error
	)
	emit := func(t Token) error {
		if stopped {
			return errStopMatched
		}
		if outErr != nil {
			return outErr
		}
		if t.EmittedAt.IsZero() {
			t.EmittedAt = time.Now()
		}
		if t.QueuedAt.IsZero() {
			t.QueuedAt = received
		}
		if t.StartedAt.IsZero() {
			t.StartedAt = t.QueuedAt
		}
		seq++
		ev := tokenEvent{tok: t, seq: seq, queue: t.StartedAt.Sub(t.QueuedAt), sinceStart: t.EmittedAt.Sub(received)}
		if seq == 1 {
			s.met.ttft.observe(ev.sinceStart.Seconds())
			s.met.queueWait.observe(ev.queue.Seconds())
		} else {
			ev.itl = t.EmittedAt.Sub(prev)
			s.met.itl.observe(ev.itl.Seconds())
		}
		prev = t.EmittedAt
		s.met.completionTokens.Add(1)
		think.countToken(t.Text)
		ev.text, stopped = st.push(t.Text)
		if err := out(&ev); err != nil {
			outErr = err
			cancel()
			return err
		}
		if stopped {
			cancel()
			return errStopMatched
		}
		return nil
	}
	fin, gerr := s.callBackend(ctx, req, emit)
	s.met.promptTokens.Add(uint64(len(req.Prompt)))
	res.finish = Finish{Reason: fin.Reason, PromptTokens: len(req.Prompt), CompletionTokens: seq, CachedTokens: min(fin.CachedTokens, len(req.Prompt))}
	res.reasoning = think.reasoningTokens()
	switch {
	case stopped:
		res.finish.Reason = FinishStop
		return res, nil
	case outErr != nil:
		res.finish.Reason = FinishCancelled
		return res, outErr
	case ctx.Err() != nil:
		res.finish.Reason = FinishCancelled
		return res, nil
	case gerr != nil:
		res.finish.Reason = FinishError
		return res, gerr
	}
	res.tail = st.flush()
	switch res.finish.Reason {
	case FinishStop, FinishLength:
	case FinishCancelled:
	case FinishError:
		return res, errors.New("backend reported an error")
	default:
		res.finish.Reason = FinishStop
		if seq >= req.MaxTokens {
			res.finish.Reason = FinishLength
		}
	}
	return res, nil
}

// callBackend calls Generate and turns a panic in it into an error.
func (s *Server) callBackend(ctx context.Context, req GenerateRequest, emit func(Token) error) (fin Finish, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("backend panic: %v", r)
		}
	}()
	return s.backend.Generate(ctx, req, emit)
}

// backendError maps a Backend error to what the client is told.
func (s *Server) backendError(err error) *apiError {
	var ae *apiError
	var oe *OverloadedError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &oe):
		retry := oe.RetryAfter
		if retry <= 0 {
			retry = s.cfg.RetryAfter
		}
		return tooManyRequests("backend_overloaded", "the model is overloaded: "+err.Error(), retry)
	case errors.Is(err, ErrOverloaded):
		return tooManyRequests("backend_overloaded", "the model is overloaded: "+err.Error(), s.cfg.RetryAfter)
	case errors.Is(err, ErrInvalidRequest):
		return badRequest("", "invalid_request", "%v", err)
	case errors.Is(err, context.Canceled) && s.base.Err() != nil:
		return &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "shutting_down", Message: "the server is shutting down"}
	}
	return &apiError{Status: http.StatusInternalServerError, Type: typeServer, Code: "generation_failed", Message: "generation failed: " + err.Error()}
}

// runAll runs f for 0..n-1 concurrently and waits; the first error cancels the others
// through cancel and is returned.
func runAll(n int, cancel context.CancelFunc, f func(i int) error) error {
	if n == 1 {
		return f(0)
	}
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for i := range n {
		wg.Go(func() {
			if err := f(i); err != nil {
				once.Do(func() {
					first = err
					cancel()
				})
			}
		})
	}
	wg.Wait()
	return first
}

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
