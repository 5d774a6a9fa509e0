//go:build cuda

package cuda

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/gpu/ref"
)

// readCache reads a cache of f32 or bf16 elements as f32.
func readCache(t *testing.T, d gpu.Device, b gpu.Buffer) []float32 {
	t.Helper()
	size := b.DType().Size()
	raw := make([]byte, b.Len()*size)
	if err := d.Read(raw, b, 0); err != nil {
		t.Fatal(err)
	}
	v := make([]float32, b.Len())
	for i := range v {
		if size == 4 {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		} else {
			v[i] = gpu.BF16ToF32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	}
	return v
}

// TestPrepareQKV checks the fused QK-norm + RoPE + KV store against the
// float64 reference's RMSNorm, RoPE and StoreKV, for each norm and for f32
// and bf16 caches. QKNormSums is checked as a rank's half of rows twice as
// wide, normalised whole by the reference.
func TestPrepareQKV(t *testing.T) {
	d := open(t)
	rf := ref.New()
	const heads, kvheads, hd, slots = 4, 2, 64, 16
	qw, kw := heads*hd, kvheads*hd
	for _, norm := range []gpu.QKNorm{gpu.QKNormNone, gpu.QKNormRow, gpu.QKNormHead, gpu.QKNormSums} {
		for _, cdt := range []gpu.DType{gpu.F32, gpu.BF16} {
			for _, packed := range []bool{false, true} {
				for _, n := range []int{1, 3} {
					pos, slot := []int32{5, 700, 3000}[:n], []int32{7, 0, 12}[:n]
					t.Run(fmt.Sprintf("norm%d/%s/packed=%v/n%d", norm, cdt, packed, n), func(t *testing.T) {
						r := rand.New(rand.NewPCG(uint64(norm), 3))
						qv, kv, vv := randF32(r, n*qw, 1), randF32(r, n*kw, 1), randF32(r, n*kw, 1)
						wq, wk := qw, kw
						if norm == gpu.QKNormHead {
							wq, wk = hd, hd
						}
						qn, kn := gputest.Encode(gpu.BF16, randF32(r, wq, 1)), gputest.Encode(gpu.BF16, randF32(r, wk, 1))
						inv := gputest.InvFreq(hd, 10000)
						a := gpu.QKVArgs{N: n, Heads: heads, KVHeads: kvheads, HeadDim: hd, Norm: norm, Eps: 1e-6}
						// QKNormSums: the other rank's halves of the rows and weights.
						oq, ok, oqn, okn := randF32(r, n*qw, 1), randF32(r, n*kw, 1), randF32(r, qw, 1), randF32(r, kw, 1)
						if norm == gpu.QKNormSums {
							sums := make([]float32, 2*n)
							for i := range n {
								sums[i] = float32(sumSq(qv[i*qw:(i+1)*qw]) + sumSq(oq[i*qw:(i+1)*qw]))
								sums[n+i] = float32(sumSq(kv[i*kw:(i+1)*kw]) + sumSq(ok[i*kw:(i+1)*kw]))
							}
							a.Sums, a.QWidth, a.KWidth = f32buf(t, d, sums), 2*qw, 2*kw
						}

						// Device: q, k and v dense, or as rows of one q|k|v buffer.
						q, k, v, qout := f32buf(t, d, qv), f32buf(t, d, kv), f32buf(t, d, vv), alloc(t, d, gpu.F32, n*qw)
						if packed {
							ld := qw + 2*kw
							rows := make([]float32, n*ld)
							for i := range n {
								copy(rows[i*ld:], qv[i*qw:(i+1)*qw])
								copy(rows[i*ld+qw:], kv[i*kw:(i+1)*kw])
								copy(rows[i*ld+qw+kw:], vv[i*kw:(i+1)*kw])
							}
							all := f32buf(t, d, rows)
							q, k, v = slice(t, d, all, 0, n*ld), slice(t, d, all, qw, n*ld-qw), slice(t, d, all, qw+kw, n*ld-qw-kw)
							a.Stride = ld
						}
						kc, vc := alloc(t, d, cdt, slots*kw), alloc(t, d, cdt, slots*kw)
						var qnb, knb gpu.Buffer
						if norm != gpu.QKNormNone {
							qnb, knb = weights(t, d, gpu.BF16, qn), weights(t, d, gpu.BF16, kn)
						}
						if err := d.PrepareQKV(qout, q, k, v, qnb, knb, i32buf(t, d, pos), f32buf(t, d, inv), kc, vc, i32buf(t, d, slot), a); err != nil {
							t.Fatal(err)
						}

						// Reference: the separate operations in float64.
						ra, rqv, rkv := a, qv, kv
						if norm == gpu.QKNormSums {
							ra.Norm = gpu.QKNormNone
							rqv = wholeRowsNormed(t, rf, qv, oq, qn, oqn, n, qw)
							rkv = wholeRowsNormed(t, rf, kv, ok, kn, okn, n, kw)
						}
						rq, rkc, rvc := prepareRef(t, rf, ra, cdt, slots, rqv, rkv, vv, qn, kn, pos, slot, inv)
						tol := 1e-5
						if cdt == gpu.BF16 {
							tol = 4e-3
						}
						if e := gputest.RelL2(readF32(t, d, qout), rq); e > 1e-5 {
							t.Errorf("q: error %.3g", e)
						}
						if e := gputest.RelL2(readCache(t, d, kc), rkc); e > tol {
							t.Errorf("k cache: error %.3g", e)
						}
						if e := gputest.RelL2(readCache(t, d, vc), rvc); e > tol {
							t.Errorf("v cache: error %.3g", e)
						}
						if got := readF32(t, d, k)[:len(kv)]; !packed && gputest.RelL2(got, kv) != 0 {
							t.Errorf("k changed")
						}
					})
				}
			}
		}
	}
	// A bad slot is skipped and reported; overlapping q and qOut are refused.
	q, kv := alloc(t, d, gpu.F32, qw), alloc(t, d, gpu.F32, kw)
	kc := alloc(t, d, gpu.BF16, slots*kw)
	a := gpu.QKVArgs{N: 1, Heads: heads, KVHeads: kvheads, HeadDim: hd}
	p, inv := i32buf(t, d, []int32{0}), f32buf(t, d, gputest.InvFreq(hd, 10000))
	if err := d.PrepareQKV(q, q, kv, kv, nil, nil, p, inv, kc, kc, i32buf(t, d, []int32{0}), a); err == nil {
		t.Error("qOut aliasing q: no error")
	}
	if err := d.PrepareQKV(alloc(t, d, gpu.F32, qw), q, kv, kv, nil, nil, p, inv, kc, kc, i32buf(t, d, []int32{slots}), a); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(context.Background()); err == nil {
		t.Error("slot outside the cache: no error from Sync")
	}
	// Sums of squares too short, or rows narrower than the slices, are refused.
	qn, kn := alloc(t, d, gpu.BF16, qw), alloc(t, d, gpu.BF16, kw)
	for _, bad := range []gpu.QKVArgs{
		{N: 1, Heads: heads, KVHeads: kvheads, HeadDim: hd, Norm: gpu.QKNormSums, Sums: alloc(t, d, gpu.F32, 1), QWidth: 2 * qw, KWidth: 2 * kw},
		{N: 1, Heads: heads, KVHeads: kvheads, HeadDim: hd, Norm: gpu.QKNormSums, Sums: alloc(t, d, gpu.F32, 2), QWidth: qw - 1, KWidth: kw},
	} {
		if err := d.PrepareQKV(alloc(t, d, gpu.F32, qw), q, kv, kv, qn, kn, p, inv, kc, kc, i32buf(t, d, []int32{0}), bad); err == nil {
			t.Errorf("sums %v, widths %d and %d: no error", bad.Sums, bad.QWidth, bad.KWidth)
		}
	}
}

// prepareRef is PrepareQKV (a's shape and norm, QKNormSums excepted) as the
// float64 reference's separate operations: RMSNorm of q and k ([n, width]
// each) with the 16-bit weights qn and kn, RoPE at pos, and StoreKV of k and
// v into caches of slots slots of type cdt at slot. It returns q and the
// two caches.
func prepareRef(t *testing.T, rf *ref.Device, a gpu.QKVArgs, cdt gpu.DType, slots int, qv, kv, vv []float32, qn, kn []byte, pos, slot []int32, inv []float32) (q, kc, vc []float32) {
	t.Helper()
	n, hd := a.N, a.HeadDim
	qw, kw := a.Heads*hd, a.KVHeads*hd
	hi := func(v []int32) gpu.Buffer {
		b := alloc(t, rf, gpu.I32, len(v))
		if err := rf.Write(b, 0, gpu.I32Bytes(v)); err != nil {
			t.Fatal(err)
		}
		return b
	}
	rq, rk, rv := f32buf(t, rf, qv), f32buf(t, rf, kv), f32buf(t, rf, vv)
	rkc, rvc := alloc(t, rf, cdt, slots*kw), alloc(t, rf, cdt, slots*kw)
	rp := hi(pos)
	errs := []error{}
	switch a.Norm {
	case gpu.QKNormRow:
		errs = append(errs, rf.RMSNorm(rq, rq, weights(t, rf, gpu.BF16, qn), n, qw, a.Eps),
			rf.RMSNorm(rk, rk, weights(t, rf, gpu.BF16, kn), n, kw, a.Eps))
	case gpu.QKNormHead:
		errs = append(errs, rf.RMSNorm(rq, rq, weights(t, rf, gpu.BF16, qn), n*a.Heads, hd, a.Eps),
			rf.RMSNorm(rk, rk, weights(t, rf, gpu.BF16, kn), n*a.KVHeads, hd, a.Eps))
	}
	errs = append(errs, rf.RoPE(rq, rp, f32buf(t, rf, inv), n, a.Heads, hd),
		rf.RoPE(rk, rp, f32buf(t, rf, inv), n, a.KVHeads, hd),
		rf.StoreKV(rkc, rvc, rk, rv, hi(slot), n, kw))
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return readF32(t, rf, rq), readCache(t, rf, rkc), readCache(t, rf, rvc)
}

// TestPrepareQKVParts checks PrepareQKV on a packed q|k|v product whose k
// was split, the parts summed where they are read (qkv_prep_rows): the
// product's rows left in place bit for bit as splitk_sum sums them (a Sync
// between the two operations forces splitk_sum and qkv_prep), and q and
// the caches within f32's and the cache's rounding of that path and of the
// float64 reference. The batches span the exact kernel (6 rows, whose
// parts splitk_sum sums first: few tokens), pairs (12 and 24: ten parts
// at 12) and gemm_stream8 (64); MHA and GQA, head dims 64 and 128.
func TestPrepareQKVParts(t *testing.T) {
	d := open(t)
	rf := ref.New()
	ctx := context.Background()
	const hidden, slots = 1024, 160
	for _, c := range []struct{ n, heads, kvheads, hd int }{{6, 8, 8, 128}, {12, 8, 8, 128}, {24, 16, 4, 64}, {64, 16, 16, 128}, {64, 32, 8, 64}} {
		for _, norm := range []gpu.QKNorm{gpu.QKNormNone, gpu.QKNormRow, gpu.QKNormHead} {
			for _, cdt := range []gpu.DType{gpu.F32, gpu.BF16} {
				n, hd := c.n, c.hd
				qw, kw := c.heads*hd, c.kvheads*hd
				ld := qw + 2*kw
				t.Run(fmt.Sprintf("n%d/h%d-%d/hd%d/norm%d/%s", n, c.heads, c.kvheads, hd, norm, cdt), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(n*hd), uint64(norm)))
					xv, wv := randF32(r, n*hidden, 1), gputest.Encode(gpu.BF16, randF32(r, ld*hidden, 0.05))
					wq, wk := qw, kw
					if norm == gpu.QKNormHead {
						wq, wk = hd, hd
					}
					qn, kn := gputest.Encode(gpu.BF16, randF32(r, wq, 1)), gputest.Encode(gpu.BF16, randF32(r, wk, 1))
					inv := gputest.InvFreq(hd, 10000)
					pos, slot := make([]int32, n), make([]int32, n)
					for i := range n {
						pos[i], slot[i] = int32(r.IntN(4000)), int32((7*i+3)%slots)
					}
					a := gpu.QKVArgs{N: n, Heads: c.heads, KVHeads: c.kvheads, HeadDim: hd, Norm: norm, Eps: 1e-6, Stride: ld}
					run := func(sync bool) (rows, q, kc, vc []float32) {
						all, qout := alloc(t, d, gpu.F32, n*ld), alloc(t, d, gpu.F32, n*qw)
						if err := d.MatMul(all, f32buf(t, d, xv), weights(t, d, gpu.BF16, wv), n, hidden, ld); err != nil {
							t.Fatal(err)
						}
						if sync {
							if err := d.Sync(ctx); err != nil {
								t.Fatal(err)
							}
						}
						var qnb, knb gpu.Buffer
						if norm != gpu.QKNormNone {
							qnb, knb = weights(t, d, gpu.BF16, qn), weights(t, d, gpu.BF16, kn)
						}
						kcb, vcb := alloc(t, d, cdt, slots*kw), alloc(t, d, cdt, slots*kw)
						err := d.PrepareQKV(qout, slice(t, d, all, 0, n*ld), slice(t, d, all, qw, n*ld-qw), slice(t, d, all, qw+kw, n*ld-qw-kw),
							qnb, knb, i32buf(t, d, pos), f32buf(t, d, inv), kcb, vcb, i32buf(t, d, slot), a)
						if err != nil {
							t.Fatal(err)
						}
						return readF32(t, d, all), readF32(t, d, qout), readCache(t, d, kcb), readCache(t, d, vcb)
					}
					rows, q, kc, vc := run(false)
					rows1, q1, kc1, vc1 := run(true)
					if !slices.Equal(rows, rows1) {
						t.Errorf("the product's rows differ from splitk_sum's")
					}
					tol := 1e-6
					if cdt == gpu.BF16 {
						tol = 4e-3
					}
					for _, e := range []struct {
						what      string
						got, want []float32
						tol       float64
					}{{"q", q, q1, 1e-6}, {"k cache", kc, kc1, tol}, {"v cache", vc, vc1, 0}} {
						if err := gputest.RelL2(e.got, e.want); err > e.tol {
							t.Errorf("%s: error %.3g against splitk_sum and qkv_prep", e.what, err)
						}
					}
					// The reference, from the product's rows as the device summed them.
					qv, kv, vv := make([]float32, n*qw), make([]float32, n*kw), make([]float32, n*kw)
					for i := range n {
						copy(qv[i*qw:], rows[i*ld:i*ld+qw])
						copy(kv[i*kw:], rows[i*ld+qw:i*ld+qw+kw])
						copy(vv[i*kw:], rows[i*ld+qw+kw:(i+1)*ld])
					}
					rq, rkc, rvc := prepareRef(t, rf, a, cdt, slots, qv, kv, vv, qn, kn, pos, slot, inv)
					if e := gputest.RelL2(q, rq); e > 1e-5 {
						t.Errorf("q: error %.3g against the reference", e)
					}
					if cdt == gpu.F32 {
						tol = 1e-5
					}
					if e := gputest.RelL2(kc, rkc); e > tol {
						t.Errorf("k cache: error %.3g against the reference", e)
					}
					if e := gputest.RelL2(vc, rvc); e > tol {
						t.Errorf("v cache: error %.3g against the reference", e)
					}
				})
			}
		}
	}
}

