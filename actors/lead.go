package actors

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/troupe/troupe/bus"
)

// Lead campaigns for the registry key of entry's kind and id against every
// other node that campaigns for it, and runs lead while it holds the key:
// one holder at a time in the whole cluster. The key is an ordinary entry,
// so readers of the registry see who holds it; entry is called for each
// write, so that its State can follow what the holder leads.
//
// The holder renews the entry four times per TTL, and at once when lead
// calls its Lease's Write. lead's context ends when the key may be lost: a
// quarter of a TTL before the entry would expire since the last renewal
// that succeeded, so that it has stopped before any other node can take
// the key, or at once when another node holds it. A renewal whose answer
// never came may still have landed: the next one, meeting its revision,
// reads the entry back and goes on from it when it is that renewal's,
// rather than take it for another node's; so does a take whose answer
// never came. lead's Lease also holds
// the last entry a holder wrote, as this node read it while it stood by or,
// when it took a key given up before it first tried, as the bucket keeps
// it (zero if none): what to take over. When lead returns while the key is
// held, the key is given up, so that another node can try. Lead campaigns
// again after each loss, until ctx ends; it then waits for lead to return,
// deletes the key if it still holds it, and returns.
func (r *Registry) Lead(ctx context.Context, entry func() Entry, lead func(ctx context.Context, l *Lease)) {
	every := r.ttl / 4
	self := entry()
	key := registryKey(self.Kind, self.ID)
	var last Record
	var unsure []sentWrite // takes whose answers never came
	for {
		sent := time.Now()
		rev, data, err := r.acquire(ctx, entry())
		var found jetstream.KeyValueEntry // the entry the take met
		if errors.Is(err, jetstream.ErrKeyExists) {
			gctx, cancel := context.WithTimeout(ctx, every)
			if kve, err := r.kv.Get(gctx, key); err == nil {
				found = kve
			}
			cancel()
			if at, ok := own(found, 0, unsure); ok {
				rev, sent, err = found.Revision(), at, nil // this node's take landed
			}
		}
		switch {
		case err == nil:
			unsure = nil
			if last.Node == "" {
				// Not read while standing by (the holder gave the key up
				// before this node first tried): the bucket's history.
				last = r.before(ctx, self.Kind, self.ID, rev)
			}
			l := &Lease{Last: last, renew: make(chan chan error, 1), ended: make(chan struct{})}
			r.hold(ctx, entry, rev, sent, l, func(ctx context.Context) { lead(ctx, l) })
			last = Record{}
		case errors.Is(err, jetstream.ErrKeyExists):
			unsure = nil
			// Its own entry too: one this node wrote before it restarted.
			if found != nil {
				if rec, err := r.record(found); err == nil {
					last = rec
				}
			}
		case data != nil:
			// One sent a TTL ago has expired if it landed.
			unsure = slices.DeleteFunc(unsure, func(w sentWrite) bool { return time.Since(w.at) >= r.ttl })
			unsure = append(unsure, sentWrite{data, sent})
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// before returns the newest entry written under kind/id before revision
// rev that the bucket still keeps, or the zero Record.
func (r *Registry) before(ctx context.Context, kind, id string, rev uint64) Record {
	hctx, cancel := context.WithTimeout(ctx, r.ttl/4)
	defer cancel()
	hist, err := r.kv.History(hctx, registryKey(kind, id))
	if err != nil {
		return Record{}
	}
	for i := len(hist) - 1; i >= 0; i-- {
		if h := hist[i]; h.Revision() < rev && h.Operation() == jetstream.KeyValuePut {
			if rec, err := r.record(h); err == nil {
				return rec
			}
		}
	}
	return Record{}
}

// Lease is what Lead gives the node that holds a key.
type Lease struct {
	// Last is the last entry written under the key before this node took
	// it (its predecessor's, or its own from before a restart), as read
	// while it stood by or from the bucket's history: what to take over.
	// Zero if none.
	Last  Record
	renew chan chan error // a write at once, and where to say how it went
	ended chan struct{}   // closed when the holder writes no more
	lost  error           // why, when the key was lost; set before ended closes
}

// ErrLeaseEnded is what Write returns once the holder writes the key no
// more: it was lost, or given up.
var ErrLeaseEnded = errors.New("registry: the key is no longer held")

// Lost says why the key was lost once lead's context has ended: another
// node held it, or it was not renewed in time. It is nil while the key is
// held and when it was given up.
func (l *Lease) Lost() error {
	select {
	case <-l.ended:
		return l.lost
	default:
		return nil
	}
}

// endedErr is ErrLeaseEnded, with why the key was lost when it was.
func (l *Lease) endedErr() error {
	if l.lost != nil {
		return fmt.Errorf("%w: %w", ErrLeaseEnded, l.lost)
	}
	return ErrLeaseEnded
}

// Write writes the key's entry at once and returns when the write has
// landed, or why it did not: the key was lost (ErrLeaseEnded, or another
// node holding it), the registry did not answer in time, or ctx ended.
// Call it before acting on what the entry now says, so that a standby
// that takes over after a crash knows it.
func (l *Lease) Write(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case l.renew <- done:
	case <-l.ended:
		return l.endedErr()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-l.ended:
		select {
		case err := <-done: // answered as the holder stopped
			return err
		default:
			return l.endedErr()
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// acquire writes e's entry if no live one exists, and returns its revision
// and the entry as written (nil if it could not be encoded).
func (r *Registry) acquire(ctx context.Context, e Entry) (uint64, []byte, error) {
	data, err := bus.Encode(e)
	if err != nil {
		return 0, nil, err
	}
	actx, cancel := context.WithTimeout(ctx, r.ttl/4)
	defer cancel()
	rev, err := r.kv.Create(actx, registryKey(e.Kind, e.ID), data)
	return rev, data, err
}

// hold runs lead while it renews the entry at revision rev, written no
// earlier than renewed (at once when l asks, answering a Write), and gives
// the key up when lead returns or ctx ends. l.ended closes when it writes
// no more, before it waits for lead, which may be waiting on a Write.
func (r *Registry) hold(ctx context.Context, entry func() Entry, rev uint64, renewed time.Time, l *Lease, lead func(ctx context.Context)) {
	e := entry()
	key := registryKey(e.Kind, e.ID)
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		defer stop()
		lead(lctx)
	})
	every := r.ttl / 4
	t := time.NewTicker(every)
	held := true
	// Renewals sent since rev whose answers never came: one may have
	// landed, and the next renewal then meets its revision.
	var unsure []sentWrite
	for held && lctx.Err() == nil {
		var reply chan error
		select {
		case <-lctx.Done():
			continue
		case reply = <-l.renew:
		case <-t.C:
		}
		answer := func(err error) {
			if reply != nil {
				reply <- err
			}
		}
		if lctx.Err() != nil {
			answer(ErrLeaseEnded) // lead returned meanwhile
			continue
		}
		data, err := bus.Encode(entry())
		if err != nil {
			answer(fmt.Errorf("registry: %s: %w", key, err))
			stop() // given up below
			continue
		}
		// Past giveUp the entry may expire before a renewal lands.
		giveUp := renewed.Add(r.ttl - every)
		dl := time.Now().Add(every)
		if giveUp.Before(dl) {
			dl = giveUp
		}
		rctx, cancel := context.WithDeadline(lctx, dl)
		sent := time.Now()
		next, err := r.kv.Update(rctx, key, data, rev)
		if isWrongRevision(err) && len(unsure) > 0 {
			if found, gerr := r.kv.Get(rctx, key); gerr == nil {
				if at, ok := own(found, rev, unsure); ok {
					rev, renewed, unsure = found.Revision(), at, nil
					next, err = r.kv.Update(rctx, key, data, rev)
				}
			}
		}
		cancel()
		switch {
		case err == nil:
			rev, renewed, unsure = next, sent, nil
			answer(nil)
		case isWrongRevision(err):
			held = false // another node holds it: the entry expired
			l.lost = fmt.Errorf("%s: another node holds it", key)
			answer(fmt.Errorf("registry: %w: %w", l.lost, ErrLeaseEnded))
		case lctx.Err() != nil:
			answer(ErrLeaseEnded) // lead returned during the write
		default:
			unsure = append(unsure, sentWrite{data, sent})
			answer(fmt.Errorf("registry: %s: %w", key, err))
			if !time.Now().Before(giveUp) {
				held = false
				l.lost = fmt.Errorf("%s: not renewed for %v: %w", key, time.Since(renewed).Round(time.Millisecond), err)
			}
		}
	}
	t.Stop()
	close(l.ended)
	stop()
	wg.Wait()
	if held {
		// Given up: lead returned or ctx ended. Only this revision goes,
		// so a key another node took meanwhile stays.
		dctx, cancel := context.WithTimeout(context.Background(), every)
		defer cancel()
		_ = r.kv.Delete(dctx, key, jetstream.LastRevision(rev))
	}
}

// sentWrite is a take or renewal whose answer never came.
type sentWrite struct {
	data []byte
	at   time.Time
}

// own reports whether entry kve (nil if none was read), written past
// revision rev, is one of the unsure writes, and if so when that write was
// sent (the entry lives at least a TTL from then): this node's write,
// whose answer was lost, and not another node's.
func own(kve jetstream.KeyValueEntry, rev uint64, unsure []sentWrite) (time.Time, bool) {
	if kve == nil || kve.Revision() <= rev {
		return time.Time{}, false
	}
	for _, w := range unsure { // the earliest first: the entry lives at least this long
		if bytes.Equal(kve.Value(), w.data) {
			return w.at, true
		}
	}
	return time.Time{}, false
}

// isWrongRevision reports whether err says the key changed under its
// writer: another node wrote it.
func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		errors.Is(err, jetstream.ErrKeyExists)
}

// Holder returns the node that holds kind/id's key taken through Lead, or
// ErrNotRegistered when no live node does.
func (r *Registry) Holder(ctx context.Context, kind, id string) (string, error) {
	rec, err := r.Get(ctx, kind, id)
	if err != nil {
		return "", err
	}
	if !rec.Alive {
		return "", fmt.Errorf("registry: %s/%s: %w", kind, id, ErrNotRegistered)
	}
	return rec.Node, nil
}
