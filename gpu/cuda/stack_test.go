//go:build cuda

package cuda

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/gpu/ref"
)

// stackCase is a post-norm decoder's shape for TestStack.
type stackCase struct {
	name                          string
	hidden, heads, kv, hd, f, lay int
}

// stackWeights are one layer's bf16 weights as raw bytes.
type stackWeights struct {
	q, k, v, o, gate, up, down, qn, kn, pa, pf []byte
}

func bf16Rand(r *rand.Rand, n int, scale, mean float64) []byte {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(mean + r.NormFloat64()*scale)
	}
	return gputest.Encode(gpu.BF16, v)
}

// TestStack runs the one-kernel layer stack over steps at several
// positions and checks each against the float64 reference issuing the
// layers' operations one by one (RMSNorm, RoPE, Attention, MatMul,
// SiLUMul, Add): the output residual, and the k and v each step stores
// (within bf16's rounding; the rest of the caches untouched). Steps repeat
// bit for bit, eager and replayed from a graph.
func TestStack(t *testing.T) {
	d := open(t)
	for _, c := range []stackCase{
		{"olmo2-fixture", 256, 2, 2, 128, 512, 3},
		{"demo", 384, 6, 6, 64, 1024, 2},
		{"gqa", 512, 8, 2, 64, 1024, 2},
		{"olmo2-1b-width", 2048, 16, 16, 128, 8192, 2},
	} {
		t.Run(c.name, func(t *testing.T) { testStack(t, d, c) })
	}
}