func sumSq(v []float32) float64 {
	s := 0.0
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return s
}

// wholeRowsNormed normalises rows [mine | other] ([n, 2w]) with weights
// [w16 | other weights] on the reference and returns the first half of
// each row.
func wholeRowsNormed(t *testing.T, rf *ref.Device, mine, other []float32, w16 []byte, ow []float32, n, w int) []float32 {
	t.Helper()
	rows := make([]float32, 2*n*w)
	for i := range n {
		copy(rows[2*i*w:], mine[i*w:(i+1)*w])
		copy(rows[(2*i+1)*w:], other[i*w:(i+1)*w])
	}
	ws := append(append([]byte{}, w16...), gputest.Encode(gpu.BF16, ow)...)
	b := f32buf(t, rf, rows)
	if err := rf.RMSNorm(b, b, weights(t, rf, gpu.BF16, ws), n, 2*w, 1e-6); err != nil {
		t.Fatal(err)
	}
	all, out := readF32(t, rf, b), make([]float32, n*w)
	for i := range n {
		copy(out[i*w:], all[2*i*w:(2*i+1)*w])
	}
	return out
}

// TestSiLUMatMul checks the down projection with SiLU folded in against the
// float64 reference's SiLUMul then MatMul: one row on the fused GEMV (bf16,
// k a multiple of 256), decode batches on the tensor-core product fed by
// silu_rows, and the fallback (f32 weights, odd shapes, 2 to 8 rows).
func TestSiLUMatMul(t *testing.T) {
	d := open(t)
	rf := ref.New()
	for _, c := range []struct {
		dt      gpu.DType
		n, k, m int
		tol     float64
	}{
		{gpu.BF16, 1, 8192, 2048, 1e-5}, {gpu.BF16, 1, 512, 100, 1e-5}, {gpu.BF16, 1, 20, 33, 1e-5},
		{gpu.F32, 1, 8192, 64, 1e-5}, {gpu.F32, 3, 24, 40, 1e-5}, {gpu.BF16, 5, 512, 100, 1e-5},
		{gpu.BF16, 1, 5504, 256, 1e-5}, // k not a multiple of 256 (OLMo-2-7B's down projection over two ranks)
		// Up to 32 rows the tensor cores also take the remainder of x's
		// rounding; more round x to bf16 (f16).
		{gpu.BF16, 17, 512, 300, 1e-5}, {gpu.BF16, 32, 2048, 512, 1e-5}, {gpu.F16, 12, 576, 200, 1e-5},
		{gpu.BF16, 64, 8192, 2048, 1e-2}, {gpu.F16, 40, 264, 96, 1e-2},
	} {
		t.Run(fmt.Sprintf("%s/%dx%dx%d", c.dt, c.n, c.m, c.k), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(c.k), uint64(c.m*c.n)))
			gu, wv := randF32(r, 2*c.n*c.k, 2), randF32(r, c.m*c.k, 0.05)
			raw := gputest.Encode(c.dt, wv)
			out := alloc(t, d, gpu.F32, c.n*c.m)
			if err := d.SiLUMatMul(out, f32buf(t, d, gu), weights(t, d, c.dt, raw), c.n, c.k, c.m); err != nil {
				t.Fatal(err)
			}
			g, u := make([]float32, c.n*c.k), make([]float32, c.n*c.k)
			for i := range c.n {
				copy(g[i*c.k:], gu[2*i*c.k:(2*i+1)*c.k])
				copy(u[i*c.k:], gu[(2*i+1)*c.k:(2*i+2)*c.k])
			}
			rg, ru := alloc(t, rf, gpu.F32, c.n*c.k), alloc(t, rf, gpu.F32, c.n*c.k)
			_ = rf.Write(rg, 0, gpu.F32Bytes(g))
			_ = rf.Write(ru, 0, gpu.F32Bytes(u))
			ro := alloc(t, rf, gpu.F32, c.n*c.m)
			if err := rf.SiLUMul(rg, rg, ru, c.n*c.k); err != nil {
				t.Fatal(err)
			}
			if err := rf.MatMul(ro, rg, weights(t, rf, c.dt, raw), c.n, c.k, c.m); err != nil {
				t.Fatal(err)
			}
			if e := gputest.RelL2(readF32(t, d, out), readF32(t, rf, ro)); e > c.tol {
				t.Errorf("error %.3g, want at most %.0e", e, c.tol)
			}
		})
	}
}

