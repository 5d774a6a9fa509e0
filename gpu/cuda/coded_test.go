//go:build cuda

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/gpu/ref"
)

// codedWeights is rows × k random bf16 weights with escapes the code must
// put back (zeros, outliers, values too small for any window), on d with
// their twin in the 12-bit code, and the same weights on d without one.
func codedWeights(t *testing.T, d *Device, r *rand.Rand, rows, k int) (raw []byte, coded, plain gpu.Buffer) {
	t.Helper()
	wv := randF32(r, rows*k, 0.05)
	for i := 0; i < len(wv); i += 1 + r.IntN(3*k) {
		switch i % 3 {
		case 0:
			wv[i] = 0
		case 1:
			wv[i] = 40 * float32(1-2*(i%2))
		default:
			wv[i] = 1e-12
		}
	}
	raw = gputest.Encode(gpu.BF16, wv)
	coded, plain = weights(t, d, gpu.BF16, raw), weights(t, d, gpu.BF16, raw)
	ok, err := d.Code(coded, rows, k, raw)
	if err != nil || !ok {
		t.Fatalf("code %d × %d: %v, %v", rows, k, ok, err)
	}
	if c := coded.(*Buffer).coded; c == nil || c.cap == 0 {
		t.Fatalf("code %d × %d: no escapes", rows, k)
	}
	return raw, coded, plain
}

// TestCodedProducts checks the one-token products over weights in the
// 12-bit code (plain, gated, after a post-norm, and an LM head with its
// argmax) against the float64 reference and against the same products
// over the bf16 weights, for every k the coded kernels take.
func TestCodedProducts(t *testing.T) {
	codedProducts(t, open(t))
}

