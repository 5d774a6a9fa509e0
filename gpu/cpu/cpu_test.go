package cpu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// lanes are the kernel sets this machine can run: always the portable one,
// and the assembly one where the processor has it.
func lanes() []*kernels {
	return append([]*kernels{genericKernels}, asmKernels()...)
}

func open(t testing.TB, k *kernels, threads int) *Device {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Threads = threads
	d, err := newDevice(cfg, k)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestConformance(t *testing.T) {
	// The large shapes take the float64 reference tens of seconds under
	// the race detector; the small ones still cover every code path.
	// The portable lane runs the same loops over the same blocking, so the
	// large shapes run on the fastest lane only. The pool's splits are the
	// same for every lane: the fastest takes one, two and three threads,
	// the others two.
	large := !testing.Short() && !raceEnabled
	fastest := fastKernels()
	for _, k := range lanes() {
		threadCounts := []int{2}
		if k == fastest {
			threadCounts = []int{1, 2, 3}
		}
		for _, threads := range threadCounts {
			t.Run(fmt.Sprintf("%s/threads=%d", k.name, threads), func(t *testing.T) {
				d := open(t, k, threads)
				caches := []gpu.DType{gpu.F32, gpu.BF16}
				if k == fastest && threads == 2 {
					caches = append(caches, gpu.F16)
				}
				gputest.Run(t, d, gputest.Options{
					Tol:          1e-5,
					CacheDTypes:  caches,
					WeightDTypes: []gpu.DType{gpu.F32, gpu.BF16, gpu.F16},
					Large:        large && threads == 2 && k == fastest,
				})
			})
		}
	}
}

func randF32(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

func randU16(rng *rand.Rand, n int, dt gpu.DType) []uint16 {
	v := make([]uint16, n)
	for i := range v {
		f := float32(rng.NormFloat64())
		if dt == gpu.BF16 {
			v[i] = gpu.F32ToBF16(f)
		} else {
			v[i] = gpu.F32ToF16(f)
		}
	}
	return v
}

func absF32(v []float32) []float32 {
	a := make([]float32, len(v))
	for i, x := range v {
		a[i] = float32(math.Abs(float64(x)))
	}
	return a
}

func absU16(v []uint16) []uint16 {
	a := make([]uint16, len(v))
	for i, x := range v {
		a[i] = x &^ 0x8000
	}
	return a
}

// diff is ‖got−want‖₂/‖scale‖₂, where scale holds the same sums taken over
// absolute values: rounding differences between summation orders are
// relative to it, not to a sum that cancels.
func diff(got, want, scale []float32) float64 {
	var num, den float64
	for i := range want {
		e := float64(got[i]) - float64(want[i])
		num += e * e
		den += float64(scale[i]) * float64(scale[i])
	}
	return math.Sqrt(num / den)
}

// TestKernelsComplete checks that every kernel set fills every kernel.
func TestKernelsComplete(t *testing.T) {
	for _, k := range lanes() {
		v := reflect.ValueOf(*k)
		for i := range v.NumField() {
			if f := v.Field(i); f.Kind() == reflect.Func && f.IsNil() {
				t.Errorf("%s kernels: %s is nil", k.name, v.Type().Field(i).Name)
			}
		}
	}
}

// TestKernelsAgree checks the assembly kernels against the portable ones
// over sizes that exercise every remainder path.
func TestKernelsAgree(t *testing.T) {
	ks := asmKernels()
	if len(ks) == 0 {
		t.Skip("no assembly kernels on this processor")
	}
	for _, fast := range ks {
		t.Run(fast.name, func(t *testing.T) { kernelsAgree(t, fast) })
	}
}

func kernelsAgree(t *testing.T, fast *kernels) {
	rng := rand.New(rand.NewPCG(3, 4))
	const tol = 1e-6
	for _, k := range []int{1, 7, 8, 9, 15, 16, 17, 24, 33, 40, 48, 56, 64, 100, 120, 384} {
		for _, rows := range []int{1, 2, 3, 4, 5, 8, 13} {
			stride := k + rng.IntN(5)
			x := randF32(rng, k)
			wf := randF32(rng, (rows-1)*stride+k)
			got, want, scale := make([]float32, rows), make([]float32, rows), make([]float32, rows)
			fast.gemvF32(got, x, wf, stride, rows, k)
			genericKernels.gemvF32(want, x, wf, stride, rows, k)
			genericKernels.gemvF32(scale, absF32(x), absF32(wf), stride, rows, k)
			if e := diff(got, want, scale); e > tol {
				t.Errorf("gemv f32 k=%d rows=%d: error %.3g", k, rows, e)
			}
			for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
				wh := randU16(rng, (rows-1)*stride+k, dt)
				f, g := fast.gemvBF16, genericKernels.gemvBF16
				if dt == gpu.F16 {
					f, g = fast.gemvF16, genericKernels.gemvF16
				}
				f(got, x, wh, stride, rows, k)
				g(want, x, wh, stride, rows, k)
				g(scale, absF32(x), absU16(wh), stride, rows, k)
				if e := diff(got, want, scale); e > tol {
					t.Errorf("gemv %s k=%d rows=%d: error %.3g", dt, k, rows, e)
				}
			}
			// Two rows of x at once: each the bits of the one-row kernel.
			x1 := randF32(rng, k)
			got1, want1 := make([]float32, rows), make([]float32, rows)
			fast.gemv2F32(got, got1, x, x1, wf, stride, rows, k)
			fast.gemvF32(want, x, wf, stride, rows, k)
			fast.gemvF32(want1, x1, wf, stride, rows, k)
			for r := range rows {
				if got[r] != want[r] || got1[r] != want1[r] {
					t.Fatalf("gemv2 f32 k=%d rows=%d: row %d is %v, %v; alone %v, %v", k, rows, r, got[r], got1[r], want[r], want1[r])
				}
			}
			for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
				wh := randU16(rng, (rows-1)*stride+k, dt)
				two, one := fast.gemv2BF16, fast.gemvBF16
				if dt == gpu.F16 {
					two, one = fast.gemv2F16, fast.gemvF16
				}
				two(got, got1, x, x1, wh, stride, rows, k)
				one(want, x, wh, stride, rows, k)
				one(want1, x1, wh, stride, rows, k)
				for r := range rows {
					if got[r] != want[r] || got1[r] != want1[r] {
						t.Fatalf("gemv2 %s k=%d rows=%d: row %d is %v, %v; alone %v, %v", dt, k, rows, r, got[r], got1[r], want[r], want1[r])
					}
				}
			}
		}
	}
	for _, k := range []int{1, 7, 8, 9, 24, 64, 392} {
		// Weight rows into a strip of 16 (and 13 or 24 query rows into
		// columns), then six rows against n16 strips, written and then
		// added to.
		for _, rows := range []int{16, 13, 24} {
			ws, ds := k+rng.IntN(3), rows+rng.IntN(3)
			w := randF32(rng, (rows-1)*ws+k)
			got, want := make([]float32, (k-1)*ds+rows), make([]float32, (k-1)*ds+rows)
			fast.packT(got, ds, w, ws, rows, k)
			genericKernels.packT(want, ds, w, ws, rows, k)
			for c := range k {
				for j := range rows {
					if got[c*ds+j] != w[j*ws+c] || want[c*ds+j] != w[j*ws+c] {
						t.Fatalf("packT rows=%d k=%d: element (%d, %d) is %v (portable %v), want %v", rows, k, c, j, got[c*ds+j], want[c*ds+j], w[j*ws+c])
					}
				}
			}
		}
		for _, n16 := range []int{1, 2, 3, 5, 6} {
			xs, os := k+rng.IntN(3), 16*n16+rng.IntN(4)
			x, wp := randF32(rng, 5*xs+k), randF32(rng, 16*k*n16)
			for _, add := range []bool{false, true} {
				got, want, scale := randF32(rng, 5*os+16*n16), make([]float32, 5*os+16*n16), make([]float32, 5*os+16*n16)
				copy(want, got)
				scale = absF32(got)
				fast.gemm6x16(got, os, x, xs, wp, k, n16, add)
				genericKernels.gemm6x16(want, os, x, xs, wp, k, n16, add)
				genericKernels.gemm6x16(scale, os, absF32(x), xs, absF32(wp), k, n16, add)
				if e := diff(got, want, scale); e > tol {
					t.Errorf("gemm6x16 k=%d n16=%d add=%v: error %.3g", k, n16, add, e)
				}
			}
		}
	}
	for _, hd := range []int{3, 8, 24, 64, 72, 128, 136} {
		for _, rows := range []int{1, 5, 16} {
			vs := hd + rng.IntN(9)
			v, p := randF32(rng, (rows-1)*vs+hd), randF32(rng, rows)
			got, want := randF32(rng, hd), make([]float32, hd)
			copy(want, got)
			scale := absF32(got)
			fast.accum(got, v, vs, p)
			genericKernels.accum(want, v, vs, p)
			genericKernels.accum(scale, absF32(v), vs, absF32(p))
			if e := diff(got, want, scale); e > tol {
				t.Errorf("accum hd=%d rows=%d: error %.3g", hd, rows, e)
			}
			for _, a := range []struct {
				dt            gpu.DType
				fast, generic func(acc []float32, v []uint16, vstride int, p []float32)
			}{{gpu.BF16, fast.accumBF16, genericKernels.accumBF16}, {gpu.F16, fast.accumF16, genericKernels.accumF16}} {
				vh := randU16(rng, (rows-1)*vs+hd, a.dt)
				copy(got, want)
				scale = absF32(got)
				a.fast(got, vh, vs, p)
				a.generic(want, vh, vs, p)
				a.generic(scale, absU16(vh), vs, absF32(p))
				if e := diff(got, want, scale); e > tol {
					t.Errorf("accum %s hd=%d rows=%d: error %.3g", a.dt, hd, rows, e)
				}
			}
		}
	}
	for _, hd := range []int{3, 8, 24, 64, 72, 128} {
		for _, nk := range []int{1, 3, 4, 7, 16, 65} {
			ks, qs, ss := hd+rng.IntN(9), hd+rng.IntN(3), nk+rng.IntN(3)
			q, kf, kh := randF32(rng, 2*qs+hd), randF32(rng, (nk-1)*ks+hd), randU16(rng, (nk-1)*ks+hd, gpu.BF16)
			got, want, scale := make([]float32, 2*ss+nk), make([]float32, 2*ss+nk), make([]float32, 2*ss+nk)
			fast.dots3F32(got, ss, q, qs, kf, ks, nk, hd)
			genericKernels.dots3F32(want, ss, q, qs, kf, ks, nk, hd)
			genericKernels.dots3F32(scale, ss, absF32(q), qs, absF32(kf), ks, nk, hd)
			if e := diff(got, want, scale); e > tol {
				t.Errorf("dots3 f32 hd=%d nk=%d: error %.3g", hd, nk, e)
			}
			fast.dots3BF16(got, ss, q, qs, kh, ks, nk, hd)
			genericKernels.dots3BF16(want, ss, q, qs, kh, ks, nk, hd)
			genericKernels.dots3BF16(scale, ss, absF32(q), qs, absU16(kh), ks, nk, hd)
			if e := diff(got, want, scale); e > tol {
				t.Errorf("dots3 bf16 hd=%d nk=%d: error %.3g", hd, nk, e)
			}
			// nk value rows into two accumulators.
			as, ps := hd+rng.IntN(3), nk+rng.IntN(3)
			p := randF32(rng, ps+nk)
			vf, vh := randF32(rng, (nk-1)*ks+hd), randU16(rng, (nk-1)*ks+hd, gpu.BF16)
			got, want = randF32(rng, as+hd), make([]float32, as+hd)
			copy(want, got)
			scale = absF32(got)
			fast.accum2F32(got, as, vf, ks, p, ps, nk, hd)
			genericKernels.accum2F32(want, as, vf, ks, p, ps, nk, hd)
			genericKernels.accum2F32(scale, as, absF32(vf), ks, absF32(p), ps, nk, hd)
			if e := diff(got, want, scale); e > tol {
				t.Errorf("accum2 f32 hd=%d rows=%d: error %.3g", hd, nk, e)
			}
			copy(got, want)
			scale = absF32(got)
			fast.accum2BF16(got, as, vh, ks, p, ps, nk, hd)
			genericKernels.accum2BF16(want, as, vh, ks, p, ps, nk, hd)
			genericKernels.accum2BF16(scale, as, absU16(vh), ks, absF32(p), ps, nk, hd)
			if e := diff(got, want, scale); e > tol {
				t.Errorf("accum2 bf16 hd=%d rows=%d: error %.3g", hd, nk, e)
			}
		}
	}
	for _, n := range []int{3, 8, 64, 72} {
		for _, rows := range []int{1, 5} {
			ss := n + rng.IntN(9)
			src := randU16(rng, (rows-1)*ss+n, gpu.BF16)
			got, want := make([]float32, rows*n), make([]float32, rows*n)
			fast.cvtBF16Rows(got, src, ss, rows, n)
			genericKernels.cvtBF16Rows(want, src, ss, rows, n)
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("cvt bf16 rows n=%d rows=%d: element %d is %v, want %v", n, rows, i, got[i], want[i])
				}
			}
		}
	}
	for _, n := range []int{1, 8, 31, 64, 1000} {
		for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
			src := randU16(rng, n, dt)
			got, want := make([]float32, n), make([]float32, n)
			if dt == gpu.BF16 {
				fast.cvtBF16(got, src)
				genericKernels.cvtBF16(want, src)
			} else {
				fast.cvtF16(got, src)
				genericKernels.cvtF16(want, src)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("cvt %s n=%d: element %d is %v, want %v", dt, n, i, got[i], want[i])
				}
			}
		}
		// Softmax arguments reach far below zero; SiLU's span both signs.
		x := randF32(rng, n)
		for i := range x {
			x[i] *= 30
		}
		got, want := append([]float32(nil), x...), append([]float32(nil), x...)
		m := float32(math.Inf(-1))
		for _, v := range x {
			m = max(m, v)
		}
		sg, sw := fast.expShift(got, m), genericKernels.expShift(want, m)
		if e := gputest.RelL2(got, want); e > tol || math.Abs(float64(sg-sw)) > tol*float64(sw) {
			t.Errorf("expShift n=%d: error %.3g, sum %v, want %v", n, e, sg, sw)
		}
		if g, w := fast.max(x), genericKernels.max(x); g != w {
			t.Errorf("max n=%d: got %v, want %v", n, g, w)
		}
		u := randF32(rng, n)
		fast.siluMul(got, x, u)
		genericKernels.siluMul(want, x, u)
		if e := gputest.RelL2(got, want); e > tol {
			t.Errorf("siluMul n=%d: error %.3g", n, e)
		}
		fast.add(got, x, u)
		genericKernels.add(want, x, u)
		if e := gputest.RelL2(got, want); e > tol {
			t.Errorf("add n=%d: error %.3g", n, e)
		}
		c, sn, hg, hw := randF32(rng, n), randF32(rng, n), randF32(rng, n), make([]float32, n)
		copy(hw, hg)
		copy(got, x)
		copy(want, x)
		fast.rotate(got, hg, c, sn)
		genericKernels.rotate(want, hw, c, sn)
		if e := gputest.RelL2(append(got, hg...), append(want, hw...)); e > tol {
			t.Errorf("rotate n=%d: error %.3g", n, e)
		}
		if g, w := fast.sumSq(x), genericKernels.sumSq(x); math.Abs(float64(g-w)) > tol*float64(w) {
			t.Errorf("sumSq n=%d: got %v, want %v", n, g, w)
		}
		fast.scaleMul(got, x, u, 0.3)
		genericKernels.scaleMul(want, x, u, 0.3)
		if e := gputest.RelL2(got, want); e > tol {
			t.Errorf("scaleMul n=%d: error %.3g", n, e)
		}
		v := randF32(rng, n)
		sum, wantSum := fast.sum(v), genericKernels.sum(v)
		if math.Abs(float64(sum-wantSum)) > 1e-4*math.Sqrt(float64(n)) {
			t.Errorf("sum n=%d: got %v, want %v", n, sum, wantSum)
		}
	}
}