// TestGatedMatVec checks silu(gate)*up formed in the gate|up product
// against the f64 reference's MatMul and SiLUMul, on the OLMo-2 shapes
// (1B, 7B and 7B over two ranks), a short k, and the weights and k that
// take the fallback.
func TestGatedMatVec(t *testing.T) {
	d := open(t)
	rf := ref.New()
	for _, c := range []struct {
		dt   gpu.DType
		k, f int
	}{
		{gpu.BF16, 2048, 8192}, {gpu.BF16, 4096, 11008}, {gpu.BF16, 4096, 5504}, {gpu.BF16, 24, 40},
		{gpu.BF16, 20, 33}, {gpu.F32, 64, 48}, {gpu.F16, 264, 96},
	} {
		t.Run(fmt.Sprintf("%s/%dx%d", c.dt, c.f, c.k), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(c.k), uint64(c.f)))
			x, wv := randF32(r, c.k, 1), randF32(r, 2*c.f*c.k, 0.05)
			raw := gputest.Encode(c.dt, wv)
			out := alloc(t, d, gpu.F32, c.f)
			if err := d.GatedMatVec(out, f32buf(t, d, x), weights(t, d, c.dt, raw), c.k, c.f); err != nil {
				t.Fatal(err)
			}
			gu := alloc(t, rf, gpu.F32, 2*c.f)
			if err := rf.MatMul(gu, f32buf(t, rf, x), weights(t, rf, c.dt, raw), 1, c.k, 2*c.f); err != nil {
				t.Fatal(err)
			}
			g, u := make([]float32, c.f), make([]float32, c.f)
			all := readF32(t, rf, gu)
			copy(g, all[:c.f])
			copy(u, all[c.f:])
			rg, ru := f32buf(t, rf, g), f32buf(t, rf, u)
			if err := rf.SiLUMul(rg, rg, ru, c.f); err != nil {
				t.Fatal(err)
			}
			if e := gputest.RelL2(readF32(t, d, out), readF32(t, rf, rg)); e > 1e-5 {
				t.Errorf("error %.3g, want at most 1e-5", e)
			}
		})
	}
	// Lengths are checked before the GPU sees them.
	if err := d.GatedMatVec(alloc(t, d, gpu.F32, 8), alloc(t, d, gpu.F32, 16), alloc(t, d, gpu.BF16, 2*8*16-1), 16, 8); err == nil {
		t.Error("a short w was accepted")
	}
}