func testStack(t *testing.T, d *Device, c stackCase) {
	rf := ref.New()
	const bs, nblocks, maxBlocks = 16, 80, 72
	qw, kw, H, F := c.heads*c.hd, c.kv*c.hd, c.hidden, c.f
	r := rand.New(rand.NewPCG(uint64(H), uint64(c.hd)))
	var ws []stackWeights
	for range c.lay {
		ws = append(ws, stackWeights{
			q: bf16Rand(r, qw*H, 1/math.Sqrt(float64(H)), 0), k: bf16Rand(r, kw*H, 1/math.Sqrt(float64(H)), 0),
			v: bf16Rand(r, kw*H, 1/math.Sqrt(float64(H)), 0), o: bf16Rand(r, H*qw, 1/math.Sqrt(float64(qw)), 0),
			gate: bf16Rand(r, F*H, 1/math.Sqrt(float64(H)), 0), up: bf16Rand(r, F*H, 1/math.Sqrt(float64(H)), 0),
			down: bf16Rand(r, H*F, 1/math.Sqrt(float64(F)), 0),
			qn:   bf16Rand(r, qw, 0.2, 1), kn: bf16Rand(r, kw, 0.2, 1), pa: bf16Rand(r, H, 0.2, 1), pf: bf16Rand(r, H, 0.2, 1),
		})
	}
	inv := gputest.InvFreq(c.hd, 10000)
	slotsN := nblocks * bs * kw
	// Both caches start from the same random keys and values.
	initK, initV := bf16Rand(r, slotsN, 1, 0), bf16Rand(r, slotsN, 1, 0)

	// The device's stack.
	var layers []gpu.StackLayer
	var dk, dv []gpu.Buffer
	for _, w := range ws {
		qkv, err := d.Pack(gpu.BF16, w.q, w.k, w.v)
		if err != nil {
			t.Fatal(err)
		}
		gu, err := d.Pack(gpu.BF16, w.gate, w.up)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Free(qkv); d.Free(gu) })
		kc, vc := alloc(t, d, gpu.BF16, slotsN), alloc(t, d, gpu.BF16, slotsN)
		if err := d.Write(kc, 0, initK); err != nil {
			t.Fatal(err)
		}
		if err := d.Write(vc, 0, initV); err != nil {
			t.Fatal(err)
		}
		dk, dv = append(dk, kc), append(dv, vc)
		layers = append(layers, gpu.StackLayer{
			QKV: qkv, O: weights(t, d, gpu.BF16, w.o), GateUp: gu, Down: weights(t, d, gpu.BF16, w.down),
			QNorm: weights(t, d, gpu.BF16, w.qn), KNorm: weights(t, d, gpu.BF16, w.kn),
			PostAttnNorm: weights(t, d, gpu.BF16, w.pa), PostFFNorm: weights(t, d, gpu.BF16, w.pf), K: kc, V: vc,
		})
	}
	spec := gpu.StackSpec{Hidden: H, Heads: c.heads, KVHeads: c.kv, HeadDim: c.hd, Intermediate: F, Eps: 1e-6,
		InvFreq: f32buf(t, d, inv), BlockSize: bs, MaxBlocks: maxBlocks}
	st, err := d.Stack(spec, layers)
	if d.info.Code != codeCubin {
		if err == nil {
			t.Fatal("Stack succeeded without the sm_90a kernels")
		}
		t.Logf("%s: %v (as expected off sm_90)", d.Name(), err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Free() })

	// The block tables: row 0 another sequence's, row 1 this token's,
	// both a shuffle of the cache's blocks.
	perm := r.Perm(nblocks)
	table := make([]int32, 2*maxBlocks)
	for i := range maxBlocks {
		table[i] = int32(perm[(i+7)%nblocks])
		table[maxBlocks+i] = int32(perm[i])
	}
	dx, dpos, dseq, dslot := alloc(t, d, gpu.F32, H), alloc(t, d, gpu.I32, 1), i32buf(t, d, []int32{1}), alloc(t, d, gpu.I32, 1)
	dtab := i32buf(t, d, table)

	// The reference's layers.
	rw := func(b []byte) gpu.Buffer { return weights(t, rf, gpu.BF16, b) }
	type refLayer struct{ q, k, v, o, gate, up, down, qn, kn, pa, pf, kc, vc gpu.Buffer }
	var rl []refLayer
	for _, w := range ws {
		kc, vc := alloc(t, rf, gpu.BF16, slotsN), alloc(t, rf, gpu.BF16, slotsN)
		rl = append(rl, refLayer{rw(w.q), rw(w.k), rw(w.v), rw(w.o), rw(w.gate), rw(w.up), rw(w.down),
			rw(w.qn), rw(w.kn), rw(w.pa), rw(w.pf), kc, vc})
	}
	rx, rq, rk, rv := alloc(t, rf, gpu.F32, H), alloc(t, rf, gpu.F32, qw), alloc(t, rf, gpu.F32, kw), alloc(t, rf, gpu.F32, kw)
	ratt, ro, rg, ru := alloc(t, rf, gpu.F32, qw), alloc(t, rf, gpu.F32, H), alloc(t, rf, gpu.F32, F), alloc(t, rf, gpu.F32, F)
	rpos, rseq, rslot, rtab := alloc(t, rf, gpu.I32, 1), alloc(t, rf, gpu.I32, 1), alloc(t, rf, gpu.I32, 1), alloc(t, rf, gpu.I32, 2*maxBlocks)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(rf.Write(rseq, 0, gpu.I32Bytes([]int32{1})))
	must(rf.Write(rtab, 0, gpu.I32Bytes(table)))
	rinv := f32buf(t, rf, inv)
	attn := gpu.AttnArgs{N: 1, Heads: c.heads, KVHeads: c.kv, HeadDim: c.hd, BlockSize: bs, MaxBlocks: maxBlocks,
		Scale: float32(1 / math.Sqrt(float64(c.hd))), Pos: rpos, Seq: rseq, BlockTable: rtab, Runs: 1}
	// refStep runs the reference's layers, checking each layer's stored k
	// and v against the device's (dkv: each layer's slot rows, k then v)
	// and then attending to the device's, so that a key rounded the other
	// way at a bf16 boundary does not become the residual's difference.
	refStep := func(p int32, slot int, dkv [][2][]byte) {
		for li, l := range rl {
			must(rf.MatMul(rq, rx, l.q, 1, H, qw))
			must(rf.MatMul(rk, rx, l.k, 1, H, kw))
			must(rf.MatMul(rv, rx, l.v, 1, H, kw))
			must(rf.RMSNorm(rq, rq, l.qn, 1, qw, 1e-6))
			must(rf.RMSNorm(rk, rk, l.kn, 1, kw, 1e-6))
			must(rf.RoPE(rq, rpos, rinv, 1, c.heads, c.hd))
			must(rf.RoPE(rk, rpos, rinv, 1, c.kv, c.hd))
			for j, src := range []gpu.Buffer{rk, rv} {
				want := readF32(t, rf, src)
				var rms float64
				for _, v := range want {
					rms += float64(v) * float64(v)
				}
				rms = math.Sqrt(rms / float64(len(want)))
				got := dkv[li][j]
				for e, w := range want {
					g := gpu.BF16ToF32(binary.LittleEndian.Uint16(got[2*e:]))
					if d := math.Abs(float64(g) - float64(w)); d > 8e-3*math.Abs(float64(w))+1e-5*rms {
						t.Fatalf("position %d layer %d: stored %c[%d] = %g, want %g", p, li, "kv"[j], e, g, w)
					}
				}
				cache := []gpu.Buffer{l.kc, l.vc}[j]
				must(rf.Write(cache, slot*kw, got))
			}
			must(rf.Attention(ratt, rq, l.kc, l.vc, attn))
			must(rf.MatMul(ro, ratt, l.o, 1, qw, H))
			must(rf.RMSNorm(ro, ro, l.pa, 1, H, 1e-6))
			must(rf.Add(rx, rx, ro, H))
			must(rf.MatMul(rg, rx, l.gate, 1, H, F))
			must(rf.MatMul(ru, rx, l.up, 1, H, F))
			must(rf.SiLUMul(rg, rg, ru, F))
			must(rf.MatMul(ro, rg, l.down, 1, F, H))
			must(rf.RMSNorm(ro, ro, l.pf, 1, H, 1e-6))
			must(rf.Add(rx, rx, ro, H))
		}
	}
	raw := func(dev gpu.Device, b gpu.Buffer) []byte {
		out := make([]byte, b.Len()*b.DType().Size())
		must(dev.Read(out, b, 0))
		return out
	}

	for i, p := range []int32{0, 1, 63, 64, 300, 1000, 1151} {
		x := randF32(r, H, 1)
		slot := table[maxBlocks+int(p)/bs]*bs + p%bs
		for _, w := range []struct {
			dev gpu.Device
			b   gpu.Buffer
			v   []byte
		}{{d, dx, gpu.F32Bytes(x)}, {d, dpos, gpu.I32Bytes([]int32{p})}, {d, dslot, gpu.I32Bytes([]int32{slot})},
			{rf, rx, gpu.F32Bytes(x)}, {rf, rpos, gpu.I32Bytes([]int32{p})}, {rf, rslot, gpu.I32Bytes([]int32{slot})}} {
			must(w.dev.Write(w.b, 0, w.v))
		}
		if i == 0 {
			// The reference's caches start as the device's.
			for l := range rl {
				must(rf.Write(rl[l].kc, 0, initK))
				must(rf.Write(rl[l].vc, 0, initV))
			}
		}
		must(st.Decode(dx, dpos, dseq, dslot, dtab))
		got := readF32(t, d, dx)
		// The device's caches: unchanged but for the slot's rows.
		lo, hi := 2*int(slot)*kw, 2*(int(slot)+1)*kw
		dkv := make([][2][]byte, len(rl))
		for l := range rl {
			for j, b := range []gpu.Buffer{dk[l], dv[l]} {
				gb, wb := raw(d, b), raw(rf, []gpu.Buffer{rl[l].kc, rl[l].vc}[j])
				if !slices.Equal(gb[:lo], wb[:lo]) || !slices.Equal(gb[hi:], wb[hi:]) {
					t.Fatalf("position %d layer %d: cache %d changed outside slot %d", p, l, j, slot)
				}
				dkv[l][j] = gb[lo:hi]
			}
		}
		refStep(p, int(slot), dkv)
		want := readF32(t, rf, rx)
		if e := gputest.RelL2(got, want); e > 1e-5 || math.IsNaN(e) {
			t.Errorf("position %d: residual relative L2 %.3g against float64 (want ≤ 1e-5)", p, e)
		} else {
			t.Logf("position %d: residual relative L2 %.3g", p, e)
		}
	}

	// A step repeats bit for bit, eager and replayed from a graph (the
	// barrier and the heads' counters are left as found).
	step := func() []float32 {
		must(d.Write(dx, 0, gpu.F32Bytes(randF32(rand.New(rand.NewPCG(1, 2)), H, 1))))
		must(st.Decode(dx, dpos, dseq, dslot, dtab))
		return readF32(t, d, dx)
	}
	first := step()
	if again := step(); !slices.Equal(first, again) {
		t.Fatalf("a repeated step differs: relative L2 %.3g", gputest.RelL2(again, first))
	}
	g, err := d.Capture(func() error { return st.Decode(dx, dpos, dseq, dslot, dtab) })
	must(err)
	defer g.Close()
	for range 3 {
		must(d.Write(dx, 0, gpu.F32Bytes(randF32(rand.New(rand.NewPCG(1, 2)), H, 1))))
		must(g.Launch())
		if got := readF32(t, d, dx); !slices.Equal(first, got) {
			t.Fatalf("a replayed step differs: relative L2 %.3g", gputest.RelL2(got, first))
		}
	}
	must(d.Sync(context.Background()))
}

