package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// pool runs parallel-for loops on its workers and the calling goroutine.
//
// One goroutine (the Device's owner) calls For. Each loop is a new job
// published through cur; workers notice it by polling for spin, then park
// on their wake channel. Chunks are claimed from the job itself, and For
// waits for its chunks to be done, not for every worker to respond: a
// worker that the operating system has not scheduled yet costs nothing, and
// one that wakes late finds its job already taken.
type pool struct {
	threads int // workers + the caller
	spin    time.Duration

	cur    atomic.Pointer[job] // the latest job; replaced by each For
	closed atomic.Bool

	workers []*worker
	wg      sync.WaitGroup
}

// job is one parallel-for loop. Its fields other than the counters never
// change after it is published.
type job struct {
	fn     func(tid, lo, hi int)
	n      int
	chunks int
	next   atomic.Int64 // next chunk to claim
	done   atomic.Int64 // chunks finished
}

type worker struct {
	parked atomic.Bool
	wake   chan struct{} // capacity 1: a waker never blocks
	_      [48]byte      // keep workers' flags on separate cache lines
}

func newPool(threads int, spin time.Duration) *pool {
	p := &pool{threads: threads, spin: spin}
	first := &job{}
	p.cur.Store(first)
	for tid := 1; tid < threads; tid++ {
		w := &worker{wake: make(chan struct{}, 1)}
		p.workers = append(p.workers, w)
		p.wg.Add(1)
		go p.loop(tid, w, first)
	}
	return p
}

// close stops the workers and waits for them.
func (p *pool) close() {
	if p.closed.Swap(true) {
		return
	}
	p.cur.Store(&job{})
	p.wakeAll()
	p.wg.Wait()
}

func (p *pool) wakeAll() {
	for _, w := range p.workers {
		if w.parked.Load() && w.parked.CompareAndSwap(true, false) {
			w.wake <- struct{}{}
		}
	}
}

// loop runs the jobs published after seen, the one current when the pool
// started: a worker that starts late must still see every later job.
func (p *pool) loop(tid int, w *worker, seen *job) {
	defer p.wg.Done()
	for {
		seen = p.await(w, seen)
		if p.closed.Load() {
			return
		}
		seen.work(tid)
	}
}

// await returns the first job after seen, polling for p.spin and then
// parking until For or close wakes w.
func (p *pool) await(w *worker, seen *job) *job {
	var start time.Time
	for i := 0; ; i++ {
		if j := p.cur.Load(); j != seen {
			return j
		}
		if i&63 != 63 {
			continue
		}
		if start.IsZero() {
			start = time.Now()
		}
		if time.Since(start) < p.spin {
			if i&1023 == 1023 {
				runtime.Gosched()
			}
			continue
		}
		w.parked.Store(true)
		if j := p.cur.Load(); j != seen {
			if w.parked.CompareAndSwap(true, false) {
				return j
			}
			// A waker claimed us and owes a token; take it.
			<-w.wake
			return j
		}
		<-w.wake
		return p.cur.Load()
	}
}

// work claims chunks of j until none are left.
func (j *job) work(tid int) {
	for {
		c := int(j.next.Add(1) - 1)
		if c >= j.chunks {
			return
		}
		j.fn(tid, c*j.n/j.chunks, (c+1)*j.n/j.chunks)
		j.done.Add(1)
	}
}

// For calls fn(tid, lo, hi) over disjoint ranges covering [0, n), on up to
// threads goroutines at once; tid < threads identifies the goroutine, so fn
// may use per-thread scratch. Ranges hold at least grain items where n
// allows; loops of fewer than 2*grain items run inline. For returns when
// every range is done.
func (p *pool) For(n, grain int, fn func(tid, lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	if p.threads == 1 || n < 2*grain {
		fn(0, 0, n)
		return
	}
	chunks := min(n/grain, 4*p.threads)
	if chunks <= p.threads {
		chunks = min(n/grain, p.threads)
	}
	j := &job{fn: fn, n: n, chunks: chunks}
	p.cur.Store(j)
	p.wakeAll()
	j.work(0)
	for i := 0; j.done.Load() != int64(chunks); i++ {
		if i&255 == 255 {
			runtime.Gosched()
		}
	}
}
