package cpu

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/host"
)

// Device is the CPU lane. Its memory is host memory; its operations run on
// a pool of Threads goroutines (see the package documentation).
type Device struct {
	host.Memory
	cfg     Config
	k       *kernels
	pool    *pool
	scratch []scratch // per thread, indexed by tid
	// Attention's workspace, reused between calls: tile starts, the
	// sequences' widened keys and values, and each tile's span.
	tiles    []int32
	spans    []kvSpan
	wide     []float32
	tileSpan []int32
	wideMax  int // the most floats widened ahead (flashWideMax)
	closed   bool
}

var (
	_ gpu.Device   = (*Device)(nil)
	_ gpu.Argmaxer = (*Device)(nil)
)

// scratch is one thread's reusable workspace.
type scratch struct {
	buf   []float32
	buf64 []float64
	_     [16]byte // keep threads' headers on separate cache lines
}

// get returns n elements of the workspace, starting on a 64-byte boundary
// (a cache line, so that the kernels' vector loads split no lines); their
// contents are undefined.
func (s *scratch) get(n int) []float32 {
	if len(s.buf) < n {
		buf := make([]float32, n+n/4+16)
		off := int(-uintptr(unsafe.Pointer(&buf[0])) % 64 / 4)
		s.buf = buf[off : off+n+n/4]
	}
	return s.buf[:n]
}

// get64 returns n elements of the float64 workspace; their contents are
// undefined.
func (s *scratch) get64(n int) []float64 {
	if len(s.buf64) < n {
		s.buf64 = make([]float64, n)
	}
	return s.buf64[:n]
}

// New starts a Device with cfg's threads, using the assembly kernels when
// the processor supports them.
func New(cfg Config) (*Device, error) {
	return newDevice(cfg, fastKernels())
}

func newDevice(cfg Config, k *kernels) (*Device, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cpu: new: %w", err)
	}
	n := cfg.threads()
	return &Device{
		cfg:     cfg,
		k:       k,
		pool:    newPool(n, cfg.Spin),
		scratch: make([]scratch, n),
		wideMax: flashWideMax,
	}, nil
}

// Name implements gpu.Device.
func (d *Device) Name() string {
	return fmt.Sprintf("cpu (%d threads, %s)", d.pool.threads, d.k.name)
}

// Threads returns how many threads share each operation.
func (d *Device) Threads() int { return d.pool.threads }

// Close implements gpu.Device: it stops the worker goroutines and waits for
// them. Host buffers stay readable; further operations fail.
func (d *Device) Close() error {
	d.closed = true
	d.pool.close()
	return nil
}

var errClosed = errors.New("device is closed")

// maxArgs is the most buffers an operation takes.
const maxArgs = 7

// args resolves op's buffers to host buffers and checks the device is open.
// It returns an array, not a slice, so that no operation allocates for it.
func (d *Device) args(op string, bs ...gpu.Buffer) ([maxArgs]*host.Buffer, error) {
	var out [maxArgs]*host.Buffer
	if d.closed {
		return out, fmt.Errorf("%s: %w", op, errClosed)
	}
	for i, b := range bs {
		if b == nil {
			return out, fmt.Errorf("%s: buffer %d is nil", op, i)
		}
		hb, err := host.Of(op, b)
		if err != nil {
			return out, err
		}
		out[i] = hb
	}
	return out, nil
}

// f32 checks that b is an F32 buffer of at least n elements and views it.
func f32(op, arg string, b *host.Buffer, n int) ([]float32, error) {
	if err := gpu.CheckLen(op, arg, b, n); err != nil {
		return nil, err
	}
	if b.DType() != gpu.F32 {
		return nil, fmt.Errorf("%s: %s is %s, want f32", op, arg, b.DType())
	}
	return b.F32(), nil
}

// i32 checks that b is an I32 buffer of at least n elements and views it.
func i32(op, arg string, b *host.Buffer, n int) ([]int32, error) {
	if err := gpu.CheckLen(op, arg, b, n); err != nil {
		return nil, err
	}
	if b.DType() != gpu.I32 {
		return nil, fmt.Errorf("%s: %s is %s, want i32", op, arg, b.DType())
	}
	return b.I32(), nil
}

// mat is a row-major matrix of floats in one of the weight dtypes.
type mat struct {
	dt gpu.DType
	f  []float32 // F32
	h  []uint16  // BF16, F16
}

func matOf(op, arg string, b *host.Buffer, n int) (mat, error) {
	if err := gpu.CheckLen(op, arg, b, n); err != nil {
		return mat{}, err
	}
	switch b.DType() {
	case gpu.F32:
		return mat{dt: gpu.F32, f: b.F32()}, nil
	case gpu.BF16, gpu.F16:
		return mat{dt: b.DType(), h: b.U16()}, nil
	}
	return mat{}, fmt.Errorf("%s: %s has dtype %s, want a float type", op, arg, b.DType())
}

// gemv2 is gemv for two rows of x: out0 from x0, out1 from x1, each the
// bits gemv gives, the weights read once for both.
func (w mat) gemv2(k *kernels, out0, out1, x0, x1 []float32, kdim, r0 int) {
	switch w.dt {
	case gpu.F32:
		k.gemv2F32(out0, out1, x0, x1, w.f[r0*kdim:], kdim, len(out0), kdim)
	case gpu.BF16:
		k.gemv2BF16(out0, out1, x0, x1, w.h[r0*kdim:], kdim, len(out0), kdim)
	case gpu.F16:
		k.gemv2F16(out0, out1, x0, x1, w.h[r0*kdim:], kdim, len(out0), kdim)
	}
}

// gemv sets out[r] = x[:k] · row (r0+r) of w for r < len(out).
func (w mat) gemv(k *kernels, out, x []float32, kdim, r0 int) {
	switch w.dt {
	case gpu.F32:
		k.gemvF32(out, x, w.f[r0*kdim:], kdim, len(out), kdim)
	case gpu.BF16:
		k.gemvBF16(out, x, w.h[r0*kdim:], kdim, len(out), kdim)
	case gpu.F16:
		k.gemvF16(out, x, w.h[r0*kdim:], kdim, len(out), kdim)
	}
}

// row widens elements [off, off+len(dst)) of w into dst.
func (w mat) row(k *kernels, dst []float32, off int) {
	switch w.dt {
	case gpu.F32:
		copy(dst, w.f[off:off+len(dst)])
	case gpu.BF16:
		k.cvtBF16(dst, w.h[off:off+len(dst)])
	case gpu.F16:
		k.cvtF16(dst, w.h[off:off+len(dst)])
	}
}

// floats returns the first n elements of w as f32: w's own slice when it
// holds f32, else a widened copy.
func (w mat) floats(k *kernels, n int) []float32 {
	if w.dt == gpu.F32 {
		return w.f[:n]
	}
	dst := make([]float32, n)
	w.row(k, dst, 0)
	return dst
}

func checkDims(op string, dims ...int) error {
	for _, v := range dims {
		if v < 0 {
			return fmt.Errorf("%s: negative dimension in %v", op, dims)
		}
	}
	return nil
}