// TestGatedMLP checks a gated MLP's two products against the f64
// reference's MatMul, SiLUMul and MatMul: on gemm_stream8g (OLMo-2-1B's
// widths at 33 and 64 rows, bf16, and a narrower f16 one), where gu stays
// as it was and the result is MatMul then SiLUMatMul's within the
// approximate silu's error (tanh.approx), and otherwise through gu (or the split parts of its
// product) as MatMul then SiLUMatMul run it, bit for bit.
func TestGatedMLP(t *testing.T) {
	d := open(t)
	rf := ref.New()
	for _, c := range []struct {
		dt         gpu.DType
		n, k, f, m int
		tol        float64
	}{
		{gpu.BF16, 64, 2048, 8192, 2048, 1e-2}, {gpu.BF16, 33, 2048, 8192, 2048, 1e-2}, {gpu.F16, 40, 1024, 4480, 512, 1e-2},
		{gpu.BF16, 64, 2048, 2048, 2048, 1e-2}, {gpu.BF16, 64, 2048, 8200, 512, 1e-2}, {gpu.BF16, 17, 512, 300, 256, 1e-2},
		{gpu.BF16, 1, 2048, 8192, 2048, 1e-5}, {gpu.F32, 3, 24, 40, 16, 1e-5}, {gpu.BF16, 40, 24, 40, 16, 1e-2},
	} {
		t.Run(fmt.Sprintf("%s/%dx%dx%dx%d", c.dt, c.n, c.k, c.f, c.m), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(c.k*c.n), uint64(c.f+c.m)))
			x, wgu, wd := randF32(r, c.n*c.k, 1), randF32(r, 2*c.f*c.k, 0.05), randF32(r, c.m*c.f, 0.05)
			rawGU, rawD := gputest.Encode(c.dt, wgu), gputest.Encode(c.dt, wd)
			gateUp, down := weights(t, d, c.dt, rawGU), weights(t, d, c.dt, rawD)
			sentinel := make([]float32, 2*c.n*c.f)
			for i := range sentinel {
				sentinel[i] = float32(i % 977)
			}
			xb, gu, out := f32buf(t, d, x), f32buf(t, d, sentinel), alloc(t, d, gpu.F32, c.n*c.m)
			// The gated product's scratch, dropped: it is there afterwards
			// only if gemm_stream8g ran.
			glu := gluScratch(c.dt)
			if b := d.scratch[glu]; b != nil {
				d.retired = append(d.retired, b)
				delete(d.scratch, glu)
			}
			if err := d.GatedMLP(out, gu, xb, gateUp, down, c.n, c.k, c.f, c.m); err != nil {
				t.Fatal(err)
			}
			got := readF32(t, d, out)

			// The reference: gate|up, silu(gate)*up, down.
			rgu := alloc(t, rf, gpu.F32, 2*c.n*c.f)
			if err := rf.MatMul(rgu, f32buf(t, rf, x), weights(t, rf, c.dt, rawGU), c.n, c.k, 2*c.f); err != nil {
				t.Fatal(err)
			}
			all := readF32(t, rf, rgu)
			g, u := make([]float32, c.n*c.f), make([]float32, c.n*c.f)
			for i := range c.n {
				copy(g[i*c.f:], all[2*i*c.f:(2*i+1)*c.f])
				copy(u[i*c.f:], all[(2*i+1)*c.f:(2*i+2)*c.f])
			}
			rg, ru, ro := f32buf(t, rf, g), f32buf(t, rf, u), alloc(t, rf, gpu.F32, c.n*c.m)
			if err := rf.SiLUMul(rg, rg, ru, c.n*c.f); err != nil {
				t.Fatal(err)
			}
			if err := rf.MatMul(ro, rg, weights(t, rf, c.dt, rawD), c.n, c.f, c.m); err != nil {
				t.Fatal(err)
			}
			if e := gputest.RelL2(got, readF32(t, rf, ro)); e > c.tol {
				t.Errorf("error %.3g against the reference, want at most %.0e", e, c.tol)
			}

			streamed := c.dt != gpu.F32 && d.k("gemm_stream8g_"+suffix(c.dt)) != nil && d.info.Code == codeCubin &&
				streamsGated(c.n, c.k, c.f, d.info.SMs)
			if ran := d.scratch[glu] != nil; ran != streamed {
				t.Errorf("gemm_stream8g ran: %v, want %v", ran, streamed)
			}
			if left := readF32(t, d, gu); streamed && !slices.Equal(left, sentinel) {
				t.Error("gu was written, want it left as it was (the gate|up product on gemm_stream8g)")
			}
			// The same sums as the gate|up product, then SiLUMatMul.
			gu2, out2 := alloc(t, d, gpu.F32, 2*c.n*c.f), alloc(t, d, gpu.F32, c.n*c.m)
			if err := d.MatMul(gu2, xb, gateUp, c.n, c.k, 2*c.f); err != nil {
				t.Fatal(err)
			}
			if err := d.SiLUMatMul(out2, gu2, down, c.n, c.f, c.m); err != nil {
				t.Fatal(err)
			}
			want := readF32(t, d, out2)
			if e := gputest.RelL2(got, want); streamed && e > 1e-3 || !streamed && !slices.Equal(got, want) {
				t.Errorf("differs from MatMul then SiLUMatMul: error %.3g", e)
			}
		})
	}
	// Lengths are checked before the GPU sees them.
	if err := d.GatedMLP(alloc(t, d, gpu.F32, 64*16), alloc(t, d, gpu.F32, 2*64*64), alloc(t, d, gpu.F32, 64*64),
		alloc(t, d, gpu.BF16, 2*64*64-1), alloc(t, d, gpu.BF16, 16*64), 64, 64, 64, 16); err == nil {
		t.Error("a short gateUp was accepted")
	}
}

