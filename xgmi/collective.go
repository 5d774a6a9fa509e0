package xgmi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/troupe/troupe/gpu"
)

// Algorithm is how AllReduce moves data.
type Algorithm uint8

// All-reduce algorithms.
const (
	// Auto picks LowLatency up to Config.LowLatencyMaxBytes, OneShot up
	// to Config.OneShotMaxBytes, TwoShot above.
	Auto Algorithm = iota
	// OneShot: every rank reads every peer's whole input and reduces it.
	// One synchronisation per step; each rank reads n times the message.
	OneShot
	// TwoShot: reduce-scatter (rank r reduces the r-th segment of every
	// input) then all-gather (every rank copies each reduced segment from
	// its owner). Two synchronisations per step; each rank reads about
	// twice the message, whatever n.
	TwoShot
	// LowLatency: OneShot whose data travels beside the call's epoch, so
	// that a rank reads its peers' without waiting for a flag (the device
	// fabric; NCCL's LL protocol is the same idea). Twice the bytes on the
	// wire, none of the synchronisation: for the smallest messages. The
	// host fabric runs it as OneShot.
	LowLatency
)

func (a Algorithm) String() string {
	switch a {
	case Auto:
		return "auto"
	case OneShot:
		return "oneshot"
	case TwoShot:
		return "twoshot"
	case LowLatency:
		return "lowlatency"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm reads "auto", "oneshot", "twoshot" or "lowlatency".
func ParseAlgorithm(s string) (Algorithm, error) {
	for _, a := range []Algorithm{Auto, OneShot, TwoShot, LowLatency} {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("xgmi: unknown algorithm %q: want auto, oneshot, twoshot or lowlatency", s)
}

// Config tunes a communicator.
type Config struct {
	// Algorithm forces an all-reduce algorithm; Auto chooses by size.
	Algorithm Algorithm
	// OneShotMaxBytes is the largest message (bytes per rank) that Auto
	// reduces in one shot.
	OneShotMaxBytes int
	// LowLatencyMaxBytes is the largest message that Auto reduces with
	// LowLatency (0: never).
	LowLatencyMaxBytes int
}

// DefaultConfig chooses by size with the crossover measured on the host
// fabric (docs/xgmi.md).
func DefaultConfig() Config {
	return Config{Algorithm: Auto, OneShotMaxBytes: 256}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if c.Algorithm > LowLatency {
		return fmt.Errorf("xgmi: config: %s", c.Algorithm)
	}
	if c.OneShotMaxBytes < 0 || c.LowLatencyMaxBytes < 0 {
		return fmt.Errorf("xgmi: config: a negative limit (one-shot %d bytes, low-latency %d)", c.OneShotMaxBytes, c.LowLatencyMaxBytes)
	}
	return nil
}

// choose returns the algorithm for a message of bytes per rank.
func (c Config) choose(bytes int) Algorithm {
	if c.Algorithm != Auto {
		return c.Algorithm
	}
	switch {
	case bytes <= c.LowLatencyMaxBytes:
		return LowLatency
	case bytes <= c.OneShotMaxBytes:
		return OneShot
	}
	return TwoShot
}

// Comm is a communicator over a fabric: the collectives of its ranks.
//
// Each rank is driven by its own goroutine (or the actor that owns the
// rank's device), one call at a time. Every rank must issue the same
// collectives in the same order with the same sizes, as with NCCL; a call
// returns when the rank's part is done. If a rank's call fails (its ctx
// ends, or its arguments are wrong) it aborts the fabric: the calls of the
// other ranks fail with ErrAborted instead of waiting forever, and the
// communicator is unusable from then on.
type Comm struct {
	cfg   Config
	fab   HostMemory
	ranks []*Rank
}

// NewComm returns the communicator of the ranks of fab. Collectives run on
// the host, so fab must implement HostMemory. A fabric serves one
// communicator.
func NewComm(fab Fabric, cfg Config) (*Comm, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hm, ok := fab.(HostMemory)
	if !ok {
		return nil, fmt.Errorf("xgmi: fabric %T has no host-addressable windows: use its device communicator (NewDeviceComm for a CUDAFabric)", fab)
	}
	if fab.WindowBytes() < 64*fab.Ranks() || fab.WindowBytes()%64 != 0 {
		return nil, fmt.Errorf("xgmi: window of %d bytes is too small for %d ranks", fab.WindowBytes(), fab.Ranks())
	}
	c := &Comm{cfg: cfg, fab: hm}
	for r := 0; r < fab.Ranks(); r++ {
		c.ranks = append(c.ranks, &Rank{comm: c, id: r})
	}
	return c, nil
}

// Size is the number of ranks.
func (c *Comm) Size() int { return len(c.ranks) }

// Rank returns rank r's handle.
func (c *Comm) Rank(r int) *Rank { return c.ranks[r] }

// Run calls fn for every rank, each in a goroutine of its own, and waits
// for all of them. When one fails the fabric is aborted, so the others
// return rather than wait; Run returns the errors joined.
func (c *Comm) Run(ctx context.Context, fn func(ctx context.Context, r *Rank) error) error {
	errs := make([]error, len(c.ranks))
	var wg sync.WaitGroup
	for i, r := range c.ranks {
		wg.Go(func() {
			if err := fn(ctx, r); err != nil {
				errs[i] = err
				c.fab.Abort(fmt.Errorf("rank %d: %w", i, err))
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Rank is one rank's handle on a communicator. Its methods are called by
// one goroutine at a time.
type Rank struct {
	comm *Comm
	id   int
	seq  uint64   // steps this rank has begun
	ins  [][]byte // the inputs of a reduction, reused
}

func (r *Rank) inputs() [][]byte {
	if r.ins == nil {
		r.ins = make([][]byte, len(r.comm.ranks))
	}
	return r.ins
}

// ID is the rank's index.
func (r *Rank) ID() int { return r.id }

// wrap names the rank and the collective in the error of a wait.
func (r *Rank) wrap(op string, err error) error {
	return fmt.Errorf("xgmi: rank %d: %s: %w", r.id, op, err)
}

// fail aborts the communicator with err and returns it.
func (r *Rank) fail(err error) error {
	if !errors.Is(err, ErrAborted) && !errors.Is(err, ErrClosed) {
		r.comm.fab.Abort(err)
	}
	return err
}

// waitAll waits until every rank's slot holds seq.
func (r *Rank) waitAll(ctx context.Context, slot int, seq uint64) error {
	for p := range r.comm.ranks {
		if err := r.comm.fab.Wait(ctx, p, slot, seq); err != nil {
			return err
		}
	}
	return nil
}

// begin starts a step: it waits until every rank is done with the
// previous one (so this rank's window is free) and returns the step's
// sequence number.
func (r *Rank) begin(ctx context.Context) (uint64, error) {
	r.seq++
	return r.seq, r.waitAll(ctx, slotDone, r.seq-1)
}

// Barrier returns when every rank has entered it.
func (r *Rank) Barrier(ctx context.Context) error {
	seq, err := r.begin(ctx)
	if err != nil {
		return r.fail(r.wrap("barrier", err))
	}
	fab := r.comm.fab
	fab.Post(r.id, slotReady, seq)
	if err := r.waitAll(ctx, slotReady, seq); err != nil {
		return r.fail(r.wrap("barrier", err))
	}
	fab.Post(r.id, slotDone, seq)
	return nil
}

// Algorithm is the algorithm AllReduce uses for bytes per rank.
func (c *Comm) Algorithm(bytes int) Algorithm { return c.cfg.choose(bytes) }

// AllReduce sums src over the ranks into dst on every rank. dst and src
// hold elements of dt (f32, bf16 or f16, little-endian), are the same
// length on every rank, aligned to the element size, and may be the same
// slice. The sum is in the order SumReference defines, so every rank gets
// the same bits whichever algorithm runs.
func (r *Rank) AllReduce(ctx context.Context, dst, src []byte, dt gpu.DType) error {
	if err := checkReducible(dt); err != nil {
		return r.fail(r.wrap("all-reduce", err))
	}
	if err := checkBuffers(dt, len(src), dst, src); err != nil {
		return r.fail(r.wrap("all-reduce", err))
	}
	algo := r.comm.cfg.choose(len(src))
	win := r.comm.fab.WindowBytes()
	// A message larger than the window runs in steps of a window.
	for off := 0; off < len(src); {
		c := min(len(src)-off, win)
		var err error
		if algo == OneShot || algo == LowLatency {
			err = r.oneShot(ctx, dst[off:off+c], src[off:off+c], dt)
		} else {
			err = r.twoShot(ctx, dst[off:off+c], src[off:off+c], dt)
		}
		if err != nil {
			return r.fail(r.wrap("all-reduce", err))
		}
		off += c
	}
	return nil
}

// oneShot is one step of the one-shot all-reduce: publish the input, then
// reduce every rank's window into dst.
func (r *Rank) oneShot(ctx context.Context, dst, src []byte, dt gpu.DType) error {
	fab := r.comm.fab
	seq, err := r.begin(ctx)
	if err != nil {
		return err
	}
	copy(fab.Window(r.id), src)
	fab.Post(r.id, slotReady, seq)
	if err := r.waitAll(ctx, slotReady, seq); err != nil {
		return err
	}
	ins := r.inputs()
	for p := range ins {
		ins[p] = fab.Window(p)[:len(src)]
	}
	sumInto(dt, dst, ins)
	fab.Post(r.id, slotDone, seq)
	return nil
}

// segment returns rank p's part [lo, hi) of a message of c bytes split in
// n, on 64-byte boundaries (the last part takes the rest).
func segment(p, n, c int) (lo, hi int) {
	per := (c/n + 63) &^ 63
	lo = min(p*per, c)
	hi = min(lo+per, c)
	if p == n-1 {
		hi = c
	}
	return lo, hi
}

// twoShot is one step of the two-shot all-reduce: publish the input;
// reduce this rank's segment of every window into its own window in
// place; then copy each rank's reduced segment into dst.
func (r *Rank) twoShot(ctx context.Context, dst, src []byte, dt gpu.DType) error {
	fab := r.comm.fab
	n := len(r.comm.ranks)
	seq, err := r.begin(ctx)
	if err != nil {
		return err
	}
	mine := fab.Window(r.id)
	copy(mine, src)
	fab.Post(r.id, slotReady, seq)
	if err := r.waitAll(ctx, slotReady, seq); err != nil {
		return err
	}
	lo, hi := segment(r.id, n, len(src))
	if hi > lo {
		ins := r.inputs()
		for p := range ins {
			ins[p] = fab.Window(p)[lo:hi]
		}
		// Only this rank reads its own segment of its window, so the
		// sum may overwrite it.
		sumInto(dt, mine[lo:hi], ins)
	}
	fab.Post(r.id, slotReduced, seq)
	for k := range n {
		// Start with the next rank's segment, so the ranks do not all
		// read the same window at once.
		p := (r.id + k) % n
		if err := fab.Wait(ctx, p, slotReduced, seq); err != nil {
			return err
		}
		lo, hi := segment(p, n, len(src))
		copy(dst[lo:hi], fab.Window(p)[lo:hi])
	}
	fab.Post(r.id, slotDone, seq)
	return nil
}

// AllGather concatenates every rank's src into dst in rank order: dst is
// Size() times as long as src, the same lengths on every rank.
func (r *Rank) AllGather(ctx context.Context, dst, src []byte) error {
	n := len(r.comm.ranks)
	if len(dst) != n*len(src) {
		return r.fail(r.wrap("all-gather", fmt.Errorf("%d bytes out for %d in over %d ranks, want %d", len(dst), len(src), n, n*len(src))))
	}
	fab := r.comm.fab
	win := fab.WindowBytes()
	for off := 0; off < len(src); {
		c := min(len(src)-off, win)
		seq, err := r.begin(ctx)
		if err != nil {
			return r.fail(r.wrap("all-gather", err))
		}
		copy(fab.Window(r.id), src[off:off+c])
		fab.Post(r.id, slotReady, seq)
		for k := range n {
			p := (r.id + k) % n
			if err := fab.Wait(ctx, p, slotReady, seq); err != nil {
				return r.fail(r.wrap("all-gather", err))
			}
			copy(dst[p*len(src)+off:p*len(src)+off+c], fab.Window(p)[:c])
		}
		fab.Post(r.id, slotDone, seq)
		off += c
	}
	return nil
}

// Broadcast copies root's buf into buf on every other rank; buf is the
// same length on every rank.
func (r *Rank) Broadcast(ctx context.Context, buf []byte, root int) error {
	n := len(r.comm.ranks)
	if root < 0 || root >= n {
		return r.fail(r.wrap("broadcast", fmt.Errorf("root %d outside %d ranks", root, n)))
	}
	fab := r.comm.fab
	win := fab.WindowBytes()
	for off := 0; off < len(buf); {
		c := min(len(buf)-off, win)
		seq, err := r.begin(ctx)
		if err != nil {
			return r.fail(r.wrap("broadcast", err))
		}
		if r.id == root {
			copy(fab.Window(r.id), buf[off:off+c])
			fab.Post(r.id, slotReady, seq)
		} else {
			if err := fab.Wait(ctx, root, slotReady, seq); err != nil {
				return r.fail(r.wrap("broadcast", err))
			}
			copy(buf[off:off+c], fab.Window(root)[:c])
		}
		fab.Post(r.id, slotDone, seq)
		off += c
	}
	return nil
}

// checkBuffers checks the lengths and alignment of a collective's buffers.
func checkBuffers(dt gpu.DType, want int, bufs ...[]byte) error {
	es := dt.Size()
	for _, b := range bufs {
		if len(b) != want {
			return fmt.Errorf("buffers of %d and %d bytes, want equal", len(b), want)
		}
		if len(b)%es != 0 {
			return fmt.Errorf("%d bytes is not a whole number of %s elements", len(b), dt)
		}
		if len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))%uintptr(es) != 0 {
			return fmt.Errorf("buffer not aligned to its %d-byte %s elements", es, dt)
		}
	}
	return nil
}
