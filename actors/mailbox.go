package actors

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// Mailbox errors.
var (
	// ErrMailboxFull is returned by TrySend when the mailbox is at capacity.
	ErrMailboxFull = errors.New("mailbox full")
	// ErrStopped is returned when sending to an actor that is stopping or
	// stopped.
	ErrStopped = errors.New("actor stopped")
)

// Mailbox is a bounded FIFO queue of messages for one receiver. Send blocks
// while the mailbox is full, until there is room, ctx ends or the mailbox
// closes; TrySend fails at once with ErrMailboxFull instead. Messages are
// received in the order their Send calls returned nil. A message accepted
// (nil error) is always received unless the receiver aborts its drain.
type Mailbox[M any] struct {
	ch chan M

	closeOnce sync.Once
	closed    chan struct{} // closed by Close: no more sends
	inflight  atomic.Int64  // senders between the closed check and their send
	puts      atomic.Uint64 // messages queued, or being queued
}

// NewMailbox returns a mailbox that holds up to capacity messages
// (capacity < 1 means 1).
func NewMailbox[M any](capacity int) *Mailbox[M] {
	return &Mailbox[M]{ch: make(chan M, max(capacity, 1)), closed: make(chan struct{})}
}

// Send queues msg, blocking while the mailbox is full.
func (b *Mailbox[M]) Send(ctx context.Context, msg M) error {
	b.inflight.Add(1)
	defer b.inflight.Add(-1)
	select {
	case <-b.closed:
		return ErrStopped
	default:
	}
	// Counted before it is in the channel, so that an inline run (see
	// process.inline) never overtakes it.
	b.puts.Add(1)
	select {
	case b.ch <- msg:
		return nil
	default:
	}
	select {
	case b.ch <- msg:
		return nil
	case <-b.closed:
		b.puts.Add(^uint64(0))
		return ErrStopped
	case <-ctx.Done():
		b.puts.Add(^uint64(0))
		return fmt.Errorf("mailbox send: %w", ctx.Err())
	}
}

// TrySend queues msg if there is room and fails with ErrMailboxFull if not.
func (b *Mailbox[M]) TrySend(msg M) error {
	b.inflight.Add(1)
	defer b.inflight.Add(-1)
	select {
	case <-b.closed:
		return ErrStopped
	default:
	}
	b.puts.Add(1)
	select {
	case b.ch <- msg:
		return nil
	default:
		b.puts.Add(^uint64(0))
		return ErrMailboxFull
	}
}

func (b *Mailbox[M]) isClosed() bool {
	select {
	case <-b.closed:
		return true
	default:
		return false
	}
}

// Len is the number of queued messages: the depth metric.
func (b *Mailbox[M]) Len() int { return len(b.ch) }

// Cap is the capacity.
func (b *Mailbox[M]) Cap() int { return cap(b.ch) }

// Close makes every later Send and TrySend fail with ErrStopped and wakes
// blocked senders. Queued messages stay receivable.
func (b *Mailbox[M]) Close() { b.closeOnce.Do(func() { close(b.closed) }) }

// Receive returns the next message, blocking until one arrives or ctx ends.
func (b *Mailbox[M]) Receive(ctx context.Context) (M, error) {
	select {
	case m := <-b.ch:
		return m, nil
	case <-ctx.Done():
		var zero M
		return zero, ctx.Err()
	}
}

// next returns the next message for an actor's loop: ok is false once the
// mailbox is closed and drained, or when abort ends.
func (b *Mailbox[M]) next(abort <-chan struct{}) (m M, ok bool) {
	select {
	case m = <-b.ch:
		return m, true
	case <-abort:
		return m, false
	case <-b.closed:
	}
	// Closed: hand out what is queued, including messages from senders
	// that passed the closed check before Close.
	for {
		select {
		case m = <-b.ch:
			return m, true
		case <-abort:
			return m, false
		default:
		}
		if b.inflight.Load() == 0 && len(b.ch) == 0 {
			return m, false
		}
		runtime.Gosched()
	}
}
