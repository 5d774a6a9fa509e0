//go:build amd64 && !purego

package cpu

import "golang.org/x/sys/cpu"

// hasAVX2 and hasAVX512 report, once at start-up, which assembly kernels
// can run (x/sys/cpu reports AVX-512 only where the OS saves its registers).
var (
	hasAVX2   = cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C
	hasAVX512 = hasAVX2 && cpu.X86.HasAVX512F
)

// asmKernels returns the assembly kernel sets this processor runs, the
// fastest last.
func asmKernels() []*kernels {
	switch {
	case hasAVX512:
		return []*kernels{avx2Kernels, avx512Kernels}
	case hasAVX2:
		return []*kernels{avx2Kernels}
	}
	return nil
}

// avx512Kernels are avx2Kernels with the products on 512-bit registers
// (kernels512_amd64.s): the prompt's GEMM, bound by the FMAs, and the
// GEMVs, which read weights the caches hold faster with half the
// instructions.
var avx512Kernels = func() *kernels {
	k := *avx2Kernels
	k.name = "avx512"
	k.gemm6x16 = gemm6x16Asm512
	return k.withGEMVs(gemvKernels{gemvF32AVX512, gemvBF16AVX512, gemvF16AVX512, gemv2F32AVX512, gemv2BF16AVX512, gemv2F16AVX512})
}()

// gemvKernels are a kernel set's GEMVs in assembly, for f32, bf16 and f16
// weights: one row of x, and two.
type gemvKernels struct {
	f32           func(out, x, w *float32, stride, rows, k8 int)
	bf16, f16     func(out, x *float32, w *uint16, stride, rows, k8 int)
	f32x2         func(out0, out1, x0, x1, w *float32, stride, pairs, k8 int)
	bf16x2, f16x2 func(out0, out1, x0, x1 *float32, w *uint16, stride, pairs, k8 int)
}

// withGEMVs sets k's GEMVs to g's kernels (the columns past the last
// multiple of 8 by the portable ones) and returns k. A two-row GEMV takes
// the rows of whole groups of four two at a time and the rest through k's
// one-row GEMV, so that each row gets the bits the one-row GEMV gives it.
func (k *kernels) withGEMVs(g gemvKernels) *kernels {
	k.gemvF32 = func(out, x, w []float32, stride, rows, n int) { gemvAsm(g.f32, gemvF32Go, out, x, w, stride, rows, n) }
	k.gemvBF16 = func(out, x []float32, w []uint16, stride, rows, n int) {
		gemvAsm(g.bf16, gemvBF16Go, out, x, w, stride, rows, n)
	}
	k.gemvF16 = func(out, x []float32, w []uint16, stride, rows, n int) {
		gemvAsm(g.f16, gemvF16Go, out, x, w, stride, rows, n)
	}
	k.gemv2F32 = func(out0, out1, x0, x1, w []float32, stride, rows, n int) {
		gemv2Asm(g.f32x2, k.gemvF32, gemvF32Go, out0, out1, x0, x1, w, stride, rows, n)
	}
	k.gemv2BF16 = func(out0, out1, x0, x1 []float32, w []uint16, stride, rows, n int) {
		gemv2Asm(g.bf16x2, k.gemvBF16, gemvBF16Go, out0, out1, x0, x1, w, stride, rows, n)
	}
	k.gemv2F16 = func(out0, out1, x0, x1 []float32, w []uint16, stride, rows, n int) {
		gemv2Asm(g.f16x2, k.gemvF16, gemvF16Go, out0, out1, x0, x1, w, stride, rows, n)
	}
	return k
}

