package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/troupe/troupe/gpu"
)

// TestShardNorm normalises rows held in two slices, as two tensor-parallel
// ranks do (each slice's sums of squares, summed, then each slice scaled
// with the total), and checks the result against RMSNorm of the whole rows.
func TestShardNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	d := open(t, genericKernels, 2)
	const n, wa, wb, eps = 3, 8, 24, 1e-6
	const dim = wa + wb
	x := randF32(rng, n*dim)
	w := randF32(rng, dim)
	buf := func(v []float32) gpu.Buffer {
		b, err := d.Alloc(gpu.F32, len(v))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Write(b, 0, gpu.F32Bytes(v)); err != nil {
			t.Fatal(err)
		}
		return b
	}
	// The whole rows.
	whole, out := buf(x), buf(make([]float32, n*dim))
	if err := d.RMSNorm(out, whole, buf(w), n, dim, eps); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, n*dim)
	if err := d.Read(gpu.F32Bytes(want), out, 0); err != nil {
		t.Fatal(err)
	}
	// The rows split into columns [0, wa) and [wa, dim).
	var xa, xb []float32
	for r := range n {
		xa = append(xa, x[r*dim:r*dim+wa]...)
		xb = append(xb, x[r*dim+wa:(r+1)*dim]...)
	}
	a, b, ss := buf(xa), buf(xb), buf(make([]float32, 2*n))
	if err := d.SumSquares2(ss, a, b, n, wa, wb); err != nil {
		t.Fatal(err)
	}
	sums := make([]float32, 2*n)
	if err := d.Read(gpu.F32Bytes(sums), ss, 0); err != nil {
		t.Fatal(err)
	}
	for r := range n {
		sums[r] += sums[n+r] // what the all-reduce of two ranks would hold
	}
	tot := buf(sums)
	if err := d.RMSNormShard(a, tot, 0, buf(w[:wa]), n, wa, dim, eps); err != nil {
		t.Fatal(err)
	}
	if err := d.RMSNormShard(b, tot, 0, buf(w[wa:]), n, wb, dim, eps); err != nil {
		t.Fatal(err)
	}
	ga, gb := make([]float32, n*wa), make([]float32, n*wb)
	if err := d.Read(gpu.F32Bytes(ga), a, 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Read(gpu.F32Bytes(gb), b, 0); err != nil {
		t.Fatal(err)
	}
	for r := range n {
		got := append(append([]float32(nil), ga[r*wa:(r+1)*wa]...), gb[r*wb:(r+1)*wb]...)
		for j, v := range got {
			if e := want[r*dim+j]; math.Abs(float64(v-e)) > 1e-5*(1+math.Abs(float64(e))) {
				t.Fatalf("row %d col %d: got %v, want %v", r, j, v, e)
			}
		}
	}
	// Bad arguments are errors, not panics.
	if err := d.RMSNormShard(a, tot, 0, buf(w[:wa]), n, wa, 0, eps); err == nil {
		t.Error("a total width of 0 was accepted")
	}
	if err := d.SumSquares2(ss, a, b, n+1, wa, wb); err == nil {
		t.Error("more rows than the buffers hold were accepted")
	}
}
