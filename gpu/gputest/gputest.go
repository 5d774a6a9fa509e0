package gputest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/ref"
)

// Options tune the suite to a lane's precision.
type Options struct {
	// Tol is the largest relative L2 error accepted against the reference.
	Tol float64
	// CacheDTypes are the KV cache element types the device supports.
	CacheDTypes []gpu.DType
	// WeightDTypes are the weight element types the device supports.
	WeightDTypes []gpu.DType
	// Sizes scales the problem sizes: small for slow devices, large to
	// cover multi-block kernels.
	Large bool
	// Attention holds a device's other ways of running Attention (kernels
	// it picks for other shapes), each checked as Attention is. One returns
	// ErrNotApplicable for a shape it does not take.
	Attention map[string]AttentionFunc
}

// AttentionFunc is a way of running gpu.Ops.Attention.
type AttentionFunc func(out, q, kc, vc gpu.Buffer, a gpu.AttnArgs) error

// ErrNotApplicable is an Options.Attention variant's answer to a shape it
// does not take.
var ErrNotApplicable = errors.New("not applicable")

// Run checks every operation of the device returned by open.
func Run(t *testing.T, dev gpu.Device, o Options) {
	if o.Tol == 0 {
		o.Tol = 1e-5
	}
	if len(o.CacheDTypes) == 0 {
		o.CacheDTypes = []gpu.DType{gpu.F32}
	}
	if len(o.WeightDTypes) == 0 {
		o.WeightDTypes = []gpu.DType{gpu.F32, gpu.BF16, gpu.F16}
	}
	h := &harness{t: t, dev: dev, ref: ref.New(), o: o, rng: rand.New(rand.NewPCG(1, 2))}
	t.Run("Embed", h.embed)
	t.Run("MatMul", h.matmul)
	t.Run("RMSNorm", h.rmsnorm)
	t.Run("Elementwise", h.elementwise)
	t.Run("RoPE", h.rope)
	t.Run("Attention", h.attention)
	t.Run("MoE", h.moe)
	t.Run("Sample", h.sample)
	t.Run("SampleFollow", h.sampleFollow)
	t.Run("Errors", h.errors)
}

type harness struct {
	t   *testing.T
	dev gpu.Device
	ref *ref.Device
	o   Options
	rng *rand.Rand
}

// pair holds the same data on the device under test and on the reference.
type pair struct {
	d, r gpu.Buffer
	dt   gpu.DType
	n    int
}

func (h *harness) randF32(n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(h.rng.NormFloat64() * scale)
	}
	return v
}

// Encode converts float32 values to raw bytes of dt (rounding for 16-bit types).
func Encode(dt gpu.DType, v []float32) []byte {
	switch dt {
	case gpu.BF16, gpu.F16:
		u := make([]uint16, len(v))
		for i, x := range v {
			if dt == gpu.BF16 {
				u[i] = gpu.F32ToBF16(x)
			} else {
				u[i] = gpu.F32ToF16(x)
			}
		}
		return append([]byte(nil), gpu.U16Bytes(u)...)
	}
	return append([]byte(nil), gpu.F32Bytes(v)...)
}

func (h *harness) weights(dt gpu.DType, v []float32) pair {
	h.t.Helper()
	raw := Encode(dt, v)
	d, err := h.dev.Weights(dt, raw)
	if err != nil {
		h.t.Fatalf("weights: %v", err)
	}
	r, err := h.ref.Weights(dt, raw)
	if err != nil {
		h.t.Fatal(err)
	}
	return pair{d: d, r: r, dt: dt, n: len(v)}
}

func (h *harness) alloc(dt gpu.DType, n int) pair {
	h.t.Helper()
	d, err := h.dev.Alloc(dt, n)
	if err != nil {
		h.t.Fatalf("alloc %s[%d]: %v", dt, n, err)
	}
	r, _ := h.ref.Alloc(dt, n)
	return pair{d: d, r: r, dt: dt, n: n}
}

func (h *harness) f32(v []float32) pair {
	h.t.Helper()
	p := h.alloc(gpu.F32, len(v))
	h.write(p, gpu.F32Bytes(v))
	return p
}

func (h *harness) i32(v []int32) pair {
	h.t.Helper()
	p := h.alloc(gpu.I32, len(v))
	h.write(p, gpu.I32Bytes(v))
	return p
}

