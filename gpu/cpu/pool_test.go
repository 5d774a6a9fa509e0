package cpu

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// TestPoolCovers checks that For hands out every index exactly once, with
// ranges of at least grain where possible, for workers that spin and for
// workers that park between loops.
func TestPoolCovers(t *testing.T) {
	for _, spin := range []time.Duration{0, time.Millisecond} {
		for _, threads := range []int{1, 2, 4} {
			t.Run(fmt.Sprintf("spin=%v/threads=%d", spin, threads), func(t *testing.T) {
				p := newPool(threads, spin)
				defer p.close()
				for _, c := range []struct{ n, grain int }{{1, 1}, {2, 1}, {7, 1}, {100, 3}, {1000, 1}, {1000, 400}, {5, 10}} {
					hits := make([]atomic.Int32, c.n)
					var ranges, small atomic.Int32
					tids := make([]atomic.Int32, threads)
					p.For(c.n, c.grain, func(tid, lo, hi int) {
						tids[tid].Add(1)
						ranges.Add(1)
						if hi-lo < c.grain {
							small.Add(1)
						}
						for i := lo; i < hi; i++ {
							hits[i].Add(1)
						}
					})
					for i := range hits {
						if h := hits[i].Load(); h != 1 {
							t.Fatalf("n=%d grain=%d: index %d run %d times", c.n, c.grain, i, h)
						}
					}
					if c.n >= c.grain && small.Load() != 0 {
						t.Errorf("n=%d grain=%d: %d of %d ranges below the grain", c.n, c.grain, small.Load(), ranges.Load())
					}
					// Let parked workers park again before the next loop.
					if spin == 0 {
						time.Sleep(time.Millisecond)
					}
				}
			})
		}
	}
}

// TestPoolCloseIdle closes pools whose workers are spinning or parked; the
// package's TestMain fails on leaked goroutines.
func TestPoolCloseIdle(t *testing.T) {
	for _, spin := range []time.Duration{0, time.Hour} {
		p := newPool(4, spin)
		var n atomic.Int32
		p.For(8, 1, func(_, lo, hi int) { n.Add(int32(hi - lo)) })
		p.close()
		p.close()
		if n.Load() != 8 {
			t.Errorf("spin=%v: ran %d items, want 8", spin, n.Load())
		}
	}
}
