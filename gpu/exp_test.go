package gpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestExpNonPos checks expNonPos against math.Exp over the exponents a
// draw takes, dense near 0 and spread down to -708, and at the edges:
// within 2 ulp (relative 4.5e-16) in the fast range, equal outside it.
func TestExpNonPos(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	xs := []float64{0, math.Copysign(0, -1), -1e-300, -math.SmallestNonzeroFloat64, -707.99, -708, -709, -745.2, -746, -1000,
		math.Inf(-1), math.NaN(), 1e-300, 0.5, math.Inf(1), -math.Ln2 / 128, -math.Ln2 / 64}
	for range 200000 {
		xs = append(xs, -r.ExpFloat64()*3, -r.Float64()*708)
	}
	worst := 0.0
	for _, x := range xs {
		got, want := expNonPos(x), math.Exp(x)
		if math.IsNaN(want) {
			if !math.IsNaN(got) {
				t.Fatalf("exp(%v) = %v, want NaN", x, got)
			}
			continue
		}
		if !(x <= 0 && x > -708) {
			if got != want {
				t.Fatalf("exp(%v) = %v, math.Exp %v", x, got, want)
			}
			continue
		}
		e := math.Abs(got-want) / want
		worst = max(worst, e)
		if e > 4.5e-16 {
			t.Fatalf("exp(%v) = %v, math.Exp %v: relative error %.3g", x, got, want, e)
		}
	}
	t.Logf("worst relative error %.3g over %d arguments", worst, len(xs))
}

func BenchmarkExpNonPos(b *testing.B) {
	xs := make([]float64, 4096)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range xs {
		xs[i] = -r.Float64() * 8
	}
	b.Run("fast", func(b *testing.B) {
		var s float64
		for b.Loop() {
			for _, x := range xs {
				s += expNonPos(x)
			}
		}
		_ = s
	})
	b.Run("math", func(b *testing.B) {
		var s float64
		for b.Loop() {
			for _, x := range xs {
				s += math.Exp(x)
			}
		}
		_ = s
	})
}
