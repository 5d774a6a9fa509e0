package actors

import (
	"context"
	"errors"
	"fmt"

	"github.com/troupe/troupe/bus"
)

// answer is a Call's outcome for a caller in this process.
type answer[Resp any] struct {
	resp Resp
	err  error
}

// Ask is the in-process form of a request to one of the actor's Handle
// endpoints: req goes to the actor as a Go value, wrapped by wrap (the
// endpoint's wrap) in the same Call the endpoint would make from a bus
// request, and the answer comes back through a channel. Nothing is encoded
// and nothing crosses NATS. When the actor is idle, the calling goroutine
// runs its Receive (see Ref.SendInline), so that a request costs no
// goroutine wake-up; otherwise the call waits in the mailbox. The actor
// cannot tell the difference.
//
// The Call's context is ctx itself: its deadline, trace context and
// cancellation (an abort of the actor shows in the context Receive gets,
// not in the Call's). The errors are the bus path's: a
// Fail comes back as a *bus.Error with the actor's code, a full mailbox as
// bus.CodeOverloaded, a stopped actor as bus.CodeUnavailable, and the end
// of ctx as ctx's error (bus.CodeDeadline or bus.CodeCanceled).
//
// req is not copied: the caller must not change what it references until
// Ask returns, and when Ask returns early because ctx ended or the actor
// stopped, the actor may still be reading it.
func Ask[M any, Req, Resp bus.Message](ctx context.Context, ref *Ref[M], wrap func(*Call[Req, Resp]) M, req Req) (Resp, error) {
	var zero Resp
	p := ref.p
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("actor %s: %w", p.addr, err)
	}
	c := &Call[Req, Resp]{Req: req, ctx: ctx, local: make(chan answer[Resp], 1)}
	msg := wrap(c)
	if p.inline(msg) {
		// Handled on this goroutine; answered, unless the actor keeps the
		// call to answer later.
		select {
		case a := <-c.local:
			return a.resp, a.err
		default:
		}
	} else {
		err := p.mb.TrySend(msg)
		switch {
		case errors.Is(err, ErrMailboxFull):
			return zero, bus.Errorf(bus.CodeOverloaded, "actor %s: mailbox full (%d)", p.addr, p.mb.Cap())
		case err != nil:
			return zero, bus.Errorf(bus.CodeUnavailable, "actor %s: %w", p.addr, err)
		}
	}
	select {
	case a := <-c.local:
		return a.resp, a.err
	case <-ctx.Done():
		return zero, fmt.Errorf("actor %s: %w", p.addr, ctx.Err())
	case <-p.done:
		// It may have answered just before it stopped.
		select {
		case a := <-c.local:
			return a.resp, a.err
		default:
		}
		return zero, bus.Errorf(bus.CodeUnavailable, "actor %s stopped without answering", p.addr)
	}
}

// localError is what a bus caller would get for err: its code and
// description, with err kept as the cause for errors.Is and errors.As.
func localError(err error) error {
	var be *bus.Error
	if errors.As(err, &be) && be == err {
		return err
	}
	return bus.Errorf(bus.CodeOf(err), "%w", err)
}
