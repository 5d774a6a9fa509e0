package scheduler

import (
	"context"
	"slices"
	"sync"

	"github.com/troupe/troupe/bus"
)

// Local makes the client submit to svcs, the model's schedulers that run
// in this process, instead of the bus; with none, it goes back to the
// bus. Each call replaces the previous set, so a node calls it whenever
// its replicas change. A request then reaches a scheduler as a Go value
// and its frames come back through a queue in memory: nothing is encoded
// and nothing crosses NATS.
//
// The client cannot tell the paths apart. Among the services it takes the
// least loaded (waiting plus running requests; ties in turn) that is not
// draining, where the bus has the queue group choose; it gets the bus
// path's errors (CodeOverloaded for a full queue, CodeBadRequest for an
// unacceptable request, CodeUnavailable from a draining or closed
// service, which it submits again, a few times, as on the bus); the
// request's spans continue the trace of Generate's ctx; frames carry the
// same timings, log-probabilities and trace id; and when ctx ends or emit
// fails, the request is cancelled on its scheduler, which frees its KV
// blocks.
func (c *Client) Local(svcs ...*Service) {
	s := slices.Clone(svcs)
	c.local.Store(&s)
}

// generateLocal is Generate through one of the services given to Local.
func (c *Client) generateLocal(ctx context.Context, m SubmitMsg, emit func(FrameMsg) error) (FrameMsg, error) {
	q := &frameQueue{ready: make(chan struct{}, 1)}
	// The request's spans continue the caller's trace, not its deadline.
	trace := context.WithoutCancel(ctx)
	var sv *Service
	err := c.resubmit(ctx, func() error {
		if err := ctx.Err(); err != nil {
			return bus.Errorf(bus.CodeOf(err), "scheduler %s: %w", c.model, err)
		}
		if sv = c.pick(); sv == nil {
			return bus.Errorf(bus.CodeUnavailable, "no scheduler of %s in this process takes requests", c.model)
		}
		_, err := sv.take(trace, m, q.put)
		return err
	})
	if err != nil {
		return FrameMsg{}, err
	}
	cancel := func() { sv.s.Cancel(m.ID) }
	return relay(ctx, q.next, cancel, emit)
}

// pick returns the least loaded of the local services that take requests,
// or nil.
func (c *Client) pick() *Service {
	p := c.local.Load()
	if p == nil || len(*p) == 0 {
		return nil
	}
	svcs := *p
	start := int(c.turn.Add(1) % uint64(len(svcs)))
	var best *Service
	bestLoad := 0
	for i := range svcs {
		sv := svcs[(start+i)%len(svcs)]
		if sv.draining() {
			continue
		}
		st := sv.s.Stats()
		if load := st.Waiting + st.Running; best == nil || load < bestLoad {
			best, bestLoad = sv, load
		}
	}
	return best
}

// draining reports whether the service refuses new requests.
func (sv *Service) draining() bool {
	sv.closingMu.RLock()
	defer sv.closingMu.RUnlock()
	return sv.closing
}

// frameQueue carries one request's frames from its scheduler's goroutine,
// which must not block, to the goroutine in Generate. It holds at most the
// request's frames (max_tokens and a final one); those that arrive after
// Generate returned are dropped with the queue.
type frameQueue struct {
	mu     sync.Mutex
	frames []FrameMsg // guarded by mu; frames[head:] are due
	head   int
	ready  chan struct{} // a frame was put since next last looked
}

func (q *frameQueue) put(f FrameMsg) {
	q.mu.Lock()
	q.frames = append(q.frames, f)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// next returns the oldest frame not yet returned, waiting for one until
// ctx ends.
func (q *frameQueue) next(ctx context.Context) (FrameMsg, error) {
	for {
		q.mu.Lock()
		if q.head < len(q.frames) {
			f := q.frames[q.head]
			q.frames[q.head] = FrameMsg{}
			q.head++
			if q.head == len(q.frames) {
				q.frames, q.head = q.frames[:0], 0
			}
			q.mu.Unlock()
			return f, nil
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return FrameMsg{}, ctx.Err()
		case <-q.ready:
		}
	}
}
