package cpu

import "github.com/troupe/troupe/gpu"

// kernels are the inner loops of the lane. Two sets exist: generic (portable
// Go) and, on amd64 with AVX2/FMA/F16C, assembly. Every kernel accumulates
// in float32.
type kernels struct {
	name string
	// gemv* set out[r] = x[:k] · w[r*stride : r*stride+k] for r < rows.
	gemvF32  func(out, x, w []float32, stride, rows, k int)
	gemvBF16 func(out, x []float32, w []uint16, stride, rows, k int)
	gemvF16  func(out, x []float32, w []uint16, stride, rows, k int)
	// gemv2* are the gemv* for two rows of x at once (out0 from x0, out1
	// from x1), each weight read once, each result the one-row kernel's
	// bits.
	gemv2F32  func(out0, out1, x0, x1, w []float32, stride, rows, k int)
	gemv2BF16 func(out0, out1, x0, x1 []float32, w []uint16, stride, rows, k int)
	gemv2F16  func(out0, out1, x0, x1 []float32, w []uint16, stride, rows, k int)
	// gemm6x16 sets out[i*ostride+16*s+j] to x[i*xstride:][:k] · column j
	// of strip s of wp, or adds that to it if add, for i < 6, j < 16,
	// s < n16; a strip is 16 weight rows packed k-major (packT),
	// wp[(s*k+c)*16+j] = w[16*s+j][c].
	gemm6x16 func(out []float32, ostride int, x []float32, xstride int, wp []float32, k, n16 int, add bool)
	// packT sets dst[c*dstride+j] = src[j*sstride+c] for j < rows, c < k:
	// rows transposed into columns (a strip for gemm6x16, queries for
	// flashScores).
	packT func(dst []float32, dstride int, src []float32, sstride, rows, k int)
	// accum adds Σ_r p[r]*v[r*vstride : r*vstride+len(acc)] to acc for
	// r < len(p).
	accum     func(acc, v []float32, vstride int, p []float32)
	accumBF16 func(acc []float32, v []uint16, vstride int, p []float32)
	accumF16  func(acc []float32, v []uint16, vstride int, p []float32)
	// dots3* set s[i*sstride+j] = q[i*qstride:][:hd] · k[j*kstride:][:hd]
	// for i < 3, j < nk: the scores of three queries against nk keys, each
	// key read once.
	dots3F32  func(s []float32, sstride int, q []float32, qstride int, k []float32, kstride, nk, hd int)
	dots3BF16 func(s []float32, sstride int, q []float32, qstride int, k []uint16, kstride, nk, hd int)
	// accum2* add Σ_r p[a*pstride+r]*v[r*vstride:][:hd] to
	// acc[a*astride:][:hd] for a < 2, r < rows: the value sums of two
	// queries, each value row read once.
	accum2F32  func(acc []float32, astride int, v []float32, vstride int, p []float32, pstride, rows, hd int)
	accum2BF16 func(acc []float32, astride int, v []uint16, vstride int, p []float32, pstride, rows, hd int)
	// flash* are the blocked attention kernels (flash.go): flashLanes
	// query lanes against a chunk of keys, scores kept key-major.
	// flashScores sets s[j*flashLanes+i] = scale * k[j*kstride:][:hd] ·
	// column i of qt, which is [hd][flashLanes], for j < nk, i < flashLanes.
	flashScores func(s, k []float32, kstride, nk int, qt []float32, hd int, scale float32)
	// flashSoftmax takes one step of the online softmax over nk > 0 rows
	// of s, lane by lane: mn = max(m, max_j s[j]), f = exp(m-mn),
	// s[j] = exp(s[j]-mn), l = l*f + Σ_j s[j], m = mn.
	flashSoftmax func(s []float32, nk int, m, l, f []float32)
	// flashPV scales each lane i of o by f[i] and adds Σ_j p[j*flashLanes+i]
	// * v[j*vstride:][:hd]; o is laid out as flashAt describes.
	flashPV func(o, p []float32, nk int, v []float32, vstride int, f []float32, hd int)
	// max returns the largest element of a non-empty s.
	max func(s []float32) float32
	// expShift sets s[i] = exp(s[i]-m) and returns Σ s[i]; m ≥ max(s).
	expShift func(s []float32, m float32) float32
	// siluMul sets o[i] = silu(g[i]) * u[i]; o may alias g or u.
	siluMul func(o, g, u []float32)
	// cvtBF16Rows widens rows rows of n elements of src, which start
	// sstride apart, into dst[r*n:][:n].
	cvtBF16Rows func(dst []float32, src []uint16, sstride, rows, n int)
	// cvtBF16 and cvtF16 widen src into dst[:len(src)].
	cvtBF16 func(dst []float32, src []uint16)
	cvtF16  func(dst []float32, src []uint16)
	// sum returns Σ p[i]; it exists to measure read bandwidth.
	sum func(p []float32) float32
	// add sets o[i] = x[i] + y[i] for i < len(o).
	add func(o, x, y []float32)
	// rotate turns each pair (lo[i], hi[i]) by the angle whose cosine
	// and sine are cos[i] and sin[i], for i < len(lo): RoPE's rotation.
	rotate func(lo, hi, cos, sin []float32)
	// sumSq returns Σ p[i]².
	sumSq func(p []float32) float32
	// scaleMul sets o[i] = x[i] * s * w[i] for i < len(o).
	scaleMul func(o, x, w []float32, s float32)
}