var avx2Kernels = (&kernels{
	name:         "avx2",
	gemm6x16:     gemm6x16Asm,
	packT:        packTAsm,
	accum:        accumAsm(accumF32AVX2, accumGo),
	accumBF16:    accumAsm(accumBF16AVX2, accumBF16Go),
	accumF16:     accumAsm(accumF16AVX2, accumF16Go),
	dots3F32:     dots3F32Asm,
	dots3BF16:    dots3BF16Asm,
	accum2F32:    accum2F32Asm,
	accum2BF16:   accum2BF16Asm,
	max:          maxAsm,
	flashScores:  flashScoresAsm,
	flashSoftmax: flashSoftmaxAsm,
	flashPV:      flashPVAsm,
	expShift:     expShiftAsm,
	siluMul:      siluMulAsm,
	cvtBF16Rows:  cvtBF16RowsAsm,
	cvtBF16:      cvtBF16Asm,
	cvtF16:       cvtF16Asm,
	sum:          sumAsm,
	add:          addAsm,
	rotate:       rotateAsm,
	sumSq:        sumSqAsm,
	scaleMul:     scaleMulAsm,
}).withGEMVs(gemvKernels{gemvF32AVX2, gemvBF16AVX2, gemvF16AVX2, gemv2F32AVX2, gemv2BF16AVX2, gemv2F16AVX2})

//go:noescape
func gemvF32AVX2(out, x, w *float32, stride, rows, k8 int)

//go:noescape
func gemv2F32AVX2(out0, out1, x0, x1, w *float32, stride, pairs, k8 int)

//go:noescape
func gemvBF16AVX2(out, x *float32, w *uint16, stride, rows, k8 int)

//go:noescape
func gemv2BF16AVX2(out0, out1, x0, x1 *float32, w *uint16, stride, pairs, k8 int)

//go:noescape
func gemvF16AVX2(out, x *float32, w *uint16, stride, rows, k8 int)

//go:noescape
func gemv2F16AVX2(out0, out1, x0, x1 *float32, w *uint16, stride, pairs, k8 int)

//go:noescape
func accumF32AVX2(acc, v *float32, vstride int, p *float32, rows, hd8 int)

//go:noescape
func accumBF16AVX2(acc *float32, v *uint16, vstride int, p *float32, rows, hd8 int)

//go:noescape
func accumF16AVX2(acc *float32, v *uint16, vstride int, p *float32, rows, hd8 int)

//go:noescape
func dots3F32AVX2(s *float32, sstride int, q *float32, qstride int, k *float32, kstride int, nk4 int, hd8 int)

//go:noescape
func dots3BF16AVX2(s *float32, sstride int, q *float32, qstride int, k *uint16, kstride int, nk4 int, hd8 int)

//go:noescape
func accum2F32AVX2(acc *float32, astride int, v *float32, vstride int, p *float32, pstride int, rows int, hd8 int)

//go:noescape
func accum2BF16AVX2(acc *float32, astride int, v *uint16, vstride int, p *float32, pstride int, rows int, hd8 int)

//go:noescape
func gemm6x16AVX2(out *float32, ostride int, x *float32, xstride int, wp *float32, k int, n16 int, add int)

//go:noescape
func gemvF32AVX512(out, x, w *float32, stride, rows, k8 int)

//go:noescape
func gemv2F32AVX512(out0, out1, x0, x1, w *float32, stride, pairs, k8 int)

//go:noescape
func gemvBF16AVX512(out, x *float32, w *uint16, stride, rows, k8 int)

//go:noescape
func gemv2BF16AVX512(out0, out1, x0, x1 *float32, w *uint16, stride, pairs, k8 int)

//go:noescape
func gemvF16AVX512(out, x *float32, w *uint16, stride, rows, k8 int)

//go:noescape
func gemv2F16AVX512(out0, out1, x0, x1 *float32, w *uint16, stride, pairs, k8 int)

//go:noescape
func gemm6x16AVX512(out *float32, ostride int, x *float32, xstride int, wp *float32, k int, n16 int, add int)

//go:noescape
func packTAVX2(dst *float32, dstride int, src *float32, sstride int, k8 int, groups int)

//go:noescape
func sumSqF32AVX2(p *float32, n8 int) float32

//go:noescape
func scaleMulAVX2(o, x, w *float32, s float32, n8 int)

