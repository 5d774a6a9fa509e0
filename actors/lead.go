package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/troupe/troupe/bus"
)

// Lead campaigns for the registry key of e (e.Kind/e.ID) against every other
// node that campaigns for it, and runs lead while it holds the key: one
// holder at a time in the whole cluster. The key is an ordinary entry, so
// readers of the registry see who holds it.
//
// The holder renews the entry four times per TTL. lead's context ends when
// the key may be lost: a quarter of a TTL before the entry would expire
// since the last renewal that succeeded, so that it has stopped before any
// other node can take the key, or at once when another node holds it. When
// lead returns while the key is held, the key is given up, so that another
// node can try. Lead campaigns again after each loss, until ctx ends; it then
// waits for lead to return, deletes the key if it still holds it, and
// returns.
func (r *Registry) Lead(ctx context.Context, e Entry, lead func(ctx context.Context)) {
	every := r.ttl / 4
	for {
		if rev, err := r.acquire(ctx, e); err == nil {
			r.hold(ctx, e, rev, lead)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// acquire writes e's entry if no live one exists, and returns its revision.
func (r *Registry) acquire(ctx context.Context, e Entry) (uint64, error) {
	data, err := bus.Encode(e)
	if err != nil {
		return 0, err
	}
	actx, cancel := context.WithTimeout(ctx, r.ttl/4)
	defer cancel()
	return r.kv.Create(actx, registryKey(e.Kind, e.ID), data)
}

// hold runs lead while it renews the entry at revision rev, and gives the
// key up when lead returns or ctx ends.
func (r *Registry) hold(ctx context.Context, e Entry, rev uint64, lead func(ctx context.Context)) {
	key := registryKey(e.Kind, e.ID)
	data, err := bus.Encode(e)
	if err != nil {
		return
	}
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		defer stop()
		lead(lctx)
	})
	every := r.ttl / 4
	renewed := time.Now()
	t := time.NewTicker(every)
	held := true
	for held && lctx.Err() == nil {
		select {
		case <-lctx.Done():
		case <-t.C:
			// Past giveUp the entry may expire before a renewal lands.
			giveUp := renewed.Add(r.ttl - every)
			dl := time.Now().Add(every)
			if giveUp.Before(dl) {
				dl = giveUp
			}
			rctx, cancel := context.WithDeadline(lctx, dl)
			next, err := r.kv.Update(rctx, key, data, rev)
			cancel()
			switch {
			case err == nil:
				rev, renewed = next, time.Now()
			case isWrongRevision(err):
				held = false // another node holds it: the entry expired
			case !time.Now().Before(giveUp):
				held = false
			}
		}
	}
	t.Stop()
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
