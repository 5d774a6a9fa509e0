package cuda

import (
	"fmt"

	"github.com/troupe/troupe/gpu"
)

var _ gpu.Packer = (*Device)(nil)
var _ gpu.ResidualNormer = (*Device)(nil)

// sliceAlign is the alignment, in bytes, of a view's start: the kernels
// read weights and activations with 16-byte loads.
const sliceAlign = 16

// Slice implements gpu.Slicer: a view of n elements of b from element off,
// sharing b's memory. The view's start must be 16-byte aligned. Freeing the
// view releases nothing; freeing b ends the view too.
func (d *Device) Slice(b gpu.Buffer, off, n int) (gpu.Buffer, error) {
	if err := d.enter("slice"); err != nil {
		return nil, err
	}
	defer d.leave()
	cb, err := d.buf("slice", "b", b)
	if err != nil {
		return nil, err
	}
	if off < 0 || n < 0 || off > cb.n || n > cb.n-off {
		return nil, fmt.Errorf("slice: elements [%d, %d) outside a %d-element %s buffer", off, off+n, cb.n, cb.dt)
	}
	sz := cb.dt.Size()
	if (cb.ptr+uint64(off*sz))%sliceAlign != 0 {
		return nil, fmt.Errorf("slice: element %d of %s starts %d bytes in, not a multiple of %d", off, cb.dt, off*sz, sliceAlign)
	}
	root := cb
	if cb.parent != nil {
		root = cb.parent
	}
	v := &Buffer{dev: d, dt: cb.dt, n: n, size: n * sz, readOnly: cb.readOnly, parent: root}
	if n > 0 {
		v.ptr = cb.ptr + uint64(off*sz)
	}
	return v, nil
}

// Pack implements gpu.Packer: one read-only allocation holding parts back
// to back, copied before Pack returns.
func (d *Device) Pack(dt gpu.DType, parts ...[]byte) (gpu.Buffer, error) {
	if err := d.enter("pack"); err != nil {
		return nil, err
	}
	defer d.leave()
	if dt.Size() == 0 {
		return nil, fmt.Errorf("pack: invalid dtype %s", dt)
	}
	total := 0
	for i, p := range parts {
		if len(p)%dt.Size() != 0 {
			return nil, fmt.Errorf("pack: part %d: %d bytes is not a whole number of %s elements", i, len(p), dt)
		}
		total += len(p)
	}
	b, err := d.alloc("pack", dt, total/dt.Size(), false)
	if err != nil {
		return nil, err
	}
	b.readOnly = true
	dst := b.ptr
	for i, p := range parts {
		if len(p) == 0 {
			continue
		}
		if err := d.do(func() error { return d.upload(dst, p) }); err != nil {
			d.freeNow(b)
			return nil, fmt.Errorf("pack: part %d: copy %d bytes: %w", i, len(p), err)
		}
		dst += uint64(len(p))
	}
	return b, nil
}