func (h *harness) write(p pair, raw []byte) {
	h.t.Helper()
	if err := h.dev.Write(p.d, 0, raw); err != nil {
		h.t.Fatalf("write: %v", err)
	}
	if err := h.ref.Write(p.r, 0, raw); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) free(ps ...pair) {
	for _, p := range ps {
		h.dev.Free(p.d)
	}
}

func (h *harness) readF32(dev gpu.Device, b gpu.Buffer, n int) []float32 {
	h.t.Helper()
	v := make([]float32, n)
	if err := dev.Read(gpu.F32Bytes(v), b, 0); err != nil {
		h.t.Fatalf("read: %v", err)
	}
	return v
}

// compare checks the device's F32 output against the reference's.
func (h *harness) compare(what string, p pair) {
	h.t.Helper()
	if err := h.dev.Sync(context.Background()); err != nil {
		h.t.Fatalf("%s: sync: %v", what, err)
	}
	got := h.readF32(h.dev, p.d, p.n)
	want := h.readF32(h.ref, p.r, p.n)
	if e := RelL2(got, want); !(e <= h.o.Tol) {
		h.t.Errorf("%s: relative L2 error %.3g, want <= %.3g (got[0:4]=%v want[0:4]=%v)", what, e, h.o.Tol, head(got), head(want))
	}
}

func head(v []float32) []float32 {
	if len(v) > 4 {
		return v[:4]
	}
	return v
}