// TestStackRefuses checks that Stack names what it does not run.
func TestStackRefuses(t *testing.T) {
	d := open(t)
	inv := f32buf(t, d, gputest.InvFreq(128, 10000))
	s := gpu.StackSpec{Hidden: 4096, Heads: 32, KVHeads: 32, HeadDim: 128, Intermediate: 11008, Eps: 1e-6, InvFreq: inv, BlockSize: 16, MaxBlocks: 4}
	if _, err := d.Stack(s, []gpu.StackLayer{{}}); err == nil {
		t.Fatal("Stack took rows wider than its ring slots")
	} else {
		t.Log(err)
	}
	s.Intermediate, s.HeadDim = 8192, 96
	if _, err := d.Stack(s, []gpu.StackLayer{{}}); err == nil {
		t.Fatal("Stack took head dim 96")
	}
	s.HeadDim = 128
	if _, err := d.Stack(s, []gpu.StackLayer{{}}); err == nil {
		t.Fatal("Stack took a layer of nil buffers")
	} else {
		t.Log(err)
	}
}

// BenchmarkStack times the layer stack over OLMo-2-1B's 16 layers (one
// layer's random weights repeated: each layer's 134 MB exceed the L2, so
// every one streams from memory) at a context of 512 tokens. Kernels
// built with -DSK_PROFILE also leave block 0's timestamps, printed as the
// time of each part of a layer, averaged over the layers.
func BenchmarkStack(b *testing.B) {
	d := open(b)
	const H, heads, hd, F, L, bs, nblocks = 2048, 16, 128, 8192, 16, 16, 64
	qw := heads * hd
	r := rand.New(rand.NewPCG(5, 6))
	w := func(n, k int) []byte { return bf16Rand(r, n*k, 1/math.Sqrt(float64(k)), 0) }
	qkv, err := d.Pack(gpu.BF16, w(qw, H), w(qw, H), w(qw, H))
	if err != nil {
		b.Fatal(err)
	}
	gu, err := d.Pack(gpu.BF16, w(F, H), w(F, H))
	if err != nil {
		b.Fatal(err)
	}
	o, down := weights(b, d, gpu.BF16, w(H, qw)), weights(b, d, gpu.BF16, w(H, F))
	qn, kn := weights(b, d, gpu.BF16, bf16Rand(r, qw, 0.2, 1)), weights(b, d, gpu.BF16, bf16Rand(r, qw, 0.2, 1))
	pa, pf := weights(b, d, gpu.BF16, bf16Rand(r, H, 0.2, 1)), weights(b, d, gpu.BF16, bf16Rand(r, H, 0.2, 1))
	var layers []gpu.StackLayer
	for range L {
		kc, vc := alloc(b, d, gpu.BF16, nblocks*bs*qw), alloc(b, d, gpu.BF16, nblocks*bs*qw)
		layers = append(layers, gpu.StackLayer{QKV: qkv, O: o, GateUp: gu, Down: down, QNorm: qn, KNorm: kn, PostAttnNorm: pa, PostFFNorm: pf, K: kc, V: vc})
	}
	spec := gpu.StackSpec{Hidden: H, Heads: heads, KVHeads: heads, HeadDim: hd, Intermediate: F, Eps: 1e-6,
		InvFreq: f32buf(b, d, gputest.InvFreq(hd, 500000)), BlockSize: bs, MaxBlocks: nblocks}
	st, err := d.Stack(spec, layers)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Free()
	table := make([]int32, nblocks)
	for i := range table {
		table[i] = int32(i)
	}
	x := f32buf(b, d, randF32(r, H, 1))
	pos, seq, slot, tab := i32buf(b, d, []int32{512}), i32buf(b, d, []int32{0}), i32buf(b, d, []int32{512}), i32buf(b, d, table)
	const per = 20
	var total time.Duration
	for i := 0; i < b.N; i++ {
		el, err := d.Elapsed(func() error {
			for range per {
				if err := st.Decode(x, pos, seq, slot, tab); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		total += el
	}
	step := total.Seconds() / float64(b.N*per)
	bytes := float64(L) * float64(2*(3*qw*H+H*qw+2*F*H+H*F))
	b.ReportMetric(step*1e6, "µs/step")
	b.ReportMetric(bytes/step/1e9, "GB/s")
	b.ReportMetric(0, "ns/op")

	ls := st.(*layerStack)
	raw := make([]byte, 8*stackProfLen(L))
	if err := d.Read(raw, ls.work, stackProfOff(spec)); err != nil {
		b.Fatal(err)
	}
	ts := make([]uint64, stackProfLen(L))
	for i := range ts {
		ts[i] = binary.LittleEndian.Uint64(raw[8*i:])
	}
	if ts[0] == 0 {
		return // built without SK_PROFILE
	}
	names := []string{"stage q|k|v", "q|k|v", "barrier", "attention", "barrier", "stage o", "o", "barrier",
		"stage gate|up", "gate|up", "barrier", "stage down", "down", "barrier"}
	var sum [14]float64
	for l := range L {
		for j := range 14 {
			prev := ts[l*14+j]
			sum[j] += float64(ts[l*14+j+1]-prev) / 1e3
		}
	}
	for j, nm := range names {
		b.Logf("%-14s %7.2f µs a layer", nm, sum[j]/L)
	}
	b.Logf("after the layers: %.2f µs; the step: %.2f µs", float64(ts[14*L+1]-ts[14*L])/1e3, float64(ts[14*L+1]-ts[0])/1e3)
}
