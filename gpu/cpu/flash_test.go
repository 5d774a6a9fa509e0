package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/gpu/ref"
)

// TestFlashKernelsAgree checks the assembly blocked-attention kernels
// against the portable ones, over key counts and head sizes that take
// every remainder path.
func TestFlashKernelsAgree(t *testing.T) {
	fast := fastKernels()
	if fast == genericKernels {
		t.Skip("no assembly kernels on this processor")
	}
	rng := rand.New(rand.NewPCG(11, 12))
	const tol = 1e-6
	for _, hd := range []int{1, 8, 16, 24, 40, 64, 128} {
		for _, nk := range []int{1, 3, 4, 5, 9, 64} {
			ks := hd + rng.IntN(9)
			k, qt := randF32(rng, (nk-1)*ks+hd), randF32(rng, hd*flashLanes)
			got, want, scale := make([]float32, nk*flashLanes), make([]float32, nk*flashLanes), make([]float32, nk*flashLanes)
			fast.flashScores(got, k, ks, nk, qt, hd, 0.125)
			genericKernels.flashScores(want, k, ks, nk, qt, hd, 0.125)
			genericKernels.flashScores(scale, absF32(k), ks, nk, absF32(qt), hd, 0.125)
			if e := diff(got, want, scale); e > tol {
				t.Errorf("flash scores hd=%d nk=%d: error %.3g", hd, nk, e)
			}
		}
	}
	for _, nk := range []int{1, 2, 7, 64} {
		// Scores far apart, some masked, and running maxima both unset
		// and set: the softmax's first step and a later one.
		s := randF32(rng, nk*flashLanes)
		for i := range s {
			s[i] *= 20
			if rng.IntN(5) == 0 && i >= flashLanes {
				s[i] = float32(math.Inf(-1))
			}
		}
		for _, first := range []bool{true, false} {
			m, l := make([]float32, flashLanes), make([]float32, flashLanes)
			for i := range m {
				m[i], l[i] = float32(math.Inf(-1)), 0
				if !first {
					m[i], l[i] = float32(rng.NormFloat64()*20), 1+rng.Float32()
				}
			}
			gs, ws := append([]float32(nil), s...), append([]float32(nil), s...)
			gm, wm := append([]float32(nil), m...), append([]float32(nil), m...)
			gl, wl := append([]float32(nil), l...), append([]float32(nil), l...)
			gf, wf := make([]float32, flashLanes), make([]float32, flashLanes)
			fast.flashSoftmax(gs, nk, gm, gl, gf)
			genericKernels.flashSoftmax(ws, nk, wm, wl, wf)
			for _, c := range []struct {
				what      string
				got, want []float32
			}{{"probabilities", gs, ws}, {"maxima", gm, wm}, {"sums", gl, wl}, {"factors", gf, wf}} {
				if e := gputest.RelL2(c.got, c.want); e > tol {
					t.Errorf("flash softmax nk=%d first=%v: %s error %.3g", nk, first, c.what, e)
				}
			}
		}
	}
	for _, hd := range []int{8, 16, 24, 64, 128} {
		for _, nk := range []int{0, 1, 5, 64} {
			vs := hd + rng.IntN(9)
			v, p, f := randF32(rng, max(nk-1, 0)*vs+hd), randF32(rng, nk*flashLanes), randF32(rng, flashLanes)
			hp := (hd + flashDims - 1) / flashDims * flashDims
			got := randF32(rng, flashLanes*hp)
			want, scale := append([]float32(nil), got...), absF32(got)
			fast.flashPV(got, p, nk, v, vs, f, hd)
			genericKernels.flashPV(want, p, nk, v, vs, f, hd)
			genericKernels.flashPV(scale, absF32(p), nk, absF32(v), vs, absF32(f), hd)
			if e := diff(got, want, scale); e > tol {
				t.Errorf("flash pv hd=%d nk=%d: error %.3g", hd, nk, e)
			}
		}
	}
}

// attnSeq is one sequence of an attention batch: its tokens sit at
// positions from..from+n-1, with every earlier position cached.
type attnSeq struct{ from, n int }

// attnCase is an attention batch against the float64 reference.
type attnCase struct {
	heads, kvHeads, hd, bs int
	seqs                   []attnSeq
	adjacent               bool // blocks in order (else shuffled)
}

func (c attnCase) String() string {
	order := "shuffled"
	if c.adjacent {
		order = "adjacent"
	}
	return fmt.Sprintf("heads=%d/kv=%d/hd=%d/bs=%d/%v/%s", c.heads, c.kvHeads, c.hd, c.bs, c.seqs, order)
}