//go:noescape
func addF32AVX2(o, x, y *float32, n8 int)

//go:noescape
func rotateAVX2(lo, hi, cos, sin *float32, n8 int)

//go:noescape
func flashScoresAVX2(s *float32, k *float32, kstride int, nk int, qt *float32, hd int, scale float32)

//go:noescape
func flashSoftmaxAVX2(s *float32, nk int, m, l, f *float32)

//go:noescape
func flashPVAVX2(o *float32, p *float32, nk int, v *float32, vstride int, f *float32, hd16 int)

//go:noescape
func maxF32AVX2(s *float32, n8 int) float32

//go:noescape
func expShiftAVX2(s *float32, n8 int, m float32) float32

//go:noescape
func siluMulAVX2(out, gate, up *float32, n8 int)

//go:noescape
func cvtBF16AVX2(dst *float32, src *uint16, n8 int)

//go:noescape
func cvtBF16RowsAVX2(dst *float32, src *uint16, sstride, rows, n8 int)

//go:noescape
func cvtF16AVX2(dst *float32, src *uint16, n8 int)

//go:noescape
func sumF32AVX2(p *float32, n32 int) float32

// checkGEMV panics unless the slices hold what a gemv of rows×k reads and
// writes; the assembly trusts its pointers.
func checkGEMV(out, x []float32, wlen, stride, rows, k int) {
	if rows <= 0 {
		return
	}
	_ = out[rows-1]
	_ = x[k-1]
	if (rows-1)*stride+k > wlen {
		panic("cpu: gemv weights out of range")
	}
}

// gemvAsm runs the one-row GEMV kernel kern over the columns up to the
// last multiple of 8, and the portable tail over the rest.
func gemvAsm[W float32 | uint16](kern func(out, x *float32, w *W, stride, rows, k8 int), tail func(out, x []float32, w []W, stride, rows, k int),
	out, x []float32, w []W, stride, rows, k int) {
	if rows <= 0 || k <= 0 {
		clear(out[:max(rows, 0)])
		return
	}
	checkGEMV(out, x, len(w), stride, rows, k)
	k8 := k &^ 7
	kern(&out[0], &x[0], &w[0], stride, rows, k8)
	addTails(tail, out, x, w, stride, rows, k8, k)
}

// addTails adds to out[r] the products of x[k8:k] and row r's last k-k8
// weights, by the portable kernel g, for r < rows: the columns the
// assembly leaves.
func addTails[W float32 | uint16](g func(out, x []float32, w []W, stride, rows, k int), out, x []float32, w []W, stride, rows, k8, k int) {
	if k8 == k {
		return
	}
	var tail [1]float32
	for r := range rows {
		g(tail[:], x[k8:k], w[r*stride+k8:], 0, 1, k-k8)
		out[r] += tail[0]
	}
}

// gemv2Asm runs a two-row GEMV with its kernels: pair for two rows of x,
// one for a row alone, tail for the k%8 columns.
func gemv2Asm[W float32 | uint16](pair func(out0, out1, x0, x1 *float32, w *W, stride, pairs, k8 int),
	one, tail func(out, x []float32, w []W, stride, rows, k int),
	out0, out1, x0, x1 []float32, w []W, stride, rows, k int) {
	q := rows &^ 3
	if q > 0 && k > 0 {
		checkGEMV(out0, x0, len(w), stride, q, k)
		checkGEMV(out1, x1, len(w), stride, q, k)
		k8 := k &^ 7
		pair(&out0[0], &out1[0], &x0[0], &x1[0], &w[0], stride, q/2, k8)
		addTails(tail, out0, x0, w, stride, q, k8, k)
		addTails(tail, out1, x1, w, stride, q, k8, k)
	} else {
		q = 0
	}
	if q < rows {
		one(out0[q:], x0, w[q*stride:], stride, rows-q, k)
		one(out1[q:], x1, w[q*stride:], stride, rows-q, k)
	}
}

