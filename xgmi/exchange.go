package xgmi

import (
	"context"
	"fmt"
	"sync"
)

// Exchange gives the ranks of a group small byte strings from each other:
// it is how ranks that live in separate processes find each other's
// memory (NewIPCFabric). The actors that own the devices implement it
// over the bus (bus.Exchange); xgmi knows nothing of the bus.
// LocalExchanges is the in-memory implementation, for ranks that are
// goroutines of one process.
type Exchange interface {
	// Rank is this rank's index, from 0.
	Rank() int
	// Ranks is the number of ranks.
	Ranks() int
	// AllGather gives mine to every rank and returns every rank's bytes,
	// in rank order (this rank's own at index Rank). Every rank calls it
	// the same number of times, one call at a time; a call fails when a
	// rank does not take part before ctx ends.
	AllGather(ctx context.Context, mine []byte) ([][]byte, error)
}

// LocalExchanges returns the n ranks of an in-memory exchange, for ranks
// that are goroutines of one process. It starts no goroutines.
func LocalExchanges(n int) ([]Exchange, error) {
	if n < 1 {
		return nil, fmt.Errorf("xgmi: exchange of %d ranks", n)
	}
	hub := &localHub{ranks: n, rounds: map[uint64]*localRound{}}
	out := make([]Exchange, n)
	for r := range n {
		out[r] = &localExchange{hub: hub, rank: r}
	}
	return out, nil
}

type localHub struct {
	ranks int

	mu     sync.Mutex
	rounds map[uint64]*localRound // rounds some rank is in
}

type localRound struct {
	parts [][]byte
	in    int           // ranks that have arrived
	out   int           // ranks that have returned
	full  chan struct{} // closed when every rank has arrived
}

type localExchange struct {
	hub   *localHub
	rank  int
	round uint64 // calls so far; only the rank's own goroutine touches it
}

func (e *localExchange) Rank() int  { return e.rank }
func (e *localExchange) Ranks() int { return e.hub.ranks }

func (e *localExchange) AllGather(ctx context.Context, mine []byte) ([][]byte, error) {
	h := e.hub
	e.round++
	h.mu.Lock()
	rd := h.rounds[e.round]
	if rd == nil {
		rd = &localRound{parts: make([][]byte, h.ranks), full: make(chan struct{})}
		h.rounds[e.round] = rd
	}
	rd.parts[e.rank] = append([]byte{}, mine...)
	if rd.in++; rd.in == h.ranks {
		close(rd.full)
	}
	h.mu.Unlock()
	var err error
	select {
	case <-rd.full:
	case <-ctx.Done():
		select {
		case <-rd.full: // arrived together with the end
		default:
			err = ctx.Err()
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if rd.out++; rd.out == h.ranks {
		delete(h.rounds, e.round)
	}
	if err != nil {
		var missing []int
		for q, p := range rd.parts {
			if p == nil {
				missing = append(missing, q)
			}
		}
		return nil, fmt.Errorf("xgmi: exchange: rank %d, round %d: ranks %v did not arrive: %w", e.rank, e.round, missing, err)
	}
	out := make([][]byte, h.ranks)
	for q, p := range rd.parts {
		out[q] = append([]byte{}, p...)
	}
	return out, nil
}