// RelL2 is ‖got−want‖₂ / ‖want‖₂ (or the absolute norm when want is zero).
func RelL2(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range got {
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

func (h *harness) check(what string, errD, errR error) bool {
	h.t.Helper()
	if errR != nil {
		h.t.Fatalf("%s: reference: %v", what, errR)
	}
	if errD != nil {
		h.t.Errorf("%s: %v", what, errD)
		return false
	}
	return true
}

func (h *harness) embed(t *testing.T) {
	for _, dt := range h.o.WeightDTypes {
		rows, dim, n := 37, 72, 11
		table := h.weights(dt, h.randF32(rows*dim, 1))
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = int32(h.rng.IntN(rows))
		}
		idb := h.i32(ids)
		out := h.alloc(gpu.F32, n*dim)
		what := fmt.Sprintf("embed %s", dt)
		if h.check(what, h.dev.Embed(out.d, table.d, idb.d, n, dim), h.ref.Embed(out.r, table.r, idb.r, n, dim)) {
			h.compare(what, out)
		}
		h.free(table, idb, out)
	}
}

func (h *harness) matmul(t *testing.T) {
	// Few and many rows, k not a multiple of 8 or of 32, tiles cut at
	// every edge; the large shapes also split k.
	shapes := [][3]int{{1, 64, 48}, {1, 384, 1024}, {3, 100, 37}, {7, 256, 130}, {33, 96, 200}, {1, 17, 5},
		{100, 40, 72}, {20, 100, 37}, {130, 72, 136}, {13, 128, 200}, {61, 320, 300}, {65, 128, 300}, {200, 192, 136}}
	if h.o.Large {
		shapes = append(shapes, [3]int{1, 2048, 8192}, [3]int{64, 2048, 2048}, [3]int{512, 1024, 768},
			[3]int{40, 4096, 256}, [3]int{300, 2048, 520})
	}
	for _, dt := range h.o.WeightDTypes {
		for _, s := range shapes {
			n, k, m := s[0], s[1], s[2]
			w := h.weights(dt, h.randF32(m*k, 0.05))
			x := h.f32(h.randF32(n*k, 1))
			out := h.alloc(gpu.F32, n*m)
			what := fmt.Sprintf("matmul %s n=%d k=%d m=%d", dt, n, k, m)
			if h.check(what, h.dev.MatMul(out.d, x.d, w.d, n, k, m), h.ref.MatMul(out.r, x.r, w.r, n, k, m)) {
				h.compare(what, out)
			}
			h.free(w, x, out)
		}
	}
}

func (h *harness) rmsnorm(t *testing.T) {
	for _, dt := range h.o.WeightDTypes {
		for _, s := range [][2]int{{1, 384}, {5, 128}, {9, 13}, {2, 2048}} {
			n, dim := s[0], s[1]
			w := h.weights(dt, h.randF32(dim, 1))
			x := h.f32(h.randF32(n*dim, 3))
			out := h.alloc(gpu.F32, n*dim)
			what := fmt.Sprintf("rmsnorm %s n=%d dim=%d", dt, n, dim)
			if h.check(what, h.dev.RMSNorm(out.d, x.d, w.d, n, dim, 1e-6), h.ref.RMSNorm(out.r, x.r, w.r, n, dim, 1e-6)) {
				h.compare(what, out)
			}
			// In place.
			what += " in place"
			if h.check(what, h.dev.RMSNorm(x.d, x.d, w.d, n, dim, 1e-5), h.ref.RMSNorm(x.r, x.r, w.r, n, dim, 1e-5)) {
				h.compare(what, x)
			}
			h.free(w, x, out)
		}
	}
}

func (h *harness) elementwise(t *testing.T) {
	for _, n := range []int{1, 7, 64, 1000, 4099} {
		a := h.f32(h.randF32(n, 2))
		b := h.f32(h.randF32(n, 2))
		out := h.alloc(gpu.F32, n)
		what := fmt.Sprintf("add n=%d", n)
		if h.check(what, h.dev.Add(out.d, a.d, b.d, n), h.ref.Add(out.r, a.r, b.r, n)) {
			h.compare(what, out)
		}
		what = fmt.Sprintf("add in place n=%d", n)
		if h.check(what, h.dev.Add(a.d, a.d, b.d, n), h.ref.Add(a.r, a.r, b.r, n)) {
			h.compare(what, a)
		}
		what = fmt.Sprintf("silumul n=%d", n)
		if h.check(what, h.dev.SiLUMul(out.d, a.d, b.d, n), h.ref.SiLUMul(out.r, a.r, b.r, n)) {
			h.compare(what, out)
		}
		h.free(a, b, out)
	}
}

// InvFreq returns the default RoPE inverse frequencies for headDim.
func InvFreq(headDim int, theta float64) []float32 {
	f := make([]float32, headDim/2)
	for i := range f {
		f[i] = float32(1 / math.Pow(theta, float64(2*i)/float64(headDim)))
	}
	return f
}

func (h *harness) rope(t *testing.T) {
	for _, s := range [][3]int{{1, 6, 64}, {9, 4, 128}, {3, 2, 32}} {
		n, heads, hd := s[0], s[1], s[2]
		x := h.f32(h.randF32(n*heads*hd, 1))
		pos := make([]int32, n)
		for i := range pos {
			pos[i] = int32(h.rng.IntN(4000))
		}
		p := h.i32(pos)
		f := h.f32(InvFreq(hd, 10000))
		what := fmt.Sprintf("rope n=%d heads=%d dim=%d", n, heads, hd)
		if h.check(what, h.dev.RoPE(x.d, p.d, f.d, n, heads, hd), h.ref.RoPE(x.r, p.r, f.r, n, heads, hd)) {
			h.compare(what, x)
		}
		h.free(x, p, f)
	}
}

func (h *harness) attention(t *testing.T) {
	type cfg struct{ heads, kvHeads, hd, bs int }
	// Block sizes of 16 and 8 and one that is no power of two (12), which
	// kernels may find slots for by another way than a shift.
	cfgs := []cfg{{6, 6, 64, 16}, {4, 2, 64, 8}, {8, 1, 128, 16}, {4, 4, 128, 16}, {6, 2, 128, 12}}
	if len(h.o.Attention) > 0 {
		// More grouped-query shapes for a device's kernel choices: two and
		// four query heads a KV head at the other head dims.
		cfgs = append(cfgs, cfg{8, 4, 128, 16}, cfg{16, 4, 64, 16})
	}
	// Three sequences: a prefill after cached tokens, a decode at position
	// 40 and a decode at position 0. The long prefill makes a step of more
	// than 64 tokens in runs, which backends may run with a prompt kernel.
	// The third batch decodes over long contexts of different lengths, which
	// backends may split over the keys. The last two decode one token a
	// sequence over up to 1,100 keys, so few tokens that backends split
	// each over many blocks (on an H200, 16 to 18 splits for the MHA
	// shapes): a sequence at position 0, one whose last key starts a tile
	// of 64, and longer ones that fill several.
	batches := []struct{ lens, news []int }{
		{[]int{18, 41, 1}, []int{13, 1, 1}},
		{[]int{150, 41, 1}, []int{140, 1, 1}},
		{[]int{700, 130, 1}, []int{1, 2, 1}},
		{[]int{1100, 1}, []int{1, 1}},
		{[]int{513, 1025}, []int{1, 1}},
	}
	if h.o.Large {
		// A decode batch of 48 sequences of 360 to 800 tokens: few splits
		// a sequence, each longer than the stages a kernel keeps in flight.
		lens, news := make([]int, 48), make([]int, 48)
		for i := range lens {
			lens[i], news[i] = 360+h.rng.IntN(441), 1
		}
		news[0] = 2
		batches = append(batches, struct{ lens, news []int }{lens, news})
	}
	for _, cdt := range h.o.CacheDTypes {
		for _, c := range cfgs {
			for _, bat := range batches {
				h.attentionBatch(cdt, c.heads, c.kvHeads, c.hd, c.bs, bat.lens, bat.news)
			}
		}
	}
}

// attentionBatch checks one step: sequence s has lens[s] cached tokens, of
// which the last news[s] are the step's queries.
func (h *harness) attentionBatch(cdt gpu.DType, heads, kvHeads, hd, bs int, lens, news []int) {
	longest := slices.Max(lens)
	maxBlocks := (longest + bs - 1) / bs
	nblocks := len(lens)*maxBlocks + 2
	kw := kvHeads * hd
	kc := h.alloc(cdt, nblocks*bs*kw)
	vc := h.alloc(cdt, nblocks*bs*kw)
	defer h.free(kc, vc)
	// Blocks handed out in a shuffled order.
	perm := h.rng.Perm(nblocks)
	table := make([]int32, len(lens)*maxBlocks)
	for i := range table {
		table[i] = int32(perm[i])
	}
	bt := h.i32(table)
	var pos, seq, slots []int32
	for s, l := range lens {
		for p := 0; p < l; p++ {
			slots = append(slots, table[s*maxBlocks+p/bs]*int32(bs)+int32(p%bs))
		}
	}
	// Fill every cached position.
	nt := len(slots)
	k := h.f32(h.randF32(nt*kw, 1))
	v := h.f32(h.randF32(nt*kw, 1))
	sl := h.i32(slots)
	defer h.free(bt, k, v, sl)
	what := fmt.Sprintf("storekv %s kv=%d", cdt, kvHeads)
	if !h.check(what, h.dev.StoreKV(kc.d, vc.d, k.d, v.d, sl.d, nt, kw), h.ref.StoreKV(kc.r, vc.r, k.r, v.r, sl.r, nt, kw)) {
		return
	}
	runs := 0
	for s, l := range lens {
		runs++
		for p := l - news[s]; p < l; p++ {
			pos = append(pos, int32(p))
			seq = append(seq, int32(s))
		}
	}
	n := len(pos)
	q := h.f32(h.randF32(n*heads*hd, 1))
	out := h.alloc(gpu.F32, n*heads*hd)
	pb, sb := h.i32(pos), h.i32(seq)
	defer h.free(q, out, pb, sb)
	args := func(onDev bool) gpu.AttnArgs {
		a := gpu.AttnArgs{N: n, Heads: heads, KVHeads: kvHeads, HeadDim: hd, BlockSize: bs, MaxBlocks: maxBlocks,
			Scale: float32(1 / math.Sqrt(float64(hd))), Runs: runs}
		if onDev {
			a.Pos, a.Seq, a.BlockTable = pb.d, sb.d, bt.d
		} else {
			a.Pos, a.Seq, a.BlockTable = pb.r, sb.r, bt.r
		}
		return a
	}
	what = fmt.Sprintf("attention %s heads=%d kv=%d dim=%d block=%d tokens=%d", cdt, heads, kvHeads, hd, bs, n)
	if !h.check(what, h.dev.Attention(out.d, q.d, kc.d, vc.d, args(true)), h.ref.Attention(out.r, q.r, kc.r, vc.r, args(false))) {
		return
	}
	h.compare(what, out)
	for _, name := range slices.Sorted(maps.Keys(h.o.Attention)) {
		if err := h.dev.Write(out.d, 0, make([]byte, n*heads*hd*4)); err != nil {
			h.t.Fatalf("write: %v", err)
		}
		err := h.o.Attention[name](out.d, q.d, kc.d, vc.d, args(true))
		if errors.Is(err, ErrNotApplicable) {
			continue
		}
		if h.check(what+" "+name, err, nil) {
			h.compare(what+" "+name, out)
		}
	}
}

func (h *harness) moe(t *testing.T) {
	// Shapes: a few tokens; one token of many experts; many tokens sharing
	// experts (several tiles of one expert, on the tensor cores where the
	// weights are 16-bit and the widths whole 16-byte pieces), and widths
	// that are not; a few tokens of many experts whose choices are not a
	// multiple of four, with widths that are not whole pieces; a few tokens
	// sharing few experts. The routers of up to three tokens repeat each
	// even expert's row in the next, so their logits tie in pairs and the
	// choice must take the lower expert first.
	shapes := []gpu.MoEArgs{
		{N: 5, Dim: 64, Inter: 32, Experts: 8, TopK: 2},
		{N: 1, Dim: 256, Inter: 96, Experts: 128, TopK: 8},
		{N: 300, Dim: 128, Inter: 72, Experts: 4, TopK: 2},
		{N: 37, Dim: 136, Inter: 44, Experts: 16, TopK: 4},
		{N: 23, Dim: 60, Inter: 20, Experts: 4, TopK: 3},
		{N: 2, Dim: 60, Inter: 20, Experts: 16, TopK: 3},
		{N: 3, Dim: 136, Inter: 44, Experts: 32, TopK: 5},
		{N: 6, Dim: 64, Inter: 32, Experts: 4, TopK: 2},
	}
	for _, dt := range h.o.WeightDTypes {
		for j, a := range shapes {
			a.NormTopK = j%2 == 0
			norm := a.NormTopK
			ra := a
			rw := h.randF32(a.Experts*a.Dim, 0.3)
			if a.N <= 3 {
				for e := 0; e+1 < a.Experts; e += 2 {
					copy(rw[(e+1)*a.Dim:(e+2)*a.Dim], rw[e*a.Dim:(e+1)*a.Dim])
				}
			}
			router := h.weights(dt, rw)
			a.Router, ra.Router = router.d, router.r
			var all []pair
			for e := 0; e < a.Experts; e++ {
				g := h.weights(dt, h.randF32(a.Inter*a.Dim, 0.1))
				u := h.weights(dt, h.randF32(a.Inter*a.Dim, 0.1))
				d := h.weights(dt, h.randF32(a.Dim*a.Inter, 0.1))
				a.Gate, a.Up, a.Down = append(a.Gate, g.d), append(a.Up, u.d), append(a.Down, d.d)
				ra.Gate, ra.Up, ra.Down = append(ra.Gate, g.r), append(ra.Up, u.r), append(ra.Down, d.r)
				all = append(all, g, u, d)
			}
			x := h.f32(h.randF32(a.N*a.Dim, 1))
			out := h.alloc(gpu.F32, a.N*a.Dim)
			what := fmt.Sprintf("moe %s norm=%v, %d tokens of width %d, %d experts of %d, top %d", dt, norm, a.N, a.Dim, a.Experts, a.Inter, a.TopK)
			if h.check(what, h.dev.MoE(out.d, x.d, a), h.ref.MoE(out.r, x.r, ra)) {
				h.compare(what, out)
			}
			h.free(append(all, router, x, out)...)
		}
	}
}

// errors checks that bad arguments are refused, not executed.
func (h *harness) errors(t *testing.T) {
	small := h.alloc(gpu.F32, 4)
	w := h.weights(gpu.F32, h.randF32(16, 1))
	ids := h.i32([]int32{0, 9})
	defer h.free(small, w, ids)
	for _, c := range []struct {
		name string
		err  error
	}{
		{"matmul out too short", h.dev.MatMul(small.d, small.d, w.d, 1, 2, 8)},
		{"matmul x too short", h.dev.MatMul(small.d, small.d, w.d, 1, 8, 2)},
		{"embed id out of range", h.dev.Embed(small.d, w.d, ids.d, 2, 2)},
		{"rmsnorm x too short", h.dev.RMSNorm(small.d, small.d, w.d, 2, 4, 1e-6)},
		{"add nil", h.dev.Add(small.d, nil, small.d, 4)},
	} {
		if c.err == nil {
			t.Errorf("%s: got no error", c.name)
		}
	}
}