func cvtBF16Asm(dst []float32, src []uint16) {
	n8 := len(src) &^ 7
	if n8 > 0 {
		_ = dst[len(src)-1]
		cvtBF16AVX2(&dst[0], &src[0], n8)
	}
	cvtBF16Go(dst[n8:], src[n8:])
}

func cvtF16Asm(dst []float32, src []uint16) {
	n8 := len(src) &^ 7
	if n8 > 0 {
		_ = dst[len(src)-1]
		cvtF16AVX2(&dst[0], &src[0], n8)
	}
	cvtF16Go(dst[n8:], src[n8:])
}

func sumAsm(p []float32) float32 {
	n32 := len(p) &^ 31
	var s float32
	if n32 > 0 {
		s = sumF32AVX2(&p[0], n32)
	}
	return s + sumGo(p[n32:])
}

// accumAsm is an accumulation (kernels.accum, accumBF16, accumF16) by the
// assembly kernel asm for the columns in multiples of 8, and by tail for
// the rest.
func accumAsm[T float32 | uint16](asm func(acc *float32, v *T, vstride int, p *float32, rows, hd8 int), tail func(acc []float32, v []T, vstride int, p []float32)) func(acc []float32, v []T, vstride int, p []float32) {
	return func(acc []float32, v []T, vstride int, p []float32) {
		rows, hd := len(p), len(acc)
		if rows == 0 || hd == 0 {
			return
		}
		_ = v[(rows-1)*vstride+hd-1]
		hd8 := hd &^ 7
		if hd8 > 0 {
			asm(&acc[0], &v[0], vstride, &p[0], rows, hd8)
		}
		if hd8 < hd {
			tail(acc[hd8:], v[hd8:], vstride, p)
		}
	}
}

func expShiftAsm(s []float32, m float32) float32 {
	n8 := len(s) &^ 7
	var sum float32
	if n8 > 0 {
		sum = expShiftAVX2(&s[0], n8, m)
	}
	return sum + expShiftGo(s[n8:], m)
}

func siluMulAsm(o, g, u []float32) {
	n := len(o)
	g, u = g[:n], u[:n]
	n8 := n &^ 7
	if n8 > 0 {
		siluMulAVX2(&o[0], &g[0], &u[0], n8)
	}
	siluMulGo(o[n8:], g[n8:], u[n8:])
}

// checkDots3 panics unless the slices hold what a dots3 of nk keys of
// length hd reads and writes; the assembly trusts its pointers.
func checkDots3(s []float32, sstride int, q []float32, qstride, klen, kstride, nk, hd int) {
	_ = s[2*sstride+nk-1]
	_ = q[2*qstride+hd-1]
	if (nk-1)*kstride+hd > klen {
		panic("cpu: dots3 keys out of range")
	}
}

func dots3F32Asm(s []float32, sstride int, q []float32, qstride int, k []float32, kstride, nk, hd int) {
	if nk <= 0 {
		return
	}
	if hd <= 0 || hd%8 != 0 {
		dots3F32Go(s, sstride, q, qstride, k, kstride, nk, hd)
		return
	}
	checkDots3(s, sstride, q, qstride, len(k), kstride, nk, hd)
	nk4 := nk &^ 3
	if nk4 > 0 {
		dots3F32AVX2(&s[0], sstride, &q[0], qstride, &k[0], kstride, nk4, hd)
	}
	if nk4 < nk {
		for i := range 3 {
			gemvAsm(gemvF32AVX2, gemvF32Go, s[i*sstride+nk4:i*sstride+nk], q[i*qstride:i*qstride+hd], k[nk4*kstride:], kstride, nk-nk4, hd)
		}
	}
}