// TestAttentionBlocked covers the blocked prefill path against the float64
// reference: odd head sizes, grouped queries (groups that fill the lanes
// exactly, that leave lanes free and that need more than one pass),
// several sequences in one batch, prefills that start past position 0,
// runs too short for it, F32/BF16/F16 caches, blocks adjacent or not, and
// keys widened ahead of the pass or chunk by chunk.
func TestAttentionBlocked(t *testing.T) {
	mixed := []attnSeq{{0, 37}, {70, 29}, {12, 1}, {3, 5}}
	cases := []attnCase{
		{6, 6, 64, 16, mixed, true},
		{6, 6, 64, 16, mixed, false},
		{4, 2, 64, 8, mixed, false},
		{8, 1, 128, 16, []attnSeq{{0, 9}, {30, 4}}, true},
		{12, 4, 48, 16, []attnSeq{{5, 26}}, false},
		{4, 4, 40, 8, []attnSeq{{0, 50}, {1, 13}}, true},
		{32, 1, 16, 4, []attnSeq{{0, 3}, {20, 2}}, false},
		{5, 1, 24, 16, []attnSeq{{0, 17}, {64, 9}}, true},
		{2, 2, 8, 32, []attnSeq{{0, 131}}, true},
		{3, 3, 64, 12, []attnSeq{{0, 70}, {25, 40}}, false},
	}
	rng := rand.New(rand.NewPCG(13, 14))
	for _, c := range cases {
		for _, cache := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
			for _, kern := range lanes() {
				for _, wide := range []bool{true, false} {
					name := fmt.Sprintf("%s/%s/%s/wide=%v", c, cache, kern.name, wide)
					t.Run(name, func(t *testing.T) {
						d := open(t, kern, 3)
						if !wide {
							d.wideMax = 0
						}
						got, want := runAttention(t, d, c, cache, rng.Uint64())
						if e := gputest.RelL2(got, want); e > 1e-5 {
							t.Errorf("relative L2 error %.3g, want <= 1e-5", e)
						}
					})
				}
			}
		}
	}
}

// runAttention stores random keys and values for every position of c's
// sequences, attends their new tokens on d and on the reference, and
// returns both outputs.
func runAttention(t *testing.T, d gpu.Device, c attnCase, cache gpu.DType, seed uint64) (got, want []float32) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	maxCtx := 0
	for _, s := range c.seqs {
		maxCtx = max(maxCtx, s.from+s.n)
	}
	maxBlocks := (maxCtx + c.bs - 1) / c.bs
	nblocks := len(c.seqs)*maxBlocks + 3
	order := rng.Perm(nblocks)
	if c.adjacent {
		for i := range order {
			order[i] = i
		}
	}
	table := make([]int32, len(c.seqs)*maxBlocks)
	for i := range table {
		table[i] = int32(order[i])
	}
	var slots, pos, seq []int32
	for si, s := range c.seqs {
		for p := range s.from + s.n {
			slots = append(slots, table[si*maxBlocks+p/c.bs]*int32(c.bs)+int32(p%c.bs))
		}
		for p := s.from; p < s.from+s.n; p++ {
			pos, seq = append(pos, int32(p)), append(seq, int32(si))
		}
	}
	kw, n := c.kvHeads*c.hd, len(pos)
	k, v := randF32(rng, len(slots)*kw), randF32(rng, len(slots)*kw)
	q := randF32(rng, n*c.heads*c.hd)
	var outs [2][]float32
	for i, dev := range []gpu.Device{d, ref.New()} {
		buf := func(dt gpu.DType, raw []byte, n int) gpu.Buffer { return devBuf(t, dev, dt, raw, n) }
		kc, vc := buf(cache, nil, nblocks*c.bs*kw), buf(cache, nil, nblocks*c.bs*kw)
		kb, vb := buf(gpu.F32, gpu.F32Bytes(k), len(k)), buf(gpu.F32, gpu.F32Bytes(v), len(v))
		if err := dev.StoreKV(kc, vc, kb, vb, buf(gpu.I32, gpu.I32Bytes(slots), len(slots)), len(slots), kw); err != nil {
			t.Fatal(err)
		}
		out := buf(gpu.F32, nil, n*c.heads*c.hd)
		a := gpu.AttnArgs{N: n, Heads: c.heads, KVHeads: c.kvHeads, HeadDim: c.hd, BlockSize: c.bs, MaxBlocks: maxBlocks,
			Scale: float32(1 / math.Sqrt(float64(c.hd))), Pos: buf(gpu.I32, gpu.I32Bytes(pos), n), Seq: buf(gpu.I32, gpu.I32Bytes(seq), n),
			BlockTable: buf(gpu.I32, gpu.I32Bytes(table), len(table))}
		if err := dev.Attention(out, buf(gpu.F32, gpu.F32Bytes(q), len(q)), kc, vc, a); err != nil {
			t.Fatal(err)
		}
		outs[i] = make([]float32, n*c.heads*c.hd)
		if err := dev.Read(gpu.F32Bytes(outs[i]), out, 0); err != nil {
			t.Fatal(err)
		}
	}
	return outs[0], outs[1]
}