var genericKernels = &kernels{
	name:         "generic",
	gemvF32:      gemvF32Go,
	gemvBF16:     gemvBF16Go,
	gemvF16:      gemvF16Go,
	gemv2F32:     gemv2Go(gemvF32Go),
	gemv2BF16:    gemv2Go(gemvBF16Go),
	gemv2F16:     gemv2Go(gemvF16Go),
	gemm6x16:     gemm6x16Go,
	packT:        packTGo,
	accum:        accumGo,
	accumBF16:    accumBF16Go,
	accumF16:     accumF16Go,
	dots3F32:     dots3F32Go,
	dots3BF16:    dots3BF16Go,
	accum2F32:    accum2F32Go,
	accum2BF16:   accum2BF16Go,
	max:          maxGo,
	flashScores:  flashScoresGo,
	flashSoftmax: flashSoftmaxGo,
	flashPV:      flashPVGo,
	expShift:     expShiftGo,
	siluMul:      siluMulGo,
	cvtBF16Rows:  cvtBF16RowsGo,
	cvtBF16:      cvtBF16Go,
	cvtF16:       cvtF16Go,
	sum:          sumGo,
	add:          addGo,
	rotate:       rotateGo,
	sumSq:        sumSqGo,
	scaleMul:     scaleMulGo,
}

// gemv2Go is a two-row GEMV that runs the one-row kernel g for each row
// of x.
func gemv2Go[W float32 | uint16](g func(out, x []float32, w []W, stride, rows, k int)) func(out0, out1, x0, x1 []float32, w []W, stride, rows, k int) {
	return func(out0, out1, x0, x1 []float32, w []W, stride, rows, k int) {
		g(out0, x0, w, stride, rows, k)
		g(out1, x1, w, stride, rows, k)
	}
}

func gemvF32Go(out, x, w []float32, stride, rows, k int) {
	x = x[:k]
	for r := range rows {
		out[r] = dotGo(x, w[r*stride:r*stride+k])
	}
}

