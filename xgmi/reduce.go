package xgmi

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/troupe/troupe/gpu"
)

// The reduction order, on every path and in SumReference: for each
// element, acc = x[0] widened to f32, then acc = acc + x[r] (in f32) for
// r = 1 … n-1 in rank order, then acc is rounded once to the element type
// (to nearest, ties to even; for f32 nothing is rounded). Starting from
// x[0] rather than from zero keeps a sum of negative zeros negative. The
// order does not depend on the algorithm, the step or the reading rank, so
// every rank gets bit-identical results whichever algorithm ran.

// block is how many elements a reduction accumulates at once: the
// accumulator stays in L1 while each rank's input streams through it.
const block = 1024

// sumInto writes the ordered sum of ins into out, each viewed as elements
// of dt. out may be one of ins (the same elements only): each block of
// elements is read from every input before it is written.
//
// The passes over a block fuse the first two inputs and fold the last
// input into the rounding, which changes no operation: the sum is the
// same sequence of f32 additions SumReference makes.
func sumInto(dt gpu.DType, out []byte, ins [][]byte) {
	switch dt {
	case gpu.F32:
		sumF32(f32s(out), ins)
	case gpu.BF16:
		sumBF16(u16s(out), ins)
	case gpu.F16:
		sumF16(u16s(out), ins)
	}
}

func sumF32(out []float32, ins [][]byte) {
	var acc [block]float32
	last := len(ins) - 1
	for lo := 0; lo < len(out); lo += block {
		o := out[lo:min(lo+block, len(out))]
		a := acc[:len(o)]
		x0 := f32s(ins[0])[lo:][:len(o)]
		if last == 0 {
			copy(o, x0)
			continue
		}
		x1 := f32s(ins[1])[lo:][:len(o)]
		if last == 1 {
			for i := range o {
				o[i] = x0[i] + x1[i]
			}
			continue
		}
		for i := range a {
			a[i] = x0[i] + x1[i]
		}
		for r := 2; r < last; r++ {
			x := f32s(ins[r])[lo:][:len(a)]
			for i := range a {
				a[i] += x[i]
			}
		}
		x := f32s(ins[last])[lo:][:len(o)]
		for i := range o {
			o[i] = a[i] + x[i]
		}
	}
}

func sumBF16(out []uint16, ins [][]byte) {
	var acc [block]float32
	last := len(ins) - 1
	for lo := 0; lo < len(out); lo += block {
		o := out[lo:min(lo+block, len(out))]
		a := acc[:len(o)]
		x0 := u16s(ins[0])[lo:][:len(o)]
		if last == 0 {
			for i := range o {
				o[i] = gpu.F32ToBF16(gpu.BF16ToF32(x0[i]))
			}
			continue
		}
		x1 := u16s(ins[1])[lo:][:len(o)]
		if last == 1 {
			for i := range o {
				o[i] = gpu.F32ToBF16(gpu.BF16ToF32(x0[i]) + gpu.BF16ToF32(x1[i]))
			}
			continue
		}
		for i := range a {
			a[i] = gpu.BF16ToF32(x0[i]) + gpu.BF16ToF32(x1[i])
		}
		for r := 2; r < last; r++ {
			x := u16s(ins[r])[lo:][:len(a)]
			for i := range a {
				a[i] += gpu.BF16ToF32(x[i])
			}
		}
		x := u16s(ins[last])[lo:][:len(o)]
		for i := range o {
			o[i] = gpu.F32ToBF16(a[i] + gpu.BF16ToF32(x[i]))
		}
	}
}

func sumF16(out []uint16, ins [][]byte) {
	var acc [block]float32
	last := len(ins) - 1
	for lo := 0; lo < len(out); lo += block {
		o := out[lo:min(lo+block, len(out))]
		a := acc[:len(o)]
		x0 := u16s(ins[0])[lo:][:len(o)]
		if last == 0 {
			for i := range o {
				o[i] = f32ToF16(f16ToF32(x0[i]))
			}
			continue
		}
		x1 := u16s(ins[1])[lo:][:len(o)]
		if last == 1 {
			for i := range o {
				v := f16ToF32(x0[i]) + f16ToF32(x1[i])
				if o[i] = f32ToF16Fast(v); o[i] == slowF16 {
					o[i] = gpu.F32ToF16(v)
				}
			}
			continue
		}
		for i := range a {
			a[i] = f16ToF32(x0[i]) + f16ToF32(x1[i])
		}
		for r := 2; r < last; r++ {
			x := u16s(ins[r])[lo:][:len(a)]
			for i := range a {
				a[i] += f16ToF32(x[i])
			}
		}
		x := u16s(ins[last])[lo:][:len(o)]
		for i := range o {
			v := a[i] + f16ToF32(x[i])
			if o[i] = f32ToF16Fast(v); o[i] == slowF16 {
				o[i] = gpu.F32ToF16(v)
			}
		}
	}
}