func TestExpf(t *testing.T) {
	worst := 0.0
	for x := -87.0; x < 88.7; x += 0.00731 {
		got := float64(expf(float32(x)))
		want := math.Exp(float64(float32(x)))
		worst = math.Max(worst, math.Abs(got-want)/want)
	}
	// A few float32 units in the last place (2⁻²⁴ ≈ 6e-8).
	if worst > 3e-7 {
		t.Errorf("expf: worst relative error %.3g, want <= 3e-7", worst)
	}
	if v := expf(100); !math.IsInf(float64(v), 1) {
		t.Errorf("expf(100) = %v, want +Inf", v)
	}
	if v := expf(-200); v != 0 {
		t.Errorf("expf(-200) = %v, want 0", v)
	}
	if v := expf(float32(math.NaN())); v == v {
		t.Errorf("expf(NaN) = %v, want NaN", v)
	}
}

func TestArgmax(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, k := range lanes() {
		d := open(t, k, 2)
		const n, width = 9, 5000
		v := randF32(rng, n*width)
		want := make([]int32, n)
		for r := range n {
			row := v[r*width : (r+1)*width]
			// A tie for the maximum: the lower index must win.
			a, b := rng.IntN(width/2), width/2+rng.IntN(width/2)
			row[a], row[b] = 10, 10
			want[r] = int32(a)
		}
		logits, _ := d.Alloc(gpu.F32, n*width)
		out, _ := d.Alloc(gpu.I32, n)
		if err := d.Write(logits, 0, gpu.F32Bytes(v)); err != nil {
			t.Fatal(err)
		}
		if err := d.Argmax(out, logits, n, width); err != nil {
			t.Fatal(err)
		}
		got := make([]int32, n)
		if err := d.Read(gpu.I32Bytes(got), out, 0); err != nil {
			t.Fatal(err)
		}
		for r := range n {
			if got[r] != want[r] {
				t.Errorf("%s: row %d: got %d, want %d", k.name, r, got[r], want[r])
			}
		}
	}
}

