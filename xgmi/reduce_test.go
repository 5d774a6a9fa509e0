package xgmi

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/troupe/troupe/gpu"
)

// The inlined half conversions must agree with package gpu's bit for bit.
func TestF16Conversions(t *testing.T) {
	for h := range 1 << 16 {
		got, want := math.Float32bits(f16ToF32(uint16(h))), math.Float32bits(gpu.F16ToF32(uint16(h)))
		if got != want {
			t.Fatalf("f16ToF32(%#04x): got %#08x, want %#08x", h, got, want)
		}
	}
	check := func(u uint32) {
		f := math.Float32frombits(u)
		if got, want := f32ToF16(f), gpu.F32ToF16(f); got != want {
			t.Fatalf("f32ToF16(%#08x): got %#04x, want %#04x", u, got, want)
		}
	}
	// Every sign, exponent and upper mantissa, with the low 13 bits at and
	// around the rounding points.
	for hi := range uint32(1 << 19) {
		for _, lo := range []uint32{0, 1, 0xfff, 0x1000, 0x1001, 0x1fff} {
			check(hi<<13 | lo)
		}
	}
	r := rand.New(rand.NewPCG(9, 9))
	for range 1 << 20 {
		check(r.Uint32())
	}
}

func TestSumReferenceErrors(t *testing.T) {
	out := make([]byte, 8)
	if err := SumReference(gpu.I32, out, [][]byte{make([]byte, 8)}); err == nil {
		t.Error("i32: no error")
	}
	if err := SumReference(gpu.F32, out, [][]byte{make([]byte, 4)}); err == nil {
		t.Error("short input: no error")
	}
	if err := SumReference(gpu.F32, out, nil); err == nil {
		t.Error("no inputs: no error")
	}
}
