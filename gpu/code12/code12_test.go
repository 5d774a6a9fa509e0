package code12

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// bf16 is v's bf16 bits, rounded to nearest even.
func bf16(v float32) uint16 {
	b := math.Float32bits(v)
	return uint16((b + 0x7fff + (b >> 16 & 1)) >> 16)
}

// normal is rows × k bf16 values drawn from N(0, std²), little-endian.
func normal(rng *rand.Rand, rows, k int, std float64) []byte {
	out := make([]byte, 2*rows*k)
	for i := 0; i < rows*k; i++ {
		binary.LittleEndian.PutUint16(out[2*i:], bf16(float32(rng.NormFloat64()*std)))
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		rows, k int
		std     float64
	}{{64, 512, 0.02}, {33, 2048, 1}, {8, 8192, 0.002}, {3, 1024, 1e-30}} {
		raw := normal(rng, c.rows, c.k, c.std)
		// Zeros, a NaN, an infinity and outliers are escapes.
		for _, at := range []int{0, 3, c.k + 17} {
			binary.LittleEndian.PutUint16(raw[2*at:], 0)
		}
		binary.LittleEndian.PutUint16(raw[2*(2*c.k-1):], 0x7fc1)
		binary.LittleEndian.PutUint16(raw[2*(c.k/2):], 0xff80)
		binary.LittleEndian.PutUint16(raw[2*5:], bf16(float32(c.std*1e6)))
		m, err := Encode(c.rows, c.k, raw[:2*c.k], raw[2*c.k:])
		if err != nil {
			t.Fatalf("%d × %d: %v", c.rows, c.k, err)
		}
		if got := m.Decode(); !bytes.Equal(got, raw) {
			t.Fatalf("%d × %d: the decoded values differ", c.rows, c.k)
		}
		if m.Escapes() < 6 || len(m.Data) != c.rows*c.k*3/2 || len(m.Esc) != c.rows*m.Cap {
			t.Fatalf("%d × %d: %d escapes, %d bytes, %d entries", c.rows, c.k, m.Escapes(), len(m.Data), len(m.Esc))
		}
		t.Logf("%d × %d, std %g: base %d, %d escapes (%.2g a value), cap %d", c.rows, c.k, c.std, m.Base, m.Escapes(),
			float64(m.Escapes())/float64(c.rows*c.k), m.Cap)
	}
}

// TestLayout reads a chunk as the decoder's lanes do (package comment).
func TestLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	raw := normal(rng, 2, 1024, 0.02)
	m, err := Encode(2, 1024, raw)
	if err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		for c := range 2 {
			chunk := m.Data[r*1536+c*ChunkBytes:]
			for lane := range 32 {
				w0 := binary.LittleEndian.Uint32(chunk[Chunk+8*lane:])
				w1 := binary.LittleEndian.Uint32(chunk[Chunk+8*lane+4:])
				codes := [4]uint32{w0 & 0x0f0f0f0f, w0 >> 4 & 0x0f0f0f0f, w1 & 0x0f0f0f0f, w1 >> 4 & 0x0f0f0f0f}
				for q, cw := range codes {
					h := (cw&0x07070707 + m.Base4()) | (cw<<4)&0x80808080
					for j := range 4 {
						i := 16*lane + 4*q + j
						col := c*Chunk + i
						got := uint16(h>>(8*j))<<8 | uint16(chunk[i])
						want := binary.LittleEndian.Uint16(raw[2*(r*1024+col):])
						if cw>>(8*j)&0xff == 0 {
							want = uint16(m.Base) << 8 // an escape decodes to V0
						}
						if got != want {
							t.Fatalf("row %d col %d: %#04x, want %#04x", r, col, got, want)
						}
					}
				}
			}
		}
	}
}

func TestNotCodable(t *testing.T) {
	for _, c := range []struct{ rows, k int }{{1, 500}, {0, 512}, {1, MaxK + 512}} {
		if _, err := Encode(c.rows, c.k, make([]byte, 2*max(c.rows, 0)*c.k)); !errors.Is(err, ErrNotCodable) {
			t.Errorf("%d × %d: %v", c.rows, c.k, err)
		}
	}
	// Uniform random bits: most high bytes fall outside any window.
	rng := rand.New(rand.NewPCG(5, 6))
	raw := make([]byte, 2*512)
	for i := range raw {
		raw[i] = byte(rng.Uint32())
	}
	if _, err := Encode(1, 512, raw); !errors.Is(err, ErrNotCodable) {
		t.Errorf("random bits: %v", err)
	}
	if _, err := Encode(2, 512, make([]byte, 2*512)); err == nil {
		t.Error("too few bytes: no error")
	}
}

func FuzzEncode(f *testing.F) {
	f.Add(uint64(1), 0.02, uint16(0))
	f.Add(uint64(2), 1e-3, uint16(0x7f80))
	f.Fuzz(func(t *testing.T, seed uint64, std float64, poke uint16) {
		if math.IsNaN(std) || math.IsInf(std, 0) {
			return
		}
		rng := rand.New(rand.NewPCG(seed, 7))
		raw := normal(rng, 2, 512, std)
		binary.LittleEndian.PutUint16(raw[2*int(seed%1024):], poke)
		m, err := Encode(2, 512, raw)
		if errors.Is(err, ErrNotCodable) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Decode(), raw) {
			t.Fatal("the decoded values differ")
		}
	})
}
