package bus

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func newExchange(t *testing.T, nc *nats.Conn, subject string, rank, ranks int) *Exchange {
	t.Helper()
	e, err := NewExchange(context.Background(), nc, ExchangeConfig{Subject: subject, Rank: rank, Ranks: ranks})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// part is what rank r contributes to round k.
func part(r, k int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("r%d/k%d;", r, k)), r+1)
}

// TestExchangeAllGather: N ranks, each a goroutine with its own
// connection, run several rounds; every rank gets every part in rank
// order. The ranks other than 0 start first, so they ask before rank 0
// answers the subject and must ask again.
func TestExchangeAllGather(t *testing.T) {
	n := startNode(t, DefaultConfig())
	subs, _ := NewSubjects("test")
	subject := subs.Exchange("replica-0/tp")
	for _, ranks := range []int{1, 2, 4, 8} {
		t.Run(fmt.Sprint(ranks), func(t *testing.T) {
			const rounds = 5
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			errs := make([]error, ranks)
			var wg sync.WaitGroup
			run := func(e *Exchange) {
				defer wg.Done()
				r := e.Rank()
				for k := range rounds {
					got, err := e.AllGather(ctx, part(r, k))
					if err != nil {
						errs[r] = err
						return
					}
					if len(got) != ranks {
						errs[r] = fmt.Errorf("round %d: %d parts, want %d", k, len(got), ranks)
						return
					}
					for q := range ranks {
						if !bytes.Equal(got[q], part(q, k)) {
							errs[r] = fmt.Errorf("round %d: part %d is %q, want %q", k, q, got[q], part(q, k))
							return
						}
					}
				}
			}
			for r := ranks - 1; r >= 0; r-- {
				e := newExchange(t, connect(t, n), subject, r, ranks)
				wg.Add(1)
				go run(e)
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestExchangeMissingRank: a rank that never comes makes rank 0 give up
// at its deadline, naming the rank, and the ranks that came get the same
// answer instead of waiting out their own deadlines.
func TestExchangeMissingRank(t *testing.T) {
	n := startNode(t, DefaultConfig())
	subject := "troupe.test.exchange.missing"
	e0 := newExchange(t, connect(t, n), subject, 0, 3)
	e1 := newExchange(t, connect(t, n), subject, 1, 3)
	var err1 error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err1 = e1.AllGather(ctx, []byte("one"))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err0 := e0.AllGather(ctx, []byte("zero"))
	wg.Wait()
	if err0 == nil || !strings.Contains(err0.Error(), "ranks [2] did not arrive") {
		t.Errorf("rank 0: %v, want ranks [2] did not arrive", err0)
	}
	if CodeOf(err1) != CodeDeadline || !strings.Contains(err1.Error(), "ranks [2] did not arrive") {
		t.Errorf("rank 1: %v (code %s), want %s naming rank 2", err1, CodeOf(err1), CodeDeadline)
	}
}

// TestExchangeNoRankZero: without rank 0 a rank asks until its deadline
// and then says rank 0 is not there.
func TestExchangeNoRankZero(t *testing.T) {
	n := startNode(t, DefaultConfig())
	e1 := newExchange(t, connect(t, n), "troupe.test.exchange.alone", 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := e1.AllGather(ctx, []byte("x"))
	if err == nil || !strings.Contains(err.Error(), "rank 0 is not there") {
		t.Errorf("AllGather: %v, want rank 0 is not there", err)
	}
}

// TestExchangeRejects: rank 0 refuses a rank that counts other ranks, and
// a second process claiming a rank already in the round.
func TestExchangeRejects(t *testing.T) {
	n := startNode(t, DefaultConfig())
	subject := "troupe.test.exchange.rejects"
	e0 := newExchange(t, connect(t, n), subject, 0, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	wrong := newExchange(t, connect(t, n), subject, 1, 4)
	if _, err := wrong.AllGather(ctx, nil); CodeOf(err) != CodeBadRequest || !strings.Contains(err.Error(), "counts 4 ranks") {
		t.Errorf("rank of 4 ranks: %v, want %s", err, CodeBadRequest)
	}

	// Two ranks 1 join round 1, which rank 0 holds while it waits for
	// rank 2: the second to arrive is refused at once, the first is held
	// until rank 0 gives up.
	a := newExchange(t, connect(t, n), subject, 1, 3)
	b := newExchange(t, connect(t, n), subject, 1, 3)
	g0ctx, g0cancel := context.WithCancel(ctx)
	defer g0cancel()
	var err0 error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err0 = e0.AllGather(g0ctx, []byte("zero"))
	}()
	res := make(chan error, 2)
	for _, e := range []*Exchange{a, b} {
		go func() {
			_, err := e.AllGather(ctx, []byte("x"))
			res <- err
		}()
	}
	if dup := <-res; CodeOf(dup) != CodeConflict || !strings.Contains(dup.Error(), "joined the round twice") {
		t.Errorf("second rank 1: %v, want %s", dup, CodeConflict)
	}
	g0cancel()
	wg.Wait()
	if held := <-res; CodeOf(held) != CodeDeadline {
		t.Errorf("first rank 1: %v, want %s from rank 0", held, CodeDeadline)
	}
	if err0 == nil || !strings.Contains(err0.Error(), "ranks [2] did not arrive") {
		t.Errorf("rank 0: %v, want ranks [2] did not arrive", err0)
	}
}

// TestExchangeClose: closing rank 0 answers the ranks it holds.
func TestExchangeClose(t *testing.T) {
	n := startNode(t, DefaultConfig())
	subject := "troupe.test.exchange.close"
	e0 := newExchange(t, connect(t, n), subject, 0, 2)
	e1 := newExchange(t, connect(t, n), subject, 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Round 1 completes; round 2 of rank 1 waits for rank 0, which closes.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := e0.AllGather(ctx, nil); err != nil {
			t.Errorf("rank 0, round 1: %v", err)
		}
	}()
	if _, err := e1.AllGather(ctx, nil); err != nil {
		t.Fatalf("rank 1, round 1: %v", err)
	}
	wg.Wait()
	done := make(chan error, 1)
	go func() {
		_, err := e1.AllGather(ctx, nil)
		done <- err
	}()
	// Wait until rank 0 holds rank 1's request of round 2.
	for {
		e0.mu.Lock()
		held := e0.rounds[2] != nil
		e0.mu.Unlock()
		if held {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("rank 1, round 2 returned before rank 0 closed: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	if err := e0.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; CodeOf(err) != CodeUnavailable {
		t.Errorf("rank 1, round 2: %v, want %s", err, CodeUnavailable)
	}
	if _, err := e0.AllGather(ctx, nil); err == nil {
		t.Error("AllGather on a closed exchange succeeded")
	}
}

func TestExchangeConfig(t *testing.T) {
	for _, c := range []ExchangeConfig{
		{Rank: 0, Ranks: 2},
		{Subject: "s", Rank: 0, Ranks: 0},
		{Subject: "s", Rank: 2, Ranks: 2},
		{Subject: "s", Rank: -1, Ranks: 2},
		{Subject: "s", Rank: 0, Ranks: 2, Timeout: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
}
