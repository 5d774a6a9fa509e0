package xgmi

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"

	"github.com/troupe/troupe/gpu"
)

var dtypes = []gpu.DType{gpu.F32, gpu.BF16, gpu.F16}

var full = flag.Bool("xgmi.full", false, "sweep every rank count, type and algorithm up to 64 MiB per rank (minutes)")

// newComm returns a communicator over a fresh host fabric.
func newComm(t testing.TB, ranks, window, spin int, cfg Config) *Comm {
	t.Helper()
	f, err := NewHostFabric(HostFabricConfig{Ranks: ranks, WindowBytes: window, Spin: spin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	c, err := NewComm(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// randomInput returns n elements of dt, aligned, from r: values of mixed
// magnitude and sign so that roundings and the summation order matter.
func randomInput(r *rand.Rand, dt gpu.DType, n int) []byte {
	back := make([]uint64, (n*dt.Size()+7)/8)
	var b []byte
	if len(back) > 0 {
		b = bytesOf(back)[:n*dt.Size()]
	}
	// Random for the first period elements, then repeated: a period
	// prime to every segment and window size still catches a misplaced
	// byte, and 64 MiB inputs take no time to make.
	const period = 65521
	for i := range min(n, period) {
		// Sign, an exponent in [2^-6, 2^5] and a full mantissa.
		u := r.Uint32()
		bits := u&0x807fffff | (121+u>>23&0xf%12)<<23
		store(dt, b, i, math.Float32frombits(bits))
	}
	es := dt.Size()
	for i := period; i < n; i += period {
		copy(b[i*es:], b[:period*es])
	}
	return b
}

func bytesOf(v []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 8*len(v))
}

// sizes returns the message sizes (elements per rank) of the sweep: the
// powers of two from 8 and their odd neighbours (8, 9, 15, 16, 17, …,
// 1023, 1024, 1025, …, 65537, …), then maxElems.
func sizes(maxElems int) []int {
	s := []int{8, 9}
	for n := 16; n <= maxElems; n *= 2 {
		s = append(s, n-1, n)
		if n+1 <= maxElems {
			s = append(s, n+1)
		}
	}
	if s[len(s)-1] != maxElems {
		s = append(s, maxElems)
	}
	return s
}

// checkAllReduce runs one all-reduce of n elements of dt on c and compares
// every rank's result with SumReference, bit for bit.
func checkAllReduce(t *testing.T, c *Comm, dt gpu.DType, n int, seed uint64, inPlace bool) {
	t.Helper()
	ranks := c.Size()
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	ins := make([][]byte, ranks)
	outs := make([][]byte, ranks)
	for i := range ins {
		ins[i] = randomInput(r, dt, n)
		if inPlace {
			outs[i] = alignedCopy(ins[i])
		} else {
			outs[i] = randomInput(r, dt, n) // garbage the collective overwrites
		}
	}
	want := make([]byte, n*dt.Size())
	if err := SumReference(dt, want, ins); err != nil {
		t.Fatal(err)
	}
	err := c.Run(t.Context(), func(ctx context.Context, rk *Rank) error {
		src := ins[rk.ID()]
		if inPlace {
			src = outs[rk.ID()]
		}
		return rk.AllReduce(ctx, outs[rk.ID()], src, dt)
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, out := range outs {
		if !bytes.Equal(out, want) {
			at := firstDiff(out, want) / dt.Size()
			t.Fatalf("rank %d of %d, %d %s (%s): element %d is %v, want %v",
				i, ranks, n, dt, c.Algorithm(n*dt.Size()), at, load(dt, out, at), load(dt, want, at))
		}
	}
}

func alignedCopy(b []byte) []byte {
	back := make([]uint64, (len(b)+7)/8)
	if len(back) == 0 {
		return []byte{}
	}
	out := bytesOf(back)[:len(b)]
	copy(out, b)
	return out
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// TestAllReduceSweep checks every rank count, type and algorithm against
// the oracle from 8 elements up to 1 MiB per rank (64 KiB with -short or
// -race, 64 MiB with -xgmi.full); the window is small so that most sizes
// take several steps.
func TestAllReduceSweep(t *testing.T) {
	defer goleak.VerifyNone(t)
	maxBytes, window := 1<<20, 16<<10
	switch {
	case *full:
		maxBytes, window = 64<<20, 256<<10
	case testing.Short() || raceEnabled:
		maxBytes = 64 << 10
	}
	for _, ranks := range []int{2, 3, 4, 8} {
		for _, dt := range dtypes {
			for _, algo := range []Algorithm{Auto, OneShot, TwoShot} {
				t.Run(fmt.Sprintf("%dranks/%s/%s", ranks, dt, algo), func(t *testing.T) {
					cfg := DefaultConfig()
					cfg.Algorithm = algo
					cfg.OneShotMaxBytes = 2 << 10
					// Half the runs park at once, the other half poll first.
					c := newComm(t, ranks, window, int(algo)%2*64, cfg)
					for i, n := range sizes(maxBytes / dt.Size()) {
						checkAllReduce(t, c, dt, n, uint64(ranks), i%3 == 0)
					}
				})
			}
		}
	}
}

// TestAllReduceLarge runs the largest messages, up to 64 MiB per rank, with
// the default window; without -short, and under the race detector only
// the first.
func TestAllReduceLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large messages: run without -short")
	}
	defer goleak.VerifyNone(t)
	cases := []struct {
		ranks int
		dt    gpu.DType
		algo  Algorithm
		bytes int
	}{
		{2, gpu.BF16, Auto, 4<<20 + 2},
		{4, gpu.F32, TwoShot, 16 << 20},
		{3, gpu.F16, OneShot, 16<<20 + 6},
		{8, gpu.BF16, TwoShot, 64 << 20},
		{2, gpu.F32, Auto, 64 << 20},
	}
	if raceEnabled {
		cases = cases[:1]
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%dranks/%s/%s/%dB", tc.ranks, tc.dt, tc.algo, tc.bytes), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Algorithm = tc.algo
			c := newComm(t, tc.ranks, DefaultHostFabricConfig().WindowBytes, DefaultHostFabricConfig().Spin, cfg)
			checkAllReduce(t, c, tc.dt, tc.bytes/tc.dt.Size(), 7, false)
		})
	}
}

// TestReductionOrder pins the documented order with sums whose result
// depends on it: f32 accumulation in rank order, one rounding at the end.
func TestReductionOrder(t *testing.T) {
	defer goleak.VerifyNone(t)
	cases := []struct {
		name string
		dt   gpu.DType
		in   []float32 // one element per rank
		want float32
	}{
		// Rounding after every addition would give 1 + 2^-8 -> 1 twice.
		{"bf16 rounds once", gpu.BF16, []float32{1, 1.0 / 256, 1.0 / 256}, 1 + 1.0/128},
		{"f16 rounds once", gpu.F16, []float32{1, 1.0 / 2048, 1.0 / 2048}, 1 + 1.0/1024},
		// (1e8 + 1) - 1e8 in f32 is 0; another order would give 1.
		{"f32 rank order", gpu.F32, []float32{1e8, 1, -1e8}, 0},
		{"negative zeros stay negative", gpu.F32, []float32{float32(math.Copysign(0, -1)), float32(math.Copysign(0, -1))}, float32(math.Copysign(0, -1))},
	}
	for _, tc := range cases {
		for _, algo := range []Algorithm{OneShot, TwoShot} {
			t.Run(tc.name+"/"+algo.String(), func(t *testing.T) {
				cfg := DefaultConfig()
				cfg.Algorithm = algo
				c := newComm(t, len(tc.in), 4<<10, 0, cfg)
				outs := make([][]byte, len(tc.in))
				err := c.Run(t.Context(), func(ctx context.Context, rk *Rank) error {
					buf := alignedCopy(make([]byte, tc.dt.Size()))
					store(tc.dt, buf, 0, tc.in[rk.ID()])
					outs[rk.ID()] = buf
					return rk.AllReduce(ctx, buf, buf, tc.dt)
				})
				if err != nil {
					t.Fatal(err)
				}
				for i, o := range outs {
					got := load(tc.dt, o, 0)
					if math.Float32bits(got) != math.Float32bits(tc.want) {
						t.Errorf("rank %d: got %v, want %v", i, got, tc.want)
					}
				}
			})
		}
	}
}

// TestSpecialValues: infinities, NaNs and subnormals come out of every
// algorithm as the oracle computes them.
func TestSpecialValues(t *testing.T) {
	defer goleak.VerifyNone(t)
	specials := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-40, -1e-40, 65504, 3.4e38, 0}
	for _, dt := range dtypes {
		for _, algo := range []Algorithm{OneShot, TwoShot} {
			cfg := DefaultConfig()
			cfg.Algorithm = algo
			c := newComm(t, 3, 4<<10, 0, cfg)
			const n = 300
			ins := make([][]byte, 3)
			for r := range ins {
				ins[r] = alignedCopy(make([]byte, n*dt.Size()))
				for i := range n {
					store(dt, ins[r], i, specials[(i+r*i/3)%len(specials)])
				}
			}
			want := make([]byte, n*dt.Size())
			if err := SumReference(dt, want, ins); err != nil {
				t.Fatal(err)
			}
			outs := make([][]byte, 3)
			err := c.Run(t.Context(), func(ctx context.Context, rk *Rank) error {
				outs[rk.ID()] = alignedCopy(make([]byte, n*dt.Size()))
				return rk.AllReduce(ctx, outs[rk.ID()], ins[rk.ID()], dt)
			})
			if err != nil {
				t.Fatal(err)
			}
			for r, o := range outs {
				if !bytes.Equal(o, want) {
					t.Errorf("%s %s rank %d: element %d differs from the oracle", dt, algo, r, firstDiff(o, want)/dt.Size())
				}
			}
		}
	}
}

func TestAllGatherBroadcast(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, ranks := range []int{1, 2, 3, 4, 8} {
		t.Run(fmt.Sprintf("%dranks", ranks), func(t *testing.T) {
			c := newComm(t, ranks, 4<<10, 16, DefaultConfig())
			r := rand.New(rand.NewPCG(3, uint64(ranks)))
			for _, n := range []int{0, 1, 7, 4096, 4097, 40000} {
				ins := make([][]byte, ranks)
				var want []byte
				for i := range ins {
					ins[i] = make([]byte, n)
					for j := range ins[i] {
						ins[i][j] = byte(r.Uint32())
					}
					want = append(want, ins[i]...)
				}
				root := n % ranks
				gathered := make([][]byte, ranks)
				bcast := make([][]byte, ranks)
				err := c.Run(t.Context(), func(ctx context.Context, rk *Rank) error {
					id := rk.ID()
					gathered[id] = make([]byte, ranks*n)
					if err := rk.AllGather(ctx, gathered[id], ins[id]); err != nil {
						return err
					}
					bcast[id] = append([]byte(nil), ins[id]...)
					return rk.Broadcast(ctx, bcast[id], root)
				})
				if err != nil {
					t.Fatal(err)
				}
				for i := range ranks {
					if !bytes.Equal(gathered[i], want) {
						t.Fatalf("all-gather of %d bytes, rank %d: byte %d differs", n, i, firstDiff(gathered[i], want))
					}
					if !bytes.Equal(bcast[i], ins[root]) {
						t.Fatalf("broadcast of %d bytes from %d, rank %d: byte %d differs", n, root, i, firstDiff(bcast[i], ins[root]))
					}
				}
			}
		})
	}
}

// TestConcurrentComms runs several communicators at once, each issuing a
// mix of collectives, and checks every result.
func TestConcurrentComms(t *testing.T) {
	defer goleak.VerifyNone(t)
	const comms = 4
	done := make(chan error, comms)
	for k := range comms {
		c := newComm(t, 2+k, 8<<10, k%2*32, DefaultConfig())
		go func() {
			done <- func() error {
				for i, n := range []int{8, 1023, 4097, 20000} {
					dt := dtypes[(i+k)%len(dtypes)]
					r := rand.New(rand.NewPCG(uint64(k), uint64(n)))
					ins := make([][]byte, c.Size())
					for j := range ins {
						ins[j] = randomInput(r, dt, n)
					}
					want := make([]byte, n*dt.Size())
					if err := SumReference(dt, want, ins); err != nil {
						return err
					}
					outs := make([][]byte, c.Size())
					err := c.Run(t.Context(), func(ctx context.Context, rk *Rank) error {
						outs[rk.ID()] = alignedCopy(make([]byte, n*dt.Size()))
						if err := rk.Barrier(ctx); err != nil {
							return err
						}
						return rk.AllReduce(ctx, outs[rk.ID()], ins[rk.ID()], dt)
					})
					if err != nil {
						return err
					}
					for j, o := range outs {
						if !bytes.Equal(o, want) {
							return fmt.Errorf("comm %d, rank %d, %d %s: results differ from the oracle", k, j, n, dt)
						}
					}
				}
				return nil
			}()
		}()
	}
	for range comms {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// TestCancelMidCollective cancels the ranks' context while they loop over
// all-reduces: every rank returns, the communicator is aborted, and no
// goroutine is left behind.
func TestCancelMidCollective(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, spin := range []int{0, 64} {
		c := newComm(t, 4, 4<<10, spin, DefaultConfig())
		ctx, cancel := context.WithCancel(t.Context())
		var calls atomic.Int64
		errc := make(chan error, 1)
		go func() {
			errc <- c.Run(ctx, func(ctx context.Context, rk *Rank) error {
				buf := alignedCopy(make([]byte, 64<<10))
				for {
					if err := rk.AllReduce(ctx, buf, buf, gpu.F32); err != nil {
						return err
					}
					calls.Add(1)
				}
			})
		}()
		for calls.Load() < 20 {
			time.Sleep(time.Millisecond) // polling for progress, not a timing assumption
		}
		cancel()
		err := <-errc
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("spin %d: got %v, want context.Canceled among the errors", spin, err)
		}
		buf := alignedCopy(make([]byte, 64))
		if err := c.Rank(0).AllReduce(t.Context(), buf, buf, gpu.F32); !errors.Is(err, ErrAborted) {
			t.Errorf("spin %d: all-reduce after the abort: got %v, want ErrAborted", spin, err)
		}
	}
}

// TestMissingRank: when one rank never joins, the others wait until their
// context ends, then return; nothing is left waiting.
func TestMissingRank(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := newComm(t, 3, 4<<10, 8, DefaultConfig())
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err := c.Run(ctx, func(ctx context.Context, rk *Rank) error {
		if rk.ID() == 2 {
			return nil
		}
		buf := alignedCopy(make([]byte, 1024))
		return rk.AllReduce(ctx, buf, buf, gpu.BF16)
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}
}

// TestBadArguments: a rank that passes bad arguments fails, and aborts the
// others instead of leaving them waiting.
func TestBadArguments(t *testing.T) {
	defer goleak.VerifyNone(t)
	cases := []struct {
		name string
		call func(ctx context.Context, rk *Rank) error
	}{
		{"dtype", func(ctx context.Context, rk *Rank) error {
			b := alignedCopy(make([]byte, 64))
			return rk.AllReduce(ctx, b, b, gpu.I32)
		}},
		{"lengths", func(ctx context.Context, rk *Rank) error {
			return rk.AllReduce(ctx, alignedCopy(make([]byte, 64)), alignedCopy(make([]byte, 32)), gpu.F32)
		}},
		{"partial element", func(ctx context.Context, rk *Rank) error {
			b := alignedCopy(make([]byte, 66))
			return rk.AllReduce(ctx, b, b, gpu.F32)
		}},
		{"misaligned", func(ctx context.Context, rk *Rank) error {
			b := alignedCopy(make([]byte, 72))[1:65]
			return rk.AllReduce(ctx, b, b, gpu.BF16)
		}},
		{"all-gather size", func(ctx context.Context, rk *Rank) error {
			return rk.AllGather(ctx, make([]byte, 10), make([]byte, 4))
		}},
		{"broadcast root", func(ctx context.Context, rk *Rank) error {
			return rk.Broadcast(ctx, make([]byte, 10), 5)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newComm(t, 2, 4<<10, 0, DefaultConfig())
			err := c.Run(t.Context(), func(ctx context.Context, rk *Rank) error {
				if rk.ID() == 0 {
					return tc.call(ctx, rk)
				}
				b := alignedCopy(make([]byte, 64))
				return rk.AllReduce(ctx, b, b, gpu.F32)
			})
			if err == nil || !errors.Is(err, ErrAborted) {
				t.Errorf("got %v, want rank 0's error and ErrAborted for rank 1", err)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
	if err := (Config{OneShotMaxBytes: -1}).Validate(); err == nil {
		t.Error("negative one-shot limit: no error")
	}
	if err := (Config{LowLatencyMaxBytes: -1}).Validate(); err == nil {
		t.Error("negative low-latency limit: no error")
	}
	if err := (Config{Algorithm: 9}).Validate(); err == nil {
		t.Error("unknown algorithm: no error")
	}
	if err := DefaultHostFabricConfig().Validate(); err != nil {
		t.Errorf("default fabric config: %v", err)
	}
	for _, bad := range []HostFabricConfig{{Ranks: 0, WindowBytes: 4096}, {Ranks: 2, WindowBytes: 4000}, {Ranks: 2, WindowBytes: 1024}, {Ranks: 2, WindowBytes: 4096, Spin: -1}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	for _, a := range []Algorithm{Auto, OneShot, TwoShot, LowLatency} {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("parse %q: got %v, %v", a, got, err)
		}
	}
	if _, err := ParseAlgorithm("ring"); err == nil {
		t.Error("parse ring: no error")
	}
	cfg := DefaultConfig()
	if got := cfg.choose(cfg.OneShotMaxBytes); got != OneShot {
		t.Errorf("auto at the limit: got %s, want oneshot", got)
	}
	if got := cfg.choose(cfg.OneShotMaxBytes + 1); got != TwoShot {
		t.Errorf("auto above the limit: got %s, want twoshot", got)
	}
	// Low-latency below its limit, one-shot to its own, two-shot above.
	cfg = Config{OneShotMaxBytes: 4096, LowLatencyMaxBytes: 1024}
	for bytes, want := range map[int]Algorithm{8: LowLatency, 1024: LowLatency, 1025: OneShot, 4096: OneShot, 4097: TwoShot} {
		if got := cfg.choose(bytes); got != want {
			t.Errorf("auto for %d bytes: got %s, want %s", bytes, got, want)
		}
	}
}

// TestHostLowLatency: the host fabric runs a forced low-latency all-reduce
// as its one-shot, with SumReference's bits.
func TestHostLowLatency(t *testing.T) {
	cfg := DefaultHostFabricConfig()
	cfg.Ranks = 2
	fab, err := NewHostFabric(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fab.Close()
	comm, err := NewComm(fab, Config{Algorithm: LowLatency})
	if err != nil {
		t.Fatal(err)
	}
	ins := [][]byte{gpu.F32Bytes([]float32{1, 2.5, -3, 1e-8}), gpu.F32Bytes([]float32{4, 0.25, 3, 1})}
	want := make([]byte, 16)
	if err := SumReference(gpu.F32, want, ins); err != nil {
		t.Fatal(err)
	}
	outs := [][]byte{make([]byte, 16), make([]byte, 16)}
	if err := comm.Run(t.Context(), func(ctx context.Context, r *Rank) error {
		return r.AllReduce(ctx, outs[r.ID()], ins[r.ID()], gpu.F32)
	}); err != nil {
		t.Fatal(err)
	}
	for r, out := range outs {
		if string(out) != string(want) {
			t.Errorf("rank %d: %v, want %v", r, out, want)
		}
	}
}

func TestSegments(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 8} {
		for _, c := range []int{0, 2, 64, 100, 4096, 4098, 1 << 20} {
			next := 0
			for p := range n {
				lo, hi := segment(p, n, c)
				if lo != next || hi < lo || (p < n-1 && lo%64 != 0 && lo != c) {
					t.Fatalf("%d bytes over %d ranks: segment %d is [%d, %d) after %d", c, n, p, lo, hi, next)
				}
				next = hi
			}
			if next != c {
				t.Fatalf("%d bytes over %d ranks: segments end at %d", c, n, next)
			}
		}
	}
}

func BenchmarkAllReduce(b *testing.B) {
	for _, ranks := range []int{2, 4} {
		for _, size := range []int{8 << 10, 1 << 20, 16 << 20} {
			for _, algo := range []Algorithm{OneShot, TwoShot} {
				b.Run(fmt.Sprintf("%dranks/%dKiB/bf16/%s", ranks, size>>10, algo), func(b *testing.B) {
					cfg := DefaultConfig()
					cfg.Algorithm = algo
					def := DefaultHostFabricConfig()
					c := newComm(b, ranks, def.WindowBytes, def.Spin, cfg)
					benchAllReduce(b, c, gpu.BF16, size)
				})
			}
		}
	}
}

// benchAllReduce times all-reduces of size bytes: this goroutine drives
// rank 0 under b.Loop, the other ranks follow in goroutines of their own
// until they have done as many calls as rank 0.
func benchAllReduce(b *testing.B, c *Comm, dt gpu.DType, size int) {
	bufs := make([][]byte, c.Size())
	for i := range bufs {
		bufs[i] = randomInput(rand.New(rand.NewPCG(1, uint64(i))), dt, size/dt.Size())
	}
	var stopAt atomic.Int64 // rank 0's call count at the end; 0 while running
	others := make(chan error, 1)
	go func() {
		others <- c.Run(b.Context(), func(ctx context.Context, rk *Rank) error {
			if rk.ID() == 0 {
				return nil
			}
			out := alignedCopy(bufs[rk.ID()])
			for done := int64(0); ; done++ {
				if s := stopAt.Load(); s != 0 && done >= s {
					return nil
				}
				if err := rk.AllReduce(ctx, out, bufs[rk.ID()], dt); err != nil {
					return err
				}
			}
		})
	}()
	rk := c.Rank(0)
	out := alignedCopy(bufs[0])
	b.SetBytes(int64(size))
	b.ReportAllocs()
	calls := int64(0)
	for b.Loop() {
		if err := rk.AllReduce(b.Context(), out, bufs[0], dt); err != nil {
			b.Fatal(err)
		}
		calls++
	}
	// The others may already be in call calls+1: match it.
	stopAt.Store(calls + 1)
	if err := rk.AllReduce(b.Context(), out, bufs[0], dt); err != nil {
		b.Fatal(err)
	}
	if err := <-others; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSum is the reduction kernel alone: two 1 MiB inputs into one
// output, the work of a two-rank one-shot step.
func BenchmarkSum(b *testing.B) {
	for _, dt := range dtypes {
		b.Run(dt.String(), func(b *testing.B) {
			r := rand.New(rand.NewPCG(5, 5))
			n := (1 << 20) / dt.Size()
			ins := [][]byte{randomInput(r, dt, n), randomInput(r, dt, n)}
			out := alignedCopy(ins[0])
			b.SetBytes(2 << 20)
			for b.Loop() {
				sumInto(dt, out, ins)
			}
		})
	}
}