func TestConfig(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
	for _, c := range []Config{{Threads: -1}, {Threads: maxThreads + 1}, {Spin: -time.Second}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: got no error", c)
		}
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v): got no error", c)
		}
	}
}

func TestClose(t *testing.T) {
	d, err := New(Config{Threads: 3})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := d.Alloc(gpu.F32, 4)
	if err := d.Add(b, b, b, 4); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if err := d.Add(b, b, b, 4); !errors.Is(err, errClosed) {
		t.Errorf("add after close: got %v, want %v", err, errClosed)
	}
	if err := d.Sync(context.Background()); err != nil {
		t.Errorf("sync: %v", err)
	}
}

// TestSampleFewRows: with fewer rows than threads, Sample spreads each
// row's exponentials over the threads in pieces; the tokens are
// gpu.SampleHost's on one thread, for unfiltered, top-k and whole-row
// draws over rows of 100,352 logits.
func TestSampleFewRows(t *testing.T) {
	d := open(t, fastKernels(), 3)
	const width = 100352
	r := rand.New(rand.NewPCG(8, 9))
	v := make([]float32, 2*width)
	for i := range v {
		v[i] = float32(r.NormFloat64() * 2)
	}
	logits, err := d.Alloc(gpu.F32, len(v))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(logits)
	if err := d.Write(logits, 0, gpu.F32Bytes(v)); err != nil {
		t.Fatal(err)
	}
	out, err := d.Alloc(gpu.I32, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(out)
	for _, row := range []gpu.SampleRow{{Temperature: 1}, {Temperature: 0.7, TopK: 40}, {Temperature: 1, TopP: 0.9}, {Temperature: 1.2, MinP: 0.05}} {
		for i := range 5 {
			rows := []gpu.SampleRow{row, row}
			rows[0].U, rows[1].U = r.Float64(), float64(i)/5
			if err := d.Sample(out, logits, 2, width, rows); err != nil {
				t.Fatal(err)
			}
			got := make([]int32, 2)
			if err := d.Read(gpu.I32Bytes(got), out, 0); err != nil {
				t.Fatal(err)
			}
			var sc gpu.SampleScratch
			for k := range 2 {
				want := gpu.SampleHost(append([]float32(nil), v[k*width:(k+1)*width]...), rows[k], &sc)
				if got[k] != want {
					t.Fatalf("%+v row %d: drew %d with the row spread over threads, %d on one", rows[k], k, got[k], want)
				}
			}
		}
	}
}
