//go:build cuda

package xgmi

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
)

// normCase is one fused all-reduce and norm over every rank: n rows of
// dim values of o on each rank, one residual and one weight for all.
type normCase struct {
	pre    bool // AllReduceAddRMSNorm; else AllReduceRMSNormAdd
	n, dim int
	wdt    gpu.DType
	ins    [][]float32 // o by rank
	res, w []float32
	bufs   []normBufs
}

type normBufs struct{ o, res, out, w gpu.Buffer }

const normEps = 1e-6

func newNormCase(t *testing.T, devs []*cuda.Device, rng *rand.Rand, pre bool, n, dim int, wdt gpu.DType) *normCase {
	t.Helper()
	c := &normCase{pre: pre, n: n, dim: dim, wdt: wdt}
	randn := func(k int, scale float64) []float32 {
		v := make([]float32, k)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * scale)
		}
		return v
	}
	c.res, c.w = randn(n*dim, 1), randn(dim, 0.5)
	wb := gpu.F32Bytes(c.w)
	if wdt == gpu.BF16 {
		h := make([]uint16, dim)
		for i, v := range c.w {
			h[i] = gpu.F32ToBF16(v)
			c.w[i] = gpu.BF16ToF32(h[i])
		}
		wb = gpu.U16Bytes(h)
	}
	for _, d := range devs {
		in := randn(n*dim, math.Ldexp(1, rng.IntN(8)-4))
		c.ins = append(c.ins, in)
		var b normBufs
		var err error
		if b.o, err = d.Alloc(gpu.F32, n*dim); err == nil {
			err = d.Write(b.o, 0, gpu.F32Bytes(in))
		}
		if err == nil {
			if b.res, err = d.Alloc(gpu.F32, n*dim); err == nil {
				err = d.Write(b.res, 0, gpu.F32Bytes(c.res))
			}
		}
		if err == nil {
			b.out, err = d.Alloc(gpu.F32, n*dim)
		}
		if err == nil {
			b.w, err = d.Weights(wdt, wb)
		}
		if err != nil {
			t.Fatal(err)
		}
		c.bufs = append(c.bufs, b)
	}
	return c
}