func codedProducts(t *testing.T, d *Device) {
	rf := ref.New()
	const eps = 1e-6
	for _, c := range []struct{ k, m int }{{512, 96}, {1024, 200}, {2048, 6144}, {3072, 300}, {4096, 1000}, {8192, 2048}} {
		t.Run(fmt.Sprintf("%dx%d", c.m, c.k), func(t *testing.T) {
			if _, _, ok := d.codedShape(c.k); !ok {
				t.Fatal("no coded kernel takes the shape")
			}
			r := rand.New(rand.NewPCG(uint64(c.k), uint64(c.m)))
			x := randF32(r, c.k, 1)
			xb, xr := f32buf(t, d, x), f32buf(t, rf, x)
			// Plain: MatMul of one row.
			raw, cw, pw := codedWeights(t, d, r, c.m, c.k)
			got, bf := alloc(t, d, gpu.F32, c.m), alloc(t, d, gpu.F32, c.m)
			if err := d.MatMul(got, xb, cw, 1, c.k, c.m); err != nil {
				t.Fatal(err)
			}
			if err := d.MatMul(bf, xb, pw, 1, c.k, c.m); err != nil {
				t.Fatal(err)
			}
			want := alloc(t, rf, gpu.F32, c.m)
			if err := rf.MatMul(want, xr, weights(t, rf, gpu.BF16, raw), 1, c.k, c.m); err != nil {
				t.Fatal(err)
			}
			codedAgrees(t, "matmul", readF32(t, d, got), readF32(t, d, bf), readF32(t, rf, want))
			// Gated: silu(gate)·up of 2m rows.
			raw, cw, pw = codedWeights(t, d, r, 2*c.m, c.k)
			if err := d.GatedMatVec(got, xb, cw, c.k, c.m); err != nil {
				t.Fatal(err)
			}
			if err := d.GatedMatVec(bf, xb, pw, c.k, c.m); err != nil {
				t.Fatal(err)
			}
			codedAgrees(t, "gated", readF32(t, d, got), readF32(t, d, bf), refGated(t, rf, xr, raw, c.k, c.m))
			// After a post-norm, plain and gated.
			res, y := randF32(r, c.k, 1), randF32(r, c.k, 3)
			rawN := gputest.Encode(gpu.BF16, randF32(r, c.k, 1))
			rb, yb, wn, rOut := f32buf(t, d, res), f32buf(t, d, y), weights(t, d, gpu.BF16, rawN), alloc(t, d, gpu.F32, c.k)
			nr, ny := f32buf(t, rf, res), alloc(t, rf, gpu.F32, c.k)
			if err := rf.RMSNorm(ny, f32buf(t, rf, y), weights(t, rf, gpu.BF16, rawN), 1, c.k, eps); err != nil {
				t.Fatal(err)
			}
			if err := rf.Add(nr, nr, ny, c.k); err != nil {
				t.Fatal(err)
			}
			for _, glu := range []bool{false, true} {
				rows := c.m
				if glu {
					rows = 2 * c.m
				}
				raw, cw, pw := codedWeights(t, d, r, rows, c.k)
				if err := d.PostNormMatVec(got, rOut, rb, yb, wn, cw, c.k, c.m, glu, eps); err != nil {
					t.Fatal(err)
				}
				if e := gputest.RelL2(readF32(t, d, rOut), readF32(t, rf, nr)); e > 1e-6 {
					t.Errorf("post-norm residual: error %.3g, want at most 1e-6", e)
				}
				if err := d.PostNormMatVec(bf, rOut, rb, yb, wn, pw, c.k, c.m, glu, eps); err != nil {
					t.Fatal(err)
				}
				var want []float32
				if glu {
					want = refGated(t, rf, nr, raw, c.k, c.m)
				} else {
					p := alloc(t, rf, gpu.F32, c.m)
					if err := rf.MatMul(p, nr, weights(t, rf, gpu.BF16, raw), 1, c.k, c.m); err != nil {
						t.Fatal(err)
					}
					want = readF32(t, rf, p)
				}
				codedAgrees(t, fmt.Sprintf("post-norm glu=%v", glu), readF32(t, d, got), readF32(t, d, bf), want)
			}
		})
	}
	t.Run("head", func(t *testing.T) {
		const k, m = 2048, 100352
		r := rand.New(rand.NewPCG(k, m))
		res, y := randF32(r, k, 1), randF32(r, k, 3)
		rawN, rawF := gputest.Encode(gpu.BF16, randF32(r, k, 1)), gputest.Encode(gpu.BF16, randF32(r, k, 1))
		raw, cw, pw := codedWeights(t, d, r, m, k)
		rb, yb, wn, wf := f32buf(t, d, res), f32buf(t, d, y), weights(t, d, gpu.BF16, rawN), weights(t, d, gpu.BF16, rawF)
		got, bf, next := alloc(t, d, gpu.F32, m), alloc(t, d, gpu.F32, m), alloc(t, d, gpu.I32, 1)
		if err := d.HeadMatVec(got, next, rb, yb, wn, wf, cw, k, m, eps); err != nil {
			t.Fatal(err)
		}
		if err := d.HeadMatVec(bf, nil, rb, yb, wn, wf, pw, k, m, eps); err != nil {
			t.Fatal(err)
		}
		nr, u := f32buf(t, rf, res), f32buf(t, rf, y)
		if err := rf.RMSNorm(u, u, weights(t, rf, gpu.BF16, rawN), 1, k, eps); err != nil {
			t.Fatal(err)
		}
		if err := rf.Add(nr, nr, u, k); err != nil {
			t.Fatal(err)
		}
		if err := rf.RMSNorm(nr, nr, weights(t, rf, gpu.BF16, rawF), 1, k, eps); err != nil {
			t.Fatal(err)
		}
		p := alloc(t, rf, gpu.F32, m)
		if err := rf.MatMul(p, nr, weights(t, rf, gpu.BF16, raw), 1, k, m); err != nil {
			t.Fatal(err)
		}
		logits := readF32(t, d, got)
		codedAgrees(t, "head", logits, readF32(t, d, bf), readF32(t, rf, p))
		// Without the argmax the coded head gives the same logits.
		if err := d.HeadMatVec(got, nil, rb, yb, wn, wf, cw, k, m, eps); err != nil {
			t.Fatal(err)
		}
		if plain := readF32(t, d, got); !slices.Equal(plain, logits) {
			t.Errorf("coded head without the argmax: logits differ from those with it")
		}
		best := make([]int32, 1)
		if err := d.Read(gpu.I32Bytes(best), next, 0); err != nil {
			t.Fatal(err)
		}
		if host := hostArgmax(logits); best[0] != host {
			t.Errorf("argmax %d, the host's over the same logits %d", best[0], host)
		}
	})
}

// refGated is the reference's silu(gate)·up of x and 2m rows of raw.
func refGated(t *testing.T, rf gpu.Device, x gpu.Buffer, raw []byte, k, m int) []float32 {
	t.Helper()
	gu := alloc(t, rf, gpu.F32, 2*m)
	if err := rf.MatMul(gu, x, weights(t, rf, gpu.BF16, raw), 1, k, 2*m); err != nil {
		t.Fatal(err)
	}
	all := readF32(t, rf, gu)
	g, u := f32buf(t, rf, all[:m]), f32buf(t, rf, all[m:])
	if err := rf.SiLUMul(g, g, u, m); err != nil {
		t.Fatal(err)
	}
	return readF32(t, rf, g)
}

// codedAgrees checks a coded product against the float64 reference as
// the bf16 kernels are checked, and against the bf16 kernel's own result
// to within f32 rounding (the sums run in another order, and the escapes last).
func codedAgrees(t *testing.T, what string, got, bf16, want []float32) {
	t.Helper()
	for i, v := range got {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("%s: output %d is %g", what, i, v)
		}
	}
	if e := gputest.RelL2(got, want); !(e <= 1e-5) {
		t.Errorf("%s: error %.3g against the reference, want at most 1e-5", what, e)
	}
	if e := gputest.RelL2(got, bf16); !(e <= 1e-5) {
		t.Errorf("%s: error %.3g against the bf16 kernel, want at most 1e-5", what, e)
	}
}