// TestPostNormMatVec checks a post-norm's new residual formed inside the
// one-token product that reads it (plain and gated) against the float64
// reference's RMSNorm, Add and MatMul (SiLUMul): the fused kernels at the
// OLMo-2-1B and 7B widths and odd ones, and through the plain operations
// where no fused kernel takes the shape or the types. r and y stay as
// they were; overlapping outputs and short buffers are refused.
func TestPostNormMatVec(t *testing.T) {
	d := open(t)
	rf := ref.New()
	const eps = 1e-6
	for _, c := range []struct {
		dt, nd gpu.DType // the product's weights, the norm's
		k, m   int
		glu    bool
	}{
		{gpu.BF16, gpu.BF16, 2048, 6144, false}, {gpu.BF16, gpu.BF16, 2048, 8192, true}, {gpu.BF16, gpu.F32, 2048, 8192, true},
		{gpu.BF16, gpu.BF16, 4096, 12288, false}, {gpu.BF16, gpu.F32, 4096, 11008, true}, {gpu.BF16, gpu.BF16, 24, 40, false},
		{gpu.BF16, gpu.BF16, 264, 33, true}, {gpu.BF16, gpu.F16, 256, 40, false}, {gpu.BF16, gpu.BF16, 20, 12, false},
		{gpu.F32, gpu.F32, 64, 48, false}, {gpu.F16, gpu.F16, 264, 96, true},
	} {
		t.Run(fmt.Sprintf("%s/%s/%dx%d/glu=%v", c.dt, c.nd, c.m, c.k, c.glu), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(c.k), uint64(c.m)))
			rows := c.m
			if c.glu {
				rows = 2 * c.m
			}
			fast := c.dt == gpu.BF16 && c.nd != gpu.F16 && c.k%8 == 0
			if kern, _ := d.gemvKernel(postKind(c.glu), c.k, rows); fast && kern == nil {
				t.Error("no fused kernel takes the shape")
			}
			res, y, wn := randF32(r, c.k, 1), randF32(r, c.k, 3), randF32(r, c.k, 1)
			raw, rawN := gputest.Encode(c.dt, randF32(r, rows*c.k, 0.05)), gputest.Encode(c.nd, wn)
			out, rOut := alloc(t, d, gpu.F32, c.m), alloc(t, d, gpu.F32, c.k)
			rb, yb := f32buf(t, d, res), f32buf(t, d, y)
			if err := d.PostNormMatVec(out, rOut, rb, yb, weights(t, d, c.nd, rawN), weights(t, d, c.dt, raw), c.k, c.m, c.glu, eps); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(readF32(t, d, rb), res) || !slices.Equal(readF32(t, d, yb), y) {
				t.Error("r or y changed")
			}
			// The reference: r + rmsnorm(y)·wn, then the product.
			nr, ny := f32buf(t, rf, res), alloc(t, rf, gpu.F32, c.k)
			if err := rf.RMSNorm(ny, f32buf(t, rf, y), weights(t, rf, c.nd, rawN), 1, c.k, eps); err != nil {
				t.Fatal(err)
			}
			if err := rf.Add(nr, nr, ny, c.k); err != nil {
				t.Fatal(err)
			}
			prod := alloc(t, rf, gpu.F32, rows)
			if err := rf.MatMul(prod, nr, weights(t, rf, c.dt, raw), 1, c.k, rows); err != nil {
				t.Fatal(err)
			}
			want := readF32(t, rf, prod)
			if c.glu {
				g, u := f32buf(t, rf, want[:c.m]), f32buf(t, rf, want[c.m:])
				if err := rf.SiLUMul(g, g, u, c.m); err != nil {
					t.Fatal(err)
				}
				want = readF32(t, rf, g)
			}
			if e := gputest.RelL2(readF32(t, d, rOut), readF32(t, rf, nr)); e > 1e-6 {
				t.Errorf("residual: error %.3g, want at most 1e-6", e)
			}
			if e := gputest.RelL2(readF32(t, d, out), want); e > 1e-5 {
				t.Errorf("product: error %.3g, want at most 1e-5", e)
			}
		})
	}
	// Checked before the GPU sees them.
	k, m := 64, 16
	rb, yb, wn, w := alloc(t, d, gpu.F32, k), alloc(t, d, gpu.F32, k), alloc(t, d, gpu.BF16, k), alloc(t, d, gpu.BF16, m*k)
	if err := d.PostNormMatVec(alloc(t, d, gpu.F32, m), rb, rb, yb, wn, w, k, m, false, eps); err == nil {
		t.Error("rOut overlapping r was accepted")
	}
	if err := d.PostNormMatVec(yb, alloc(t, d, gpu.F32, k), rb, yb, wn, alloc(t, d, gpu.BF16, k*k), k, k, false, eps); err == nil {
		t.Error("out overlapping y was accepted")
	}
	if err := d.PostNormMatVec(alloc(t, d, gpu.F32, m), alloc(t, d, gpu.F32, k), rb, yb, wn, w, k, m, true, eps); err == nil {
		t.Error("a short gate|up w was accepted")
	}
}