func dots3BF16Asm(s []float32, sstride int, q []float32, qstride int, k []uint16, kstride, nk, hd int) {
	if nk <= 0 {
		return
	}
	if hd <= 0 || hd%8 != 0 {
		dots3BF16Go(s, sstride, q, qstride, k, kstride, nk, hd)
		return
	}
	checkDots3(s, sstride, q, qstride, len(k), kstride, nk, hd)
	nk4 := nk &^ 3
	if nk4 > 0 {
		dots3BF16AVX2(&s[0], sstride, &q[0], qstride, &k[0], kstride, nk4, hd)
	}
	if nk4 < nk {
		for i := range 3 {
			gemvAsm(gemvBF16AVX2, gemvBF16Go, s[i*sstride+nk4:i*sstride+nk], q[i*qstride:i*qstride+hd], k[nk4*kstride:], kstride, nk-nk4, hd)
		}
	}
}

// checkAccum2 panics unless the slices hold what an accum2 of rows value
// rows of length hd reads and writes; the assembly trusts its pointers.
func checkAccum2(acc []float32, astride, vlen, vstride int, p []float32, pstride, rows, hd int) {
	_ = acc[astride+hd-1]
	_ = p[pstride+rows-1]
	if (rows-1)*vstride+hd > vlen {
		panic("cpu: accum2 values out of range")
	}
}

func accum2F32Asm(acc []float32, astride int, v []float32, vstride int, p []float32, pstride, rows, hd int) {
	if rows <= 0 || hd <= 0 {
		return
	}
	if hd%8 != 0 {
		accum2F32Go(acc, astride, v, vstride, p, pstride, rows, hd)
		return
	}
	checkAccum2(acc, astride, len(v), vstride, p, pstride, rows, hd)
	accum2F32AVX2(&acc[0], astride, &v[0], vstride, &p[0], pstride, rows, hd)
}

func accum2BF16Asm(acc []float32, astride int, v []uint16, vstride int, p []float32, pstride, rows, hd int) {
	if rows <= 0 || hd <= 0 {
		return
	}
	if hd%8 != 0 {
		accum2BF16Go(acc, astride, v, vstride, p, pstride, rows, hd)
		return
	}
	checkAccum2(acc, astride, len(v), vstride, p, pstride, rows, hd)
	accum2BF16AVX2(&acc[0], astride, &v[0], vstride, &p[0], pstride, rows, hd)
}

func maxAsm(s []float32) float32 {
	n8 := len(s) &^ 7
	if n8 == 0 {
		return maxGo(s)
	}
	m := maxF32AVX2(&s[0], n8)
	for _, v := range s[n8:] {
		if v > m {
			m = v
		}
	}
	return m
}

func cvtBF16RowsAsm(dst []float32, src []uint16, sstride, rows, n int) {
	if rows <= 0 || n <= 0 {
		return
	}
	if n%8 != 0 {
		cvtBF16RowsGo(dst, src, sstride, rows, n)
		return
	}
	_ = dst[rows*n-1]
	_ = src[(rows-1)*sstride+n-1]
	cvtBF16RowsAVX2(&dst[0], &src[0], sstride, rows, n)
}

func flashScoresAsm(s, k []float32, kstride, nk int, qt []float32, hd int, scale float32) {
	if nk <= 0 {
		return
	}
	if hd <= 0 {
		clear(s[:nk*flashLanes])
		return
	}
	_ = s[nk*flashLanes-1]
	_ = qt[hd*flashLanes-1]
	if (nk-1)*kstride+hd > len(k) {
		panic("cpu: flash scores keys out of range")
	}
	flashScoresAVX2(&s[0], &k[0], kstride, nk, &qt[0], hd, scale)
}

func flashSoftmaxAsm(s []float32, nk int, m, l, f []float32) {
	if nk <= 0 {
		return
	}
	_ = s[nk*flashLanes-1]
	_, _, _ = m[flashLanes-1], l[flashLanes-1], f[flashLanes-1]
	flashSoftmaxAVX2(&s[0], nk, &m[0], &l[0], &f[0])
}

