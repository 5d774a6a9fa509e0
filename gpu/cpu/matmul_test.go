package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/gpu/ref"
)

// TestMatMulBlocked covers the packed GEMM against the float64 reference:
// input rows that leave a partial block of six, weight rows that leave a
// partial strip of 16, depths split into several kernel calls (and not a
// multiple of 8), panels split over threads, and every weight dtype.
func TestMatMulBlocked(t *testing.T) {
	shapes := [][3]int{{4, 8, 16}, {13, 300, 17}, {6, 1000, 33}, {29, 517, 70}, {64, 256, 130}}
	rng := rand.New(rand.NewPCG(15, 16))
	for _, kern := range lanes() {
		for _, threads := range []int{1, 3} {
			d := open(t, kern, threads)
			for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
				for _, s := range shapes {
					n, k, m := s[0], s[1], s[2]
					t.Run(fmt.Sprintf("%s/threads=%d/%s/n=%d/k=%d/m=%d", kern.name, threads, dt, n, k, m), func(t *testing.T) {
						x, w := randF32(rng, n*k), randF32(rng, m*k)
						got, want := matMulOn(t, d, dt, x, w, n, k, m), matMulOn(t, ref.New(), dt, x, w, n, k, m)
						if e := gputest.RelL2(got, want); e > 1e-5 {
							t.Errorf("relative L2 error %.3g, want <= 1e-5", e)
						}
					})
				}
			}
		}
	}
}

// TestMatMulFewRows: products of up to gemmMinRows-1 rows run the GEMV a
// tile of weights at a time for every row. Each row's result must be the
// bits it gets alone (n = 1), over several tiles a thread, and within the
// float64 reference's bounds.
func TestMatMulFewRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	for _, kern := range lanes() {
		for _, threads := range []int{1, 3} {
			d := open(t, kern, threads)
			for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
				for _, n := range []int{2, 5, gemmMinRows - 1} {
					k, m := 1000, 301
					t.Run(fmt.Sprintf("%s/threads=%d/%s/n=%d", kern.name, threads, dt, n), func(t *testing.T) {
						x, w := randF32(rng, n*k), randF32(rng, m*k)
						got := matMulOn(t, d, dt, x, w, n, k, m)
						if e := gputest.RelL2(got, matMulOn(t, ref.New(), dt, x, w, n, k, m)); e > 1e-5 {
							t.Errorf("relative L2 error %.3g, want <= 1e-5", e)
						}
						for i := range n {
							alone := matMulOn(t, d, dt, x[i*k:(i+1)*k], w, 1, k, m)
							for j, v := range alone {
								if got[i*m+j] != v {
									t.Fatalf("row %d, column %d: %v among %d rows, %v alone", i, j, got[i*m+j], n, v)
								}
							}
						}
					})
				}
			}
		}
	}
}

// matMulOn runs x[n,k] · w[m,k]ᵀ on dev, w stored as dt.
func matMulOn(t *testing.T, dev gpu.Device, dt gpu.DType, x, w []float32, n, k, m int) []float32 {
	t.Helper()
	xb, err := dev.Alloc(gpu.F32, n*k)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Write(xb, 0, gpu.F32Bytes(x)); err != nil {
		t.Fatal(err)
	}
	wb, err := dev.Weights(dt, gputest.Encode(dt, w))
	if err != nil {
		t.Fatal(err)
	}
	ob, err := dev.Alloc(gpu.F32, n*m)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.MatMul(ob, xb, wb, n, k, m); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, n*m)
	if err := dev.Read(gpu.F32Bytes(out), ob, 0); err != nil {
		t.Fatal(err)
	}
	return out
}
