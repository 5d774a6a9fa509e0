package gpu

import (
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestExpNonPos checks ExpNonPos against math.Exp over the exponents a
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
		got, want := ExpNonPos(x), math.Exp(x)
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
				s += ExpNonPos(x)
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

// TestExpTable: the host's table of 2^(j/64) and the device's
// (kernels/cuda/sample.cu, which draws with the same exponentials) hold the
// same bits, and each entry t is 2^(j/64) correctly rounded: 2^j lies
// between (t − ulp/2)^64 and (t + ulp/2)^64, computed exactly.
func TestExpTable(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "kernels", "cuda", "sample.cu"))
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "exp2_64[64] = {")
	if body, _, ok = strings.Cut(body, "};"); !ok {
		t.Fatal("sample.cu: no exp2_64 table")
	}
	var dev []float64
	for _, f := range strings.FieldsFunc(body, func(r rune) bool { return r == ',' || unicode.IsSpace(r) }) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			t.Fatalf("sample.cu: %v", err)
		}
		dev = append(dev, v)
	}
	if len(dev) != len(exp2By64) {
		t.Fatalf("sample.cu's table has %d entries, the host's %d", len(dev), len(exp2By64))
	}
	pow := func(x *big.Float) *big.Float {
		r := new(big.Float).SetPrec(4096).SetInt64(1)
		for range 64 {
			r.Mul(r, x)
		}
		return r
	}
	for j, v := range exp2By64 {
		if math.Float64bits(dev[j]) != math.Float64bits(v) {
			t.Errorf("entry %d: device %x, host %x", j, dev[j], v)
		}
		half := (math.Nextafter(v, 2) - v) / 2
		lo := pow(new(big.Float).SetPrec(4096).Sub(big.NewFloat(v), big.NewFloat(half)))
		hi := pow(new(big.Float).SetPrec(4096).Add(big.NewFloat(v), big.NewFloat(half)))
		want := new(big.Float).SetPrec(4096).SetMantExp(big.NewFloat(1), j)
		if lo.Cmp(want) > 0 || hi.Cmp(want) < 0 {
			t.Errorf("entry %d (%x) is not 2^(%d/64) correctly rounded", j, v, j)
		}
	}
}