// SumReference is the oracle of AllReduce: it writes into out the sum of
// ins element by element in the documented order, one element at a time.
// Every AllReduce must match it bit for bit.
func SumReference(dt gpu.DType, out []byte, ins [][]byte) error {
	if err := checkReducible(dt); err != nil {
		return fmt.Errorf("xgmi: reference: %w", err)
	}
	for r, in := range ins {
		if len(in) != len(out) {
			return fmt.Errorf("xgmi: reference: input %d has %d bytes, output %d", r, len(in), len(out))
		}
	}
	if len(ins) == 0 {
		return fmt.Errorf("xgmi: reference: no inputs")
	}
	size := dt.Size()
	for i := 0; i < len(out)/size; i++ {
		var acc float32
		for r, in := range ins {
			x := load(dt, in, i)
			if r == 0 {
				acc = x
			} else {
				acc += x
			}
		}
		store(dt, out, i, acc)
	}
	return nil
}

func load(dt gpu.DType, b []byte, i int) float32 {
	switch dt {
	case gpu.BF16:
		return gpu.BF16ToF32(uint16(b[2*i]) | uint16(b[2*i+1])<<8)
	case gpu.F16:
		return gpu.F16ToF32(uint16(b[2*i]) | uint16(b[2*i+1])<<8)
	}
	return f32s(b[4*i : 4*i+4])[0]
}

func store(dt gpu.DType, b []byte, i int, v float32) {
	switch dt {
	case gpu.BF16, gpu.F16:
		h := gpu.F32ToBF16(v)
		if dt == gpu.F16 {
			h = gpu.F32ToF16(v)
		}
		b[2*i], b[2*i+1] = byte(h), byte(h>>8)
	default:
		f32s(b[4*i : 4*i+4])[0] = v
	}
}

func checkReducible(dt gpu.DType) error {
	switch dt {
	case gpu.F32, gpu.BF16, gpu.F16:
		return nil
	}
	return fmt.Errorf("cannot sum %s: want f32, bf16 or f16", dt)
}

// f32s and u16s view little-endian bytes as elements; the bytes must be
// aligned to the element size (the callers check user buffers; windows
// and their segments are aligned by construction).
func f32s(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func u16s(b []byte) []uint16 {
	if len(b) < 2 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}

// f16ToF32 is gpu.F16ToF32 without its normalisation loop, so that it
// inlines: a subnormal half is its mantissa times 2^-24, exact in f32.
func f16ToF32(h uint16) float32 {
	s := uint32(h&0x8000) << 16
	m := uint32(h & 0x3ff)
	e := uint32(h>>10) & 0x1f
	if e == 0 {
		return math.Float32frombits(s | math.Float32bits(float32(m)*0x1p-24))
	}
	e += 112 + (e+1)>>5*112 // 1 … 30 -> 113 … 142; 31 (infinity, NaN) -> 255
	return math.Float32frombits(s | e<<23 | m<<13)
}

// slowF16 is what f32ToF16Fast returns for values it leaves to
// gpu.F32ToF16; that never produces it (its NaN is 0x7e00 or 0xfe00).
const slowF16 = 0xffff

// f32ToF16Fast is gpu.F32ToF16 (to nearest, ties to even) for values whose
// half is normal or overflows to infinity, and slowF16 for the others
// (subnormal halves, zeros, NaNs), so that it inlines.
func f32ToF16Fast(f float32) uint16 {
	u := math.Float32bits(f)
	a := u & 0x7fffffff
	if a-113<<23 >= 30<<23 { // exponent outside 2^-14 … 2^15
		return slowF16
	}
	a += 0xfff + a>>13&1 // round the mantissa to 10 bits; a carry bumps the exponent
	return uint16(u>>16)&0x8000 | uint16(a>>13-112<<10)
}

// f32ToF16 is gpu.F32ToF16.
func f32ToF16(f float32) uint16 {
	if h := f32ToF16Fast(f); h != slowF16 {
		return h
	}
	return gpu.F32ToF16(f)
}
