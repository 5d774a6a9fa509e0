package xgmi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestLocalExchange: every rank gets every rank's bytes in rank order,
// round after round.
func TestLocalExchange(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, n := range []int{1, 2, 5} {
		exs, err := LocalExchanges(n)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r, ex := range exs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if ex.Rank() != r || ex.Ranks() != n {
					errs[r] = fmt.Errorf("rank %d of %d", ex.Rank(), ex.Ranks())
					return
				}
				for k := range 20 {
					mine := []byte(fmt.Sprintf("%d:%d", r, k))
					got, err := ex.AllGather(ctx, mine)
					if err != nil {
						errs[r] = err
						return
					}
					for q := range n {
						if want := fmt.Sprintf("%d:%d", q, k); !bytes.Equal(got[q], []byte(want)) {
							errs[r] = fmt.Errorf("round %d: part %d is %q, want %q", k, q, got[q], want)
							return
						}
					}
					mine[0] = 'x' // the exchange kept a copy
				}
			}()
		}
		wg.Wait()
		cancel()
		for r, err := range errs {
			if err != nil {
				t.Errorf("%d ranks: rank %d: %v", n, r, err)
			}
		}
	}
	if _, err := LocalExchanges(0); err == nil {
		t.Error("LocalExchanges(0): no error")
	}
}

// TestLocalExchangeMissingRank: a rank that never comes makes the others
// fail at their deadline, naming it.
func TestLocalExchangeMissingRank(t *testing.T) {
	defer goleak.VerifyNone(t)
	exs, err := LocalExchanges(3)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[r] = exs[r].AllGather(ctx, []byte{byte(r)})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ranks [2] did not arrive") {
			t.Errorf("rank %d: %v, want a deadline naming rank 2", r, err)
		}
	}
}