// dotGo keeps four partial sums, which lets the loop run at about one
// element per cycle.
func dotGo(x, w []float32) float32 {
	w = w[:len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * w[i]
		s1 += x[i+1] * w[i+1]
		s2 += x[i+2] * w[i+2]
		s3 += x[i+3] * w[i+3]
	}
	for ; i < len(x); i++ {
		s0 += x[i] * w[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func gemvBF16Go(out, x []float32, w []uint16, stride, rows, k int) {
	x = x[:k]
	for r := range rows {
		row := w[r*stride : r*stride+k]
		var s0, s1, s2, s3 float32
		i := 0
		for ; i+4 <= k; i += 4 {
			s0 += x[i] * gpu.BF16ToF32(row[i])
			s1 += x[i+1] * gpu.BF16ToF32(row[i+1])
			s2 += x[i+2] * gpu.BF16ToF32(row[i+2])
			s3 += x[i+3] * gpu.BF16ToF32(row[i+3])
		}
		for ; i < k; i++ {
			s0 += x[i] * gpu.BF16ToF32(row[i])
		}
		out[r] = (s0 + s1) + (s2 + s3)
	}
}

func gemvF16Go(out, x []float32, w []uint16, stride, rows, k int) {
	x = x[:k]
	for r := range rows {
		row := w[r*stride : r*stride+k]
		var s float32
		for i, h := range row {
			s += x[i] * gpu.F16ToF32(h)
		}
		out[r] = s
	}
}

func accumGo(acc, v []float32, vstride int, p []float32) {
	for r, pr := range p {
		row := v[r*vstride : r*vstride+len(acc)]
		for c := range acc {
			acc[c] += pr * row[c]
		}
	}
}

func cvtBF16Go(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = gpu.BF16ToF32(h)
	}
}

func cvtF16Go(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = gpu.F16ToF32(h)
	}
}

func sumGo(p []float32) float32 {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(p); i += 4 {
		s0 += p[i]
		s1 += p[i+1]
		s2 += p[i+2]
		s3 += p[i+3]
	}
	for ; i < len(p); i++ {
		s0 += p[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func accumBF16Go(acc []float32, v []uint16, vstride int, p []float32) {
	for r, pr := range p {
		row := v[r*vstride : r*vstride+len(acc)]
		for c := range acc {
			acc[c] += pr * gpu.BF16ToF32(row[c])
		}
	}
}

func accumF16Go(acc []float32, v []uint16, vstride int, p []float32) {
	for r, pr := range p {
		row := v[r*vstride : r*vstride+len(acc)]
		for c := range acc {
			acc[c] += pr * gpu.F16ToF32(row[c])
		}
	}
}

func expShiftGo(s []float32, m float32) float32 {
	var sum float32
	for i, v := range s {
		e := expf(v - m)
		s[i] = e
		sum += e
	}
	return sum
}

func siluMulGo(o, g, u []float32) {
	g, u = g[:len(o)], u[:len(o)]
	for i := range o {
		o[i] = g[i] / (1 + expf(-g[i])) * u[i]
	}
}

func dots3F32Go(s []float32, sstride int, q []float32, qstride int, k []float32, kstride, nk, hd int) {
	for i := range 3 {
		gemvF32Go(s[i*sstride:i*sstride+nk], q[i*qstride:i*qstride+hd], k, kstride, nk, hd)
	}
}

func dots3BF16Go(s []float32, sstride int, q []float32, qstride int, k []uint16, kstride, nk, hd int) {
	for i := range 3 {
		gemvBF16Go(s[i*sstride:i*sstride+nk], q[i*qstride:i*qstride+hd], k, kstride, nk, hd)
	}
}

func accum2F32Go(acc []float32, astride int, v []float32, vstride int, p []float32, pstride, rows, hd int) {
	for a := range 2 {
		accumGo(acc[a*astride:a*astride+hd], v, vstride, p[a*pstride:a*pstride+rows])
	}
}

func accum2BF16Go(acc []float32, astride int, v []uint16, vstride int, p []float32, pstride, rows, hd int) {
	for a := range 2 {
		accumBF16Go(acc[a*astride:a*astride+hd], v, vstride, p[a*pstride:a*pstride+rows])
	}
}

func maxGo(s []float32) float32 {
	m := s[0]
	for _, v := range s[1:] {
		if v > m {
			m = v
		}
	}
	return m
}

func cvtBF16RowsGo(dst []float32, src []uint16, sstride, rows, n int) {
	for r := range rows {
		cvtBF16Go(dst[r*n:(r+1)*n], src[r*sstride:r*sstride+n])
	}
}

func flashScoresGo(s, k []float32, kstride, nk int, qt []float32, hd int, scale float32) {
	for j := range nk {
		row := s[j*flashLanes : (j+1)*flashLanes]
		clear(row)
		for d, kv := range k[j*kstride : j*kstride+hd] {
			for i, q := range qt[d*flashLanes : (d+1)*flashLanes] {
				row[i] += kv * q
			}
		}
		for i := range row {
			row[i] *= scale
		}
	}
}

func flashSoftmaxGo(s []float32, nk int, m, l, f []float32) {
	for i := range flashLanes {
		mn := m[i]
		for j := range nk {
			mn = max(mn, s[j*flashLanes+i])
		}
		f[i] = expf(m[i] - mn)
		sum := l[i] * f[i]
		for j := range nk {
			e := expf(s[j*flashLanes+i] - mn)
			s[j*flashLanes+i] = e
			sum += e
		}
		l[i], m[i] = sum, mn
	}
}

func flashPVGo(o, p []float32, nk int, v []float32, vstride int, f []float32, hd int) {
	for i := range flashLanes {
		for d := range hd {
			at := flashAt(i, d, hd)
			acc := o[at] * f[i]
			for j := range nk {
				acc += p[j*flashLanes+i] * v[j*vstride+d]
			}
			o[at] = acc
		}
	}
}

func gemm6x16Go(out []float32, ostride int, x []float32, xstride int, wp []float32, k, n16 int, add bool) {
	for s := range n16 {
		strip := wp[s*16*k : (s+1)*16*k]
		for i := range 6 {
			var acc [16]float32
			if add {
				copy(acc[:], out[i*ostride+16*s:])
			}
			for c, xv := range x[i*xstride : i*xstride+k] {
				w := strip[c*16 : c*16+16]
				for j := range acc {
					acc[j] += xv * w[j]
				}
			}
			copy(out[i*ostride+16*s:i*ostride+16*s+16], acc[:])
		}
	}
}

func packTGo(dst []float32, dstride int, src []float32, sstride, rows, k int) {
	for j := range rows {
		for c, v := range src[j*sstride : j*sstride+k] {
			dst[c*dstride+j] = v
		}
	}
}

// sumSqGo is p · p, summed as dotGo sums.
func sumSqGo(p []float32) float32 { return dotGo(p, p) }

func scaleMulGo(o, x, w []float32, s float32) {
	x, w = x[:len(o)], w[:len(o)]
	for i := range o {
		o[i] = x[i] * s * w[i]
	}
}

func addGo(o, x, y []float32) {
	x, y = x[:len(o)], y[:len(o)]
	for i := range o {
		o[i] = x[i] + y[i]
	}
}

func rotateGo(lo, hi, cos, sin []float32) {
	hi, cos, sin = hi[:len(lo)], cos[:len(lo)], sin[:len(lo)]
	for i := range lo {
		a, b := lo[i], hi[i]
		lo[i] = a*cos[i] - b*sin[i]
		hi[i] = b*cos[i] + a*sin[i]
	}
}

// fastKernels returns the best kernels for this processor: the fastest
// assembly set it runs, or the portable one.
func fastKernels() *kernels {
	if ks := asmKernels(); len(ks) > 0 {
		return ks[len(ks)-1]
	}
	return genericKernels
}