// TestSplitSums checks, on decode batches whose products split k, the
// norms' rows and their rounding (or pairs) that the next product reads,
// and the sums of a split gate|up product taken by the gated MLP's
// activation: bit for bit the same as round_x, split_x and splitk_sum,
// which a Sync between the operations forces, and within bf16's rounding
// of the f64 reference. The batches span the exact kernel (6 rows), pairs
// (24), gemm_skinny (40) and gemm_stream8 (64).
func TestSplitSums(t *testing.T) {
	d := open(t)
	rf := ref.New()
	ctx := context.Background()
	const k, f = 2048, 1024
	for _, c := range []struct{ n, m int }{{6, 2048}, {24, 2048}, {40, 1536}, {64, 2048}} {
		n, m := c.n, c.m
		r := rand.New(rand.NewPCG(uint64(n), 7))
		wo, w2 := gputest.Encode(gpu.BF16, randF32(r, m*k, 0.05)), gputest.Encode(gpu.BF16, randF32(r, m*m, 0.05))
		wgu, wd := gputest.Encode(gpu.BF16, randF32(r, 2*f*m, 0.05)), gputest.Encode(gpu.BF16, randF32(r, m*f, 0.05))
		nw := gputest.Encode(gpu.BF16, randF32(r, m, 1))
		x, res := randF32(r, n*k, 1), randF32(r, n*m, 1)
		for mode, name := range []string{"rmsnorm", "addrmsnorm", "rmsnormadd"} {
			t.Run(fmt.Sprintf("%s/n%d/m%d", name, n, m), func(t *testing.T) {
				// run returns the norm's rows (out, or r) and the next
				// product of them; sync puts a Sync after each operation.
				run := func(dev gpu.Device, sync bool) (rows, z []float32) {
					y, out, rr, zb := alloc(t, dev, gpu.F32, n*m), alloc(t, dev, gpu.F32, n*m), f32buf(t, dev, res), alloc(t, dev, gpu.F32, n*m)
					w := weights(t, dev, gpu.BF16, nw)
					step := func(err error) {
						t.Helper()
						if err != nil {
							t.Fatal(err)
						}
						if sync {
							if err := dev.Sync(ctx); err != nil {
								t.Fatal(err)
							}
						}
					}
					step(dev.MatMul(y, f32buf(t, dev, x), weights(t, dev, gpu.BF16, wo), n, k, m))
					rn, fused := dev.(gpu.ResidualNormer)
					next := out
					switch {
					case mode == 0:
						step(dev.RMSNorm(out, y, w, n, m, 1e-6))
					case mode == 1 && fused:
						step(rn.AddRMSNorm(out, rr, y, w, n, m, 1e-6))
					case mode == 1: // the reference: the same in plain operations
						step(dev.Add(rr, rr, y, n*m))
						step(dev.RMSNorm(out, rr, w, n, m, 1e-6))
					case fused:
						step(rn.RMSNormAdd(rr, y, w, n, m, 1e-6))
						next = rr
					default:
						step(dev.RMSNorm(out, y, w, n, m, 1e-6))
						step(dev.Add(rr, rr, out, n*m))
						next = rr
					}
					step(dev.MatMul(zb, next, weights(t, dev, gpu.BF16, w2), n, m, m))
					return readF32(t, dev, next), readF32(t, dev, zb)
				}
				rows, z := run(d, false)
				rows1, z1 := run(d, true)
				if !slices.Equal(rows, rows1) || !slices.Equal(z, z1) {
					t.Errorf("the norm's rounded rows or the product after it differ from round_x's")
				}
				rows2, z2 := run(rf, false)
				if e := gputest.RelL2(rows, rows2); e > 1e-2 {
					t.Errorf("norm: error %.3g against the reference", e)
				}
				if e := gputest.RelL2(z, z2); e > 1e-2 {
					t.Errorf("next product: error %.3g against the reference", e)
				}
			})
		}
		t.Run(fmt.Sprintf("silu/n%d/m%d", n, m), func(t *testing.T) {
			run := func(sync bool) []float32 {
				gu, out := alloc(t, d, gpu.F32, 2*n*f), alloc(t, d, gpu.F32, n*m)
				if err := d.MatMul(gu, f32buf(t, d, x[:n*m]), weights(t, d, gpu.BF16, wgu), n, m, 2*f); err != nil {
					t.Fatal(err)
				}
				if sync {
					if err := d.Sync(ctx); err != nil {
						t.Fatal(err)
					}
				}
				if err := d.SiLUMatMul(out, gu, weights(t, d, gpu.BF16, wd), n, f, m); err != nil {
					t.Fatal(err)
				}
				return readF32(t, d, out)
			}
			if a, b := run(false), run(true); !slices.Equal(a, b) {
				t.Errorf("sums taken by silu_rows differ from splitk_sum's")
			}
		})
	}
}

