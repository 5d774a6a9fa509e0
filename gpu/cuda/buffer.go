package cuda

import (
	"fmt"
	"io/fs"
	"math"
	"unsafe"

	"github.com/troupe/troupe/gpu"
)

// Buffer is a device allocation holding Len elements of DType.
type Buffer struct {
	dev      *Device
	ptr      uint64 // device address; 0 for an empty buffer
	dt       gpu.DType
	n        int
	size     int // bytes allocated
	readOnly bool
	freed    bool
	parent   *Buffer // the allocation a view (Slice) shares; nil for an allocation
	ipcBase  uint64  // for memory of another process mapped by ImportIPC: the mapping to close; 0 otherwise
	// tmaps are the TMA descriptors encoded for the buffer (tensorMap), the
	// latest first: a weight's serve every step (a prompt's product and a
	// decode batch's box it differently), and ptr never changes.
	tmaps []tensorMapKey
	// coded is the weight's twin in the 12-bit code (Code), nil if none.
	coded *coded
}

// tensorMapKey is a TMA descriptor (raw) of a buffer as rows × k, in
// boxes of box rows.
type tensorMapKey struct {
	rows, k, box int
	raw          []byte
}

// dead reports whether b, or the allocation it views, was freed.
func (b *Buffer) dead() bool { return b.freed || (b.parent != nil && b.parent.freed) }

// DType implements gpu.Buffer.
func (b *Buffer) DType() gpu.DType { return b.dt }

// Len implements gpu.Buffer.
func (b *Buffer) Len() int { return b.n }

// Ptr is the buffer's device address, for peer copies and custom kernels.
func (b *Buffer) Ptr() uint64 { return b.ptr }

func readFile(fsys fs.FS, name string) ([]byte, error) { return fs.ReadFile(fsys, name) }

// buf checks that b is a live buffer of this device.
func (d *Device) buf(op, arg string, b gpu.Buffer) (*Buffer, error) {
	if b == nil {
		return nil, fmt.Errorf("%s: %s is nil", op, arg)
	}
	cb, ok := b.(*Buffer)
	if !ok || cb == nil {
		return nil, fmt.Errorf("%s: %s is a %T, not a cuda buffer", op, arg, b)
	}
	if cb.dev != d {
		return nil, fmt.Errorf("%s: %s belongs to another device", op, arg)
	}
	if cb.dead() {
		return nil, fmt.Errorf("%s: %s was freed", op, arg)
	}
	return cb, nil
}