func (c *normCase) issue(comm *DeviceComm) error {
	for r, b := range c.bufs {
		var err error
		if c.pre {
			err = comm.Rank(r).AllReduceAddRMSNorm(b.out, b.res, b.o, b.w, c.n, c.dim, normEps)
		} else {
			err = comm.Rank(r).AllReduceRMSNormAdd(b.res, b.o, b.w, c.n, c.dim, normEps)
		}
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

// check reads every rank's results: the sums equal SumReference bit for
// bit, the residual (and the normalised rows) are within 1e-5 of an f64
// oracle computed from those sums and the same bits on every rank.
func (c *normCase) check(t *testing.T, devs []*cuda.Device, what string) {
	t.Helper()
	nd := c.n * c.dim
	ins := make([][]byte, len(c.ins))
	for r, in := range c.ins {
		ins[r] = gpu.F32Bytes(in)
	}
	sumBytes := make([]byte, nd*4)
	if err := SumReference(gpu.F32, sumBytes, ins); err != nil {
		t.Fatal(err)
	}
	read := func(d *cuda.Device, b gpu.Buffer) []float32 {
		v := make([]float32, nd)
		if err := d.Read(gpu.F32Bytes(v), b, 0); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
	var res0, out0 []float32
	for r, d := range devs {
		o := read(d, c.bufs[r].o)
		if i := diff(gpu.F32, gpu.F32Bytes(o), sumBytes); i >= 0 {
			t.Fatalf("%s rank %d: sum element %d is %g, want SumReference's", what, r, i, o[i])
		}
		res := read(d, c.bufs[r].res)
		var out []float32
		if c.pre {
			out = read(d, c.bufs[r].out)
		}
		if r == 0 {
			res0, out0 = res, out
			c.oracle(t, what, o, res, out)
			continue
		}
		if !slices.Equal(gpu.F32Bytes(res), gpu.F32Bytes(res0)) || !slices.Equal(gpu.F32Bytes(out), gpu.F32Bytes(out0)) {
			t.Fatalf("%s: rank %d's residual or norm differs from rank 0's", what, r)
		}
	}
}

func (c *normCase) oracle(t *testing.T, what string, sum, res, out []float32) {
	t.Helper()
	for row := range c.n {
		lo := row * c.dim
		x := make([]float64, c.dim)
		var ss float64
		for j := range x {
			x[j] = float64(sum[lo+j])
			if c.pre {
				x[j] += float64(c.res[lo+j])
			}
			ss += x[j] * x[j]
		}
		inv := 1 / math.Sqrt(ss/float64(c.dim)+normEps)
		for j := range x {
			y := x[j] * inv * float64(c.w[j])
			got, want := float64(res[lo+j]), float64(c.res[lo+j])+y
			if c.pre {
				got, want = float64(out[lo+j]), y
				if r := float64(res[lo+j]); math.Abs(r-x[j]) > 1e-6*math.Abs(x[j]) {
					t.Fatalf("%s: residual row %d element %d is %g, want %g", what, row, j, r, x[j])
				}
			}
			if math.Abs(got-want) > 1e-5*(1+math.Abs(want)) {
				t.Fatalf("%s: row %d element %d is %g, want %g", what, row, j, got, want)
			}
		}
	}
}

// TestCUDAAllReduceNorm: the all-reduces fused with a residual norm (one
// kernel where the message takes the one-shot, AllReduceN and the
// device's norm where a forced two-shot is configured), pre- and post-norm,
// f32 and bf16 weights, one row to more rows than the grid has blocks, and
// more values than a low-latency collective carries (not fused).
func TestCUDAAllReduceNorm(t *testing.T) {
	devs := openGPUs(t)
	eachConfig(t, devs, 11, func(comm *DeviceComm, rng *rand.Rand, algo Algorithm) {
		for _, pre := range []bool{false, true} {
			for _, wdt := range []gpu.DType{gpu.F32, gpu.BF16} {
				for _, sh := range [][2]int{{1, 4096}, {1, 2048}, {3, 100}, {300, 64}, {16, 4096}} {
					what := fmt.Sprintf("%s pre=%v %s %d×%d", algo, pre, wdt, sh[0], sh[1])
					c := newNormCase(t, devs, rng, pre, sh[0], sh[1], wdt)
					if err := c.issue(comm); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					c.check(t, devs, what)
				}
			}
		}
	})
}

// eachConfig runs f with a communicator of the default configuration and
// with one forced to the two-shot (where the fused operations fall back),
// each with a generator seeded from seed.
func eachConfig(t *testing.T, devs []*cuda.Device, seed uint64, f func(comm *DeviceComm, rng *rand.Rand, algo Algorithm)) {
	forced := DefaultCUDAConfig()
	forced.Algorithm = TwoShot
	for _, cfg := range []Config{DefaultCUDAConfig(), forced} {
		f(newDeviceComm(t, devs, 0, cfg), rand.New(rand.NewPCG(seed, uint64(cfg.Algorithm))), cfg.Algorithm)
	}
}

// TestCUDASumSquares2: the sharded QK-norm's sums of squares summed over
// the ranks, fused and not, against an f64 oracle, the same bits on
// every rank.
func TestCUDASumSquares2(t *testing.T) {
	devs := openGPUs(t)
	eachConfig(t, devs, 5, func(comm *DeviceComm, rng *rand.Rand, algo Algorithm) {
		for _, sh := range [][3]int{{1, 2048, 512}, {7, 100, 36}, {200, 64, 64}} {
			if msg := sumSquaresCase(t, devs, comm, rng, sh[0], sh[1], sh[2], fmt.Sprintf("%s %v", algo, sh)); msg != "" {
				t.Fatal(msg)
			}
		}
	})
}

// sumSquaresCase issues one SumSquares2 on every rank and returns what is
// wrong with its results, or "".
func sumSquaresCase(t *testing.T, devs []*cuda.Device, comm *DeviceComm, rng *rand.Rand, n, wa, wb int, what string) string {
	t.Helper()
	want := make([]float64, 2*n)
	outs := make([]gpu.Buffer, len(devs))
	for r, d := range devs {
		a, b := make([]float32, n*wa), make([]float32, n*wb)
		for i := range a {
			a[i] = float32(rng.NormFloat64())
			want[i/wa] += float64(a[i]) * float64(a[i])
		}
		for i := range b {
			b[i] = float32(rng.NormFloat64() * 3)
			want[n+i/wb] += float64(b[i]) * float64(b[i])
		}
		ab, err := d.Weights(gpu.F32, gpu.F32Bytes(a))
		if err != nil {
			t.Fatal(err)
		}
		bb, err := d.Weights(gpu.F32, gpu.F32Bytes(b))
		if err != nil {
			t.Fatal(err)
		}
		if outs[r], err = d.Alloc(gpu.F32, 2*n); err != nil {
			t.Fatal(err)
		}
		if err := comm.Rank(r).SumSquares2(outs[r], ab, bb, n, wa, wb); err != nil {
			t.Fatalf("%s rank %d: %v", what, r, err)
		}
	}
	var first []float32
	for r, d := range devs {
		got := make([]float32, 2*n)
		if err := d.Read(gpu.F32Bytes(got), outs[r], 0); err != nil {
			t.Fatal(err)
		}
		if r == 0 {
			first = got
			for i, w := range want {
				if math.Abs(float64(got[i])-w) > 1e-5*w {
					return fmt.Sprintf("%s: sum %d is %g, want %g", what, i, got[i], w)
				}
			}
		} else if !slices.Equal(got, first) {
			return fmt.Sprintf("%s: rank %d's sums differ from rank 0's", what, r)
		}
	}
	return ""
}

// TestCUDAFusedBackToBack mixes the fused kernels (whose ranks wait block
// by block) with one- and two-shot all-reduces (which wait for every
// block) of changing grids. The norms and the all-reduces are checked after
// the last call; the sums of squares are read as they come.
func TestCUDAFusedBackToBack(t *testing.T) {
	devs := openGPUs(t)
	comm := newDeviceComm(t, devs, 1<<20, Config{Algorithm: Auto, OneShotMaxBytes: 64 << 10})
	rng := rand.New(rand.NewPCG(9, 9))
	var norms []*normCase
	var plain []call
	for k := range 48 {
		switch k % 3 {
		case 0:
			n := 1 + rng.IntN(40)
			c := newNormCase(t, devs, rng, k%2 == 0, n, 4*(1+rng.IntN(256)), gpu.BF16)
			if err := c.issue(comm); err != nil {
				t.Fatal(err)
			}
			norms = append(norms, c)
		case 1:
			plain = append(plain, issueAllReduce(t, devs, comm, rng, 8+rng.IntN(1<<uint(4+k%14))))
		default:
			if msg := sumSquaresCase(t, devs, comm, rng, 1+rng.IntN(300), 64, 32, fmt.Sprintf("call %d", k)); msg != "" {
				t.Fatal(msg)
			}
		}
	}
	for i, c := range norms {
		c.check(t, devs, fmt.Sprintf("norm %d", i))
	}
	for i, cl := range plain {
		cl.check(t, devs, fmt.Sprintf("all-reduce %d", i))
	}
}

// call is one queued all-reduce of bf16 values.
type call struct {
	ins  [][]byte
	bufs []rankBufs
}

func issueAllReduce(t *testing.T, devs []*cuda.Device, comm *DeviceComm, rng *rand.Rand, n int) call {
	t.Helper()
	cl := call{bufs: allocRanks(t, devs, gpu.BF16, n, false)}
	for r, d := range devs {
		cl.ins = append(cl.ins, gpuInput(rng, gpu.BF16, n))
		if err := d.Write(cl.bufs[r].src, 0, cl.ins[r]); err != nil {
			t.Fatal(err)
		}
	}
	for r := range devs {
		if err := comm.Rank(r).AllReduce(cl.bufs[r].dst, cl.bufs[r].src); err != nil {
			t.Fatal(err)
		}
	}
	return cl
}

func (cl call) check(t *testing.T, devs []*cuda.Device, what string) {
	t.Helper()
	want := make([]byte, len(cl.ins[0]))
	if err := SumReference(gpu.BF16, want, cl.ins); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	for r, d := range devs {
		if err := d.Read(got, cl.bufs[r].dst, 0); err != nil {
			t.Fatal(err)
		}
		if i := diff(gpu.BF16, got, want); i >= 0 {
			t.Fatalf("%s rank %d: element %d differs", what, r, i)
		}
	}
}