// TestHeadMatVec checks the LM head with the step's last residual update
// and final norm folded in against the float64 reference, and its argmax
// against the host's over the logits it stored: ties to the lowest index,
// NaNs skipped, the blocks' counter left zero from call to call.
func TestHeadMatVec(t *testing.T) {
	d := open(t)
	rf := ref.New()
	const eps = 1e-5
	for _, c := range []struct {
		dt, nd gpu.DType // the head's weights, the norms'
		k, m   int
		post   bool // a post-norm on y (OLMo 2); else r + y
		ties   string
	}{
		{gpu.BF16, gpu.BF16, 2048, 100352, true, ""}, {gpu.BF16, gpu.F32, 4096, 32000, false, ""},
		{gpu.BF16, gpu.BF16, 1024, 151936, false, ""}, {gpu.BF16, gpu.BF16, 2048, 4096, true, "equal"},
		{gpu.BF16, gpu.BF16, 2048, 4096, true, "nan"}, {gpu.BF16, gpu.BF16, 24, 40, true, ""},
		{gpu.BF16, gpu.BF16, 264, 33, false, ""}, {gpu.BF16, gpu.F16, 256, 40, true, ""},
		{gpu.BF16, gpu.BF16, 20, 12, true, ""}, {gpu.F32, gpu.F32, 64, 48, false, ""},
	} {
		t.Run(fmt.Sprintf("%s/%s/%dx%d/post=%v/%s", c.dt, c.nd, c.m, c.k, c.post, c.ties), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(c.k), uint64(c.m)))
			fast := c.dt == gpu.BF16 && c.nd != gpu.F16 && c.k%8 == 0
			if kern, _ := d.gemvKernel("bf16_head", c.k, c.m); fast && kern == nil {
				t.Error("no fused kernel takes the shape")
			}
			res, y := randF32(r, c.k, 1), randF32(r, c.k, 3)
			wv := randF32(r, c.m*c.k, 0.05)
			switch c.ties {
			case "equal": // every row the same: every logit ties, 0 wins
				for i := 1; i < c.m; i++ {
					copy(wv[i*c.k:(i+1)*c.k], wv[:c.k])
				}
			case "nan": // row 0 gives NaN, the rest tie: 1 wins
				for i := 2; i < c.m; i++ {
					copy(wv[i*c.k:(i+1)*c.k], wv[c.k:2*c.k])
				}
				wv[3] = float32(math.NaN())
			}
			raw := gputest.Encode(c.dt, wv)
			rawF := gputest.Encode(c.nd, randF32(r, c.k, 1))
			var rawN []byte
			var wn gpu.Buffer
			if c.post {
				rawN = gputest.Encode(c.nd, randF32(r, c.k, 1))
				wn = weights(t, d, c.nd, rawN)
			}
			out, next := alloc(t, d, gpu.F32, c.m), alloc(t, d, gpu.I32, 1)
			rb, yb, wf, w := f32buf(t, d, res), f32buf(t, d, y), weights(t, d, c.nd, rawF), weights(t, d, c.dt, raw)
			// The reference: x = rmsnorm(r + u)·wf, u = rmsnorm(y)·wn or y.
			nr, u := f32buf(t, rf, res), f32buf(t, rf, y)
			if c.post {
				if err := rf.RMSNorm(u, u, weights(t, rf, c.nd, rawN), 1, c.k, eps); err != nil {
					t.Fatal(err)
				}
			}
			if err := rf.Add(nr, nr, u, c.k); err != nil {
				t.Fatal(err)
			}
			if err := rf.RMSNorm(nr, nr, weights(t, rf, c.nd, rawF), 1, c.k, eps); err != nil {
				t.Fatal(err)
			}
			prod := alloc(t, rf, gpu.F32, c.m)
			if err := rf.MatMul(prod, nr, weights(t, rf, c.dt, raw), 1, c.k, c.m); err != nil {
				t.Fatal(err)
			}
			want := readF32(t, rf, prod)
			for call := range 3 {
				nb := next
				if call == 1 {
					nb = nil // the logits alone
				}
				if err := d.HeadMatVec(out, nb, rb, yb, wn, wf, w, c.k, c.m, eps); err != nil {
					t.Fatal(err)
				}
				got, lo := readF32(t, d, out), 0
				if c.ties == "nan" {
					if lo = 1; !math.IsNaN(float64(got[0])) {
						t.Errorf("call %d: logit 0 is %g, want NaN", call, got[0])
					}
				}
				if e := gputest.RelL2(got[lo:], want[lo:]); !(e <= 1e-5) {
					t.Errorf("call %d: logits: error %.3g, want at most 1e-5", call, e)
				}
				if nb == nil {
					continue
				}
				best := make([]int32, 1)
				if err := d.Read(gpu.I32Bytes(best), next, 0); err != nil {
					t.Fatal(err)
				}
				host := hostArgmax(got)
				if best[0] != host {
					t.Errorf("call %d: argmax %d, the host's over the same logits %d", call, best[0], host)
				}
				if w := map[string]int32{"equal": 0, "nan": 1}[c.ties]; c.ties != "" && best[0] != w {
					t.Errorf("call %d: argmax %d, want %d", call, best[0], w)
				}
			}
			if !slices.Equal(readF32(t, d, rb), res) || !slices.Equal(readF32(t, d, yb), y) {
				t.Error("r or y changed")
			}
		})
	}
	// Checked before the GPU sees them.
	k, m := 64, 16
	rb, yb, wf, w := alloc(t, d, gpu.F32, k), alloc(t, d, gpu.F32, k), alloc(t, d, gpu.BF16, k), alloc(t, d, gpu.BF16, m*k)
	if err := d.HeadMatVec(yb, nil, rb, yb, nil, wf, alloc(t, d, gpu.BF16, k*k), k, k, eps); err == nil {
		t.Error("out overlapping y was accepted")
	}
	out := alloc(t, d, gpu.F32, m)
	if err := d.HeadMatVec(out, out, rb, yb, nil, wf, w, k, m, eps); err == nil {
		t.Error("next overlapping out was accepted")
	}
	if err := d.HeadMatVec(out, alloc(t, d, gpu.F32, 1), rb, yb, nil, wf, w, k, m, eps); err == nil {
		t.Error("an f32 next was accepted")
	}
	if err := d.HeadMatVec(out, nil, rb, yb, nil, wf, w, k, m+1, eps); err == nil {
		t.Error("a short w was accepted")
	}
}

// hostArgmax is the index of the largest of v, the lowest among equals,
// NaNs skipped (0 when every value is NaN), as the device's argmax.
func hostArgmax(v []float32) int32 {
	best := -1
	for i, x := range v {
		if !math.IsNaN(float64(x)) && (best < 0 || x > v[best]) {
			best = i
		}
	}
	return int32(max(best, 0))
}