func (d *Device) alloc(op string, dt gpu.DType, n int, zero bool) (*Buffer, error) {
	if dt.Size() == 0 {
		return nil, fmt.Errorf("%s: invalid dtype %s", op, dt)
	}
	if n < 0 || n > math.MaxInt/8 {
		return nil, fmt.Errorf("%s: invalid length %d", op, n)
	}
	b := &Buffer{dev: d, dt: dt, n: n, size: n * dt.Size()}
	if n > 0 {
		err := d.do(func() error {
			if err := d.drv.cuMemAlloc_v2.call(ptr(&b.ptr), uintptr(b.size)); err != nil {
				return err
			}
			if zero {
				return d.drv.cuMemsetD8Async.call(uintptr(b.ptr), 0, uintptr(b.size), d.stream)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %d %s elements: %w", op, n, dt, err)
		}
	}
	d.bufs[b] = struct{}{}
	return b, nil
}

// Alloc implements gpu.Device; the zeroing is stream-ordered (recorded in
// a graph when called while recording).
func (d *Device) Alloc(dt gpu.DType, n int) (gpu.Buffer, error) {
	if err := d.enter("alloc"); err != nil {
		return nil, err
	}
	defer d.leave()
	return d.alloc("alloc", dt, n, true)
}

// Weights implements gpu.Device: data is copied to device memory before
// Weights returns; the caller may reuse data at once.
func (d *Device) Weights(dt gpu.DType, data []byte) (gpu.Buffer, error) {
	if err := d.enter("weights"); err != nil {
		return nil, err
	}
	defer d.leave()
	if dt.Size() == 0 {
		return nil, fmt.Errorf("weights: invalid dtype %s", dt)
	}
	if len(data)%dt.Size() != 0 {
		return nil, fmt.Errorf("weights: %d bytes is not a whole number of %s elements", len(data), dt)
	}
	return d.constant("weights", dt, data)
}

// constant allocates read-only memory holding data, elements of dt, copied
// before it returns.
func (d *Device) constant(op string, dt gpu.DType, data []byte) (*Buffer, error) {
	b, err := d.alloc(op, dt, len(data)/dt.Size(), false)
	if err != nil {
		return nil, err
	}
	b.readOnly = true
	if len(data) > 0 {
		if err := d.do(func() error { return d.upload(b.ptr, data) }); err != nil {
			d.freeNow(b)
			return nil, fmt.Errorf("%s: copy %d bytes: %w", op, len(data), err)
		}
	}
	return b, nil
}

// Free implements gpu.Device. The memory is released once the work issued
// before Free has finished (after recording ends, when called while
// recording a graph).
func (d *Device) Free(b gpu.Buffer) {
	if d.enter("free") != nil {
		return
	}
	defer d.leave()
	cb, err := d.buf("free", "b", b)
	if err != nil {
		return
	}
	if cb.parent != nil { // a view releases nothing
		cb.freed = true
		return
	}
	cb.freed = true
	if d.capture {
		d.deferred = append(d.deferred, cb)
		return
	}
	d.freeNow(cb)
}

func (d *Device) freeNow(b *Buffer) {
	b.freed = true
	delete(d.bufs, b)
	if b.coded != nil {
		d.freeCoded(b)
	}
	if l := d.drawn[b]; l != nil {
		delete(d.drawn, b)
		d.freeNow(l.e)
		d.freeNow(l.meta)
	}
	if b.ptr == 0 {
		return
	}
	p, mapped := b.ptr, b.ipcBase
	d.post(func() error {
		if err := d.drv.cuStreamSynchronize.call(d.stream); err != nil {
			return err
		}
		if mapped != 0 {
			return d.drv.cuIpcCloseMemHandle.call(uintptr(mapped))
		}
		return d.drv.cuMemFree_v2.call(uintptr(p))
	})
}

func span(op string, b *Buffer, off, nbytes int) error {
	sz := b.dt.Size()
	if nbytes%sz != 0 || off < 0 || off > b.n || nbytes/sz > b.n-off {
		return fmt.Errorf("%s: %d bytes at element %d outside a %d-element %s buffer", op, nbytes, off, b.n, b.dt)
	}
	return nil
}

// Write implements gpu.Device. Small writes are copied and queued without
// waiting; writes larger than half the staging buffer wait until src has
// been staged. Writing is refused while recording a graph: a recorded copy
// would replay stale staging memory.
func (d *Device) Write(b gpu.Buffer, off int, src []byte) error {
	if err := d.enter("write"); err != nil {
		return err
	}
	defer d.leave()
	cb, err := d.buf("write", "b", b)
	if err != nil {
		return err
	}
	if cb.readOnly {
		return fmt.Errorf("write: buffer is read-only weights")
	}
	if err := span("write", cb, off, len(src)); err != nil {
		return err
	}
	return d.write(cb, off, src)
}

// write copies src to cb from element off, stream-ordered (Write's
// checks done). d.mu held.
func (d *Device) write(cb *Buffer, off int, src []byte) error {
	if d.capture {
		return fmt.Errorf("write: not allowed while recording a graph (write before Launch instead)")
	}
	if len(src) == 0 {
		return nil
	}
	dst := cb.ptr + uint64(off*cb.dt.Size())
	if len(src) <= d.cfg.StagingBytes/2 {
		c := append([]byte(nil), src...)
		d.post(func() error { return d.upload(dst, c) })
		return nil
	}
	return d.do(func() error { return d.upload(dst, src) })
}

// upload copies src to device address dst through the pinned staging
// halves, asynchronously on the stream; it returns once src is staged.
// Device's thread only.
func (d *Device) upload(dst uint64, src []byte) error {
	half := d.cfg.StagingBytes / 2
	for len(src) > 0 {
		n := min(len(src), half)
		h := &d.halves[d.cur]
		if h.used+n > half {
			// Leaving the half: its event marks the end of the copies
			// from it, and the other half's the end of its own.
			if err := d.drv.cuEventRecord.call(h.ev, d.stream); err != nil {
				return err
			}
			d.cur ^= 1
			h = &d.halves[d.cur]
			if err := d.drv.cuEventSynchronize.call(h.ev); err != nil {
				return err
			}
			h.used = 0
		}
		host := unsafe.Add(d.staging, d.cur*half+h.used)
		copy(unsafe.Slice((*byte)(host), n), src[:n])
		if mapped := d.stageDev + uint64(d.cur*half+h.used); wordCopy(dst, mapped, n) {
			if err := d.copyWords(dst, mapped, n/4); err != nil {
				return err
			}
		} else if err := d.drv.cuMemcpyHtoDAsync_v2.call(uintptr(dst), uintptr(host), uintptr(n), d.stream); err != nil {
			return err
		}
		h.used += (n + 255) &^ 255
		dst += uint64(n)
		src = src[n:]
	}
	return nil
}

// Read implements gpu.Device: it waits for all issued work, then copies.
// It returns the first error the issued work met.
func (d *Device) Read(dst []byte, b gpu.Buffer, off int) error {
	if err := d.enter("read"); err != nil {
		return err
	}
	defer d.leave()
	cb, err := d.buf("read", "b", b)
	if err != nil {
		return err
	}
	if err := span("read", cb, off, len(dst)); err != nil {
		return err
	}
	if d.capture {
		return fmt.Errorf("read: not allowed while recording a graph")
	}
	src := cb.ptr + uint64(off*cb.dt.Size())
	return d.do(func() error {
		half := d.cfg.StagingBytes / 2
		out := dst
		for len(out) > 0 {
			n := min(len(out), 2*half)
			if err := d.drv.cuMemcpyDtoHAsync_v2.call(uintptr(d.staging), uintptr(src), uintptr(n), d.stream); err != nil {
				return fmt.Errorf("read: %w", err)
			}
			if err := d.syncStream(); err != nil {
				return fmt.Errorf("read: %w", err)
			}
			copy(out[:n], unsafe.Slice((*byte)(d.staging), n))
			out = out[n:]
			src += uint64(n)
		}
		if len(dst) == 0 {
			if err := d.syncStream(); err != nil {
				return fmt.Errorf("read: %w", err)
			}
		}
		return d.takeErr()
	})
}

// lateSlotBytes is what a ReadLater slot holds at first: token ids and
// the like. A slot grows, while no read is pending on it, to hold a larger
// read (logits rows).
const lateSlotBytes = 4096

// lateSlot is pinned host memory a ReadLater copies into, and the event
// that marks the copy done.
type lateSlot struct {
	host    unsafe.Pointer
	dev     uint64 // host's address on the device
	size    int
	ev      uintptr
	pending bool
}

// lateSpan is one copy of a late read: n bytes from device address src
// to offset at of its slot.
type lateSpan struct {
	src   uint64
	at, n int
}

// ReadLater implements gpu.LateReader: the copy goes into one of
// gpu.MaxLateReads pinned slots behind the work issued so far, and wait
// blocks on that copy's event alone.
func (d *Device) ReadLater(dst []byte, b gpu.Buffer, off int) (func() error, error) {
	const op = "read later"
	return d.readLater(op, dst, b, func(cb *Buffer) ([]lateSpan, error) {
		if err := span(op, cb, off, len(dst)); err != nil {
			return nil, err
		}
		return []lateSpan{{src: cb.ptr + uint64(off*cb.dt.Size()), n: len(dst)}}, nil
	})
}

// ReadRowsLater implements gpu.LateReader: one copy a run of consecutive
// rows into one slot, and one event.
func (d *Device) ReadRowsLater(dst []byte, b gpu.Buffer, rows []int32, width int) (func() error, error) {
	const op = "read rows later"
	return d.readLater(op, dst, b, func(cb *Buffer) ([]lateSpan, error) {
		row, err := gpu.RowBytes(len(dst), rows, width, cb.dt)
		if err != nil {
			return nil, err
		}
		var spans []lateSpan
		for i, r := range rows {
			if err := span(op, cb, int(r)*width, row); err != nil {
				return nil, err
			}
			src := cb.ptr + uint64(int(r)*row)
			if k := len(spans) - 1; k >= 0 && spans[k].src+uint64(spans[k].n) == src {
				spans[k].n += row
				continue
			}
			spans = append(spans, lateSpan{src: src, at: i * row, n: row})
		}
		return spans, nil
	})
}

// readLater queues the copies spans gives of b into a free slot, grown to
// len(dst) bytes where it holds fewer, and returns the wait that copies the
// slot into dst.
func (d *Device) readLater(op string, dst []byte, b gpu.Buffer, spans func(cb *Buffer) ([]lateSpan, error)) (func() error, error) {
	if err := d.enter(op); err != nil {
		return nil, err
	}
	defer d.leave()
	cb, err := d.buf(op, "b", b)
	if err != nil {
		return nil, err
	}
	copies, err := spans(cb)
	if err != nil {
		return nil, err
	}
	if d.capture {
		return nil, fmt.Errorf("%s: not allowed while recording a graph", op)
	}
	// The least free slot that holds dst, else the largest, to grow.
	fits := func(c *lateSlot) bool { return c.size >= len(dst) }
	better := func(c, s *lateSlot) bool {
		switch {
		case fits(c) != fits(s):
			return fits(c)
		case fits(c):
			return c.size < s.size
		}
		return c.size > s.size
	}
	var s *lateSlot
	for i := range d.late {
		if c := &d.late[i]; !c.pending && (s == nil || better(c, s)) {
			s = c
		}
	}
	if s == nil {
		return nil, fmt.Errorf("%s: %d reads are pending already", op, len(d.late))
	}
	if s.size < len(dst) {
		if err := d.do(func() error { return d.growLate(s, len(dst)) }); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	s.pending = true
	d.post(func() error {
		for _, c := range copies {
			if wordCopy(s.dev+uint64(c.at), c.src, c.n) {
				if err := d.copyWords(s.dev+uint64(c.at), c.src, c.n/4); err != nil {
					return fmt.Errorf("%s: %w", op, err)
				}
			} else if err := d.drv.cuMemcpyDtoHAsync_v2.call(uintptr(s.host)+uintptr(c.at), uintptr(c.src), uintptr(c.n), d.stream); err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
		}
		return d.drv.cuEventRecord.call(s.ev, d.stream)
	})
	done := false
	return func() error {
		if err := d.enter(op); err != nil {
			return err
		}
		defer d.leave()
		if done {
			return fmt.Errorf("%s: waited for twice", op)
		}
		done = true
		defer func() { s.pending = false }()
		return d.do(func() error {
			// An event never recorded (its copy failed to queue) is
			// complete at once; the queued error then says why.
			if err := d.drv.cuEventSynchronize.call(s.ev); err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
			gpu.CopyRows(dst, unsafe.Slice((*byte)(s.host), len(dst)))
			return d.takeErr()
		})
	}, nil
}

// growLate replaces s's pinned memory with at least n bytes; no copy is
// pending on it. Device's thread only.
func (d *Device) growLate(s *lateSlot, n int) error {
	size := max(n, 2*s.size, lateSlotBytes)
	var host unsafe.Pointer
	var dev uint64
	if err := d.drv.cuMemHostAlloc.call(ptr(&host), uintptr(size), hostAllocPortable|hostAllocDeviceMap); err != nil {
		return fmt.Errorf("pinned read slot of %d bytes: %w", size, err)
	}
	if err := d.drv.cuMemHostGetDevicePointer_v2.call(ptr(&dev), uintptr(host), 0); err != nil {
		_ = d.drv.cuMemFreeHost.call(uintptr(host))
		return err
	}
	if s.host != nil {
		_ = d.drv.cuMemFreeHost.call(uintptr(s.host))
	}
	s.host, s.dev, s.size = host, dev, size
	return nil
}
