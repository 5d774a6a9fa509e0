package host

import (
	"context"
	"fmt"
	"math"
	"unsafe"

	"github.com/troupe/troupe/gpu"
)

// Buffer is host memory holding n elements of one dtype.
type Buffer struct {
	dt       gpu.DType
	n        int
	raw      []byte
	readOnly bool
	// Drawn are the draws (gpu.SampleRow, each row's list resolved) whose
	// tokens a device's Sample last wrote here, for rows that follow them.
	Drawn []gpu.SampleRow
}

// DType implements gpu.Buffer.
func (b *Buffer) DType() gpu.DType { return b.dt }

// Len implements gpu.Buffer.
func (b *Buffer) Len() int { return b.n }

// Bytes returns the buffer's raw storage.
func (b *Buffer) Bytes() []byte { return b.raw }

// F32 views the buffer as float32s; it panics unless the dtype is F32.
func (b *Buffer) F32() []float32 {
	b.must(gpu.F32)
	if b.n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b.raw[0])), b.n)
}

// I32 views the buffer as int32s; it panics unless the dtype is I32.
func (b *Buffer) I32() []int32 {
	b.must(gpu.I32)
	if b.n == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&b.raw[0])), b.n)
}

// U16 views a BF16 or F16 buffer as its raw 16-bit elements.
func (b *Buffer) U16() []uint16 {
	if b.dt != gpu.BF16 && b.dt != gpu.F16 {
		panic(fmt.Sprintf("host: U16 of a %s buffer", b.dt))
	}
	if b.n == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b.raw[0])), b.n)
}

func (b *Buffer) must(dt gpu.DType) {
	if b.dt != dt {
		panic(fmt.Sprintf("host: %s view of a %s buffer", dt, b.dt))
	}
}

// Float returns element i converted to float64, for any float dtype.
func (b *Buffer) Float(i int) float64 {
	switch b.dt {
	case gpu.F32:
		return float64(b.F32()[i])
	case gpu.BF16:
		return float64(gpu.BF16ToF32(b.U16()[i]))
	case gpu.F16:
		return float64(gpu.F16ToF32(b.U16()[i]))
	case gpu.I32:
		return float64(b.I32()[i])
	}
	panic("host: Float of an invalid buffer")
}

// Of returns b as a host Buffer, or an error naming op when it belongs to
// another device.
func Of(op string, b gpu.Buffer) (*Buffer, error) {
	hb, ok := b.(*Buffer)
	if !ok || hb == nil {
		return nil, fmt.Errorf("%s: buffer %T is not host memory", op, b)
	}
	return hb, nil
}

// Memory implements the memory half of gpu.Device over host buffers.
type Memory struct{}

// Alloc implements gpu.Device.
func (Memory) Alloc(dt gpu.DType, n int) (gpu.Buffer, error) {
	if dt.Size() == 0 {
		return nil, fmt.Errorf("alloc: invalid dtype %s", dt)
	}
	if n < 0 || n > math.MaxInt/8 {
		return nil, fmt.Errorf("alloc: invalid length %d", n)
	}
	// Back every buffer with 8-byte aligned storage.
	words := make([]uint64, (n*dt.Size()+7)/8)
	var raw []byte
	if len(words) > 0 {
		raw = unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), n*dt.Size())
	}
	return &Buffer{dt: dt, n: n, raw: raw}, nil
}

// Weights implements gpu.Device without copying data when it is aligned.
func (m Memory) Weights(dt gpu.DType, data []byte) (gpu.Buffer, error) {
	if dt.Size() == 0 {
		return nil, fmt.Errorf("weights: invalid dtype %s", dt)
	}
	if len(data)%dt.Size() != 0 {
		return nil, fmt.Errorf("weights: %d bytes is not a whole number of %s elements", len(data), dt)
	}
	n := len(data) / dt.Size()
	if len(data) > 0 && uintptr(unsafe.Pointer(&data[0]))%uintptr(dt.Size()) != 0 {
		b, err := m.Alloc(dt, n)
		if err != nil {
			return nil, err
		}
		copy(b.(*Buffer).raw, data)
		b.(*Buffer).readOnly = true
		return b, nil
	}
	return &Buffer{dt: dt, n: n, raw: data, readOnly: true}, nil
}

// Free implements gpu.Device; host memory is reclaimed by the collector.
func (Memory) Free(gpu.Buffer) {}

// Write implements gpu.Device.
func (Memory) Write(b gpu.Buffer, off int, src []byte) error {
	hb, err := Of("write", b)
	if err != nil {
		return err
	}
	if hb.readOnly {
		return fmt.Errorf("write: buffer is read-only weights")
	}
	sz := hb.dt.Size()
	if len(src)%sz != 0 || off < 0 || off > hb.n || len(src)/sz > hb.n-off {
		return fmt.Errorf("write: %d bytes at element %d outside a %d-element %s buffer", len(src), off, hb.n, hb.dt)
	}
	copy(hb.raw[off*sz:], src)
	return nil
}

// Read implements gpu.Device.
func (Memory) Read(dst []byte, b gpu.Buffer, off int) error {
	hb, err := Of("read", b)
	if err != nil {
		return err
	}
	sz := hb.dt.Size()
	if len(dst)%sz != 0 || off < 0 || off > hb.n || len(dst)/sz > hb.n-off {
		return fmt.Errorf("read: %d bytes at element %d outside a %d-element %s buffer", len(dst), off, hb.n, hb.dt)
	}
	copy(dst, hb.raw[off*sz:])
	return nil
}

// Sync implements gpu.Device; host work is synchronous.
func (Memory) Sync(ctx context.Context) error { return ctx.Err() }

// ReadLater implements gpu.LateReader: host work is done when issued, so
// the copy is made at once.
func (m Memory) ReadLater(dst []byte, b gpu.Buffer, off int) (func() error, error) {
	if err := m.Read(dst, b, off); err != nil {
		return nil, err
	}
	return func() error { return nil }, nil
}

// ReadRowsLater implements gpu.LateReader: the rows are copied at once.
func (m Memory) ReadRowsLater(dst []byte, b gpu.Buffer, rows []int32, width int) (func() error, error) {
	hb, err := Of("read", b)
	if err != nil {
		return nil, err
	}
	row, err := gpu.RowBytes(len(dst), rows, width, hb.dt)
	if err != nil {
		return nil, err
	}
	for i, r := range rows {
		if err := m.Read(dst[i*row:(i+1)*row], b, int(r)*width); err != nil {
			return nil, err
		}
	}
	return func() error { return nil }, nil
}