func flashPVAsm(o, p []float32, nk int, v []float32, vstride int, f []float32, hd int) {
	if hd <= 0 {
		return
	}
	if hd%flashDims != 0 {
		flashPVGo(o, p, nk, v, vstride, f, hd)
		return
	}
	_ = o[flashLanes*hd-1]
	_ = f[flashLanes-1]
	pp, vp := &f[0], &f[0] // any valid pointer: no key rows are read
	if nk > 0 {
		_ = p[nk*flashLanes-1]
		if (nk-1)*vstride+hd > len(v) {
			panic("cpu: flash values out of range")
		}
		pp, vp = &p[0], &v[0]
	}
	flashPVAVX2(&o[0], pp, nk, vp, vstride, &f[0], hd/flashDims)
}

func gemm6x16Asm(out []float32, ostride int, x []float32, xstride int, wp []float32, k, n16 int, add bool) {
	if a, ok := gemmArgs(out, ostride, x, xstride, wp, k, n16, add); ok {
		gemm6x16AVX2(&out[0], ostride, &x[0], xstride, &wp[0], k, n16, a)
	}
}

func gemm6x16Asm512(out []float32, ostride int, x []float32, xstride int, wp []float32, k, n16 int, add bool) {
	if a, ok := gemmArgs(out, ostride, x, xstride, wp, k, n16, add); ok {
		gemm6x16AVX512(&out[0], ostride, &x[0], xstride, &wp[0], k, n16, a)
	}
}

// gemmArgs checks a gemm6x16 call's spans, does the calls with no depth
// itself, and reports whether the kernel is to run, with add as an int.
func gemmArgs(out []float32, ostride int, x []float32, xstride int, wp []float32, k, n16 int, add bool) (int, bool) {
	if n16 <= 0 || (k <= 0 && add) {
		return 0, false
	}
	if k <= 0 {
		for i := range 6 {
			clear(out[i*ostride : i*ostride+16*n16])
		}
		return 0, false
	}
	_ = out[5*ostride+16*n16-1]
	_ = x[5*xstride+k-1]
	_ = wp[16*k*n16-1]
	if add {
		return 1, true
	}
	return 0, true
}

func packTAsm(dst []float32, dstride int, src []float32, sstride, rows, k int) {
	if rows <= 0 || k <= 0 {
		return
	}
	_ = dst[(k-1)*dstride+rows-1]
	_ = src[(rows-1)*sstride+k-1]
	r8, k8 := rows&^7, k&^7
	if r8 == 0 || k8 == 0 {
		packTGo(dst, dstride, src, sstride, rows, k)
		return
	}
	packTAVX2(&dst[0], dstride, &src[0], sstride, k8, r8/8)
	if r8 < rows {
		packTGo(dst[r8:], dstride, src[r8*sstride:], sstride, rows-r8, k)
	}
	if k8 < k {
		packTGo(dst[k8*dstride:], dstride, src[k8:], sstride, r8, k-k8)
	}
}

func sumSqAsm(p []float32) float32 {
	n8 := len(p) &^ 7
	var s float32
	if n8 > 0 {
		s = sumSqF32AVX2(&p[0], n8)
	}
	return s + sumSqGo(p[n8:])
}

func scaleMulAsm(o, x, w []float32, s float32) {
	n := len(o)
	x, w = x[:n], w[:n]
	n8 := n &^ 7
	if n8 > 0 {
		scaleMulAVX2(&o[0], &x[0], &w[0], s, n8)
	}
	scaleMulGo(o[n8:], x[n8:], w[n8:], s)
}

func addAsm(o, x, y []float32) {
	n := len(o)
	x, y = x[:n], y[:n]
	n8 := n &^ 7
	if n8 > 0 {
		addF32AVX2(&o[0], &x[0], &y[0], n8)
	}
	addGo(o[n8:], x[n8:], y[n8:])
}

func rotateAsm(lo, hi, cos, sin []float32) {
	n := len(lo)
	hi, cos, sin = hi[:n], cos[:n], sin[:n]
	n8 := n &^ 7
	if n8 > 0 {
		rotateAVX2(&lo[0], &hi[0], &cos[0], &sin[0], n8)
	}
	rotateGo(lo[n8:], hi[n8:], cos[n8:], sin[n8:])
}
