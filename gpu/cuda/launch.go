package cuda

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/troupe/troupe/gpu"
)

// kernel is a resolved kernel entry point.
type kernel struct {
	name string
	fn   uintptr
	// shmem is the dynamic shared memory the kernel has been allowed
	// beyond the default 48 KiB.
	shmem int
	// occ is how many blocks of the kernel fit on an SM at once, asked of
	// the driver at the block occupancyShape gives (0 for other kernels).
	occ int
	// threads is the most threads a block of the kernel may have, as
	// its registers allow (the driver's answer at Open).
	threads int
}

// defaultShmem is the dynamic shared memory a launch may use without
// raising the kernel's limit.
const defaultShmem = 48 << 10

type dim3 struct{ x, y, z uint32 }

func grid1(x int) dim3 { return dim3{uint32(x), 1, 1} }

type argKind uint8

const (
	argBuf argKind = iota + 1
	argI32
	argF32
	argDevPtr
	argRaw
	argTable
)

// arg is one typed kernel argument.
type arg struct {
	kind  argKind
	name  string
	buf   *Buffer
	off   int       // first element of a buffer span
	n     int       // elements of a buffer span (each table entry)
	dt    gpu.DType // required element type of a buffer; 0 for any
	v     uint64
	raw   []byte
	table []*Buffer
	slots int // entries of a pointer table
}

// bufArg passes the address of b's elements [0, n), which must be of type dt.
func bufArg(name string, b *Buffer, dt gpu.DType, n int) arg {
	return arg{kind: argBuf, name: name, buf: b, dt: dt, n: n}
}

func i32Arg(v int) arg     { return arg{kind: argI32, v: uint64(uint32(int32(v)))} }
func f32Arg(v float32) arg { return arg{kind: argF32, v: uint64(math.Float32bits(v))} }

// devPtrArg passes a device address the device owns (the fault word).
func devPtrArg(p uint64) arg { return arg{kind: argDevPtr, v: p} }

// rawArg passes a C struct by value; raw must follow the kernel's layout.
func rawArg(raw []byte) arg { return arg{kind: argRaw, raw: raw} }

// tableArg passes a struct of slots device pointers, one per buffer of
// bs (each checked to hold n elements of dt), the rest null.
func tableArg(name string, bs []*Buffer, dt gpu.DType, n, slots int) arg {
	return arg{kind: argTable, name: name, table: bs, dt: dt, n: n, slots: slots}
}

const maxArgs = 20

// launchCmd holds a launch's packed parameters until the driver has
// copied them.
type launchCmd struct {
	fn    uintptr
	grid  dim3
	block dim3
	shmem uint32
	vals  [maxArgs]uint64
	ptrs  [maxArgs]unsafe.Pointer
	blobs [][]byte
	// For cuLaunchKernelEx.
	cfg  launchConfig
	attr launchAttr
}

// launchConfig is CUlaunchConfig.
type launchConfig struct {
	gridX, gridY, gridZ    uint32
	blockX, blockY, blockZ uint32
	shmem                  uint32
	_                      uint32
	stream                 uintptr
	attrs                  *launchAttr
	numAttrs               uint32
	_                      uint32
}

// launchAttr is CUlaunchAttribute: an id, padding, and a 64-byte union.
type launchAttr struct {
	id  uint32
	_   uint32
	val [64]byte
}

// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the kernel may
// start before the previous kernel on the stream has finished; it waits
// for it with griddepcontrol.wait (pdl_begin in kernels/cuda/common.cuh).
const launchAttrProgrammatic = 6

// overlapped fills l's extended configuration for a programmatic
// dependent launch on stream.
func (l *launchCmd) overlapped(stream uintptr) {
	l.attr = launchAttr{id: launchAttrProgrammatic}
	l.attr.val[0] = 1 // programmaticStreamSerializationAllowed
	l.cfg = launchConfig{
		gridX: l.grid.x, gridY: l.grid.y, gridZ: l.grid.z,
		blockX: l.block.x, blockY: l.block.y, blockZ: l.block.z,
		shmem: l.shmem, stream: stream, attrs: &l.attr, numAttrs: 1,
	}
}

// checkSpan refuses a buffer argument whose span lies outside its
// allocation, before anything reaches the GPU.
func (d *Device) checkSpan(k string, name string, b *Buffer, dt gpu.DType, off, n int) error {
	switch {
	case b == nil:
		return fmt.Errorf("cuda: launch %s: argument %s is nil", k, name)
	case b.dev != d:
		return fmt.Errorf("cuda: launch %s: argument %s belongs to another device", k, name)
	case b.dead():
		return fmt.Errorf("cuda: launch %s: argument %s was freed", k, name)
	case dt != 0 && b.dt != dt:
		return fmt.Errorf("cuda: launch %s: argument %s holds %s, the kernel reads %s", k, name, b.dt, dt)
	case off < 0 || n < 0 || (off+n)*b.dt.Size() > b.size:
		return fmt.Errorf("cuda: launch %s: argument %s: elements [%d, %d) of %s (%d bytes) exceed its %d-byte allocation",
			k, name, off, off+n, b.dt, (off+n)*b.dt.Size(), b.size)
	}
	return nil
}

// launch checks and packs args and queues the kernel on the stream.
func (d *Device) launch(k *kernel, grid, block dim3, shmem int, args ...arg) error {
	if k == nil {
		return fmt.Errorf("cuda: launch: no such kernel")
	}
	if err := d.flushSum(); err != nil {
		return err
	}
	if len(args) > maxArgs {
		return fmt.Errorf("cuda: launch %s: %d arguments, at most %d", k.name, len(args), maxArgs)
	}
	if grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 {
		return fmt.Errorf("cuda: launch %s: grid %v out of range", k.name, grid)
	}
	if threads := block.x * block.y * block.z; threads == 0 || threads > 1024 || (k.threads > 0 && int(threads) > k.threads) {
		return fmt.Errorf("cuda: launch %s: block %v out of range (the kernel takes up to %d threads)", k.name, block, k.threads)
	}
	if shmem > defaultShmem && shmem > d.info.SharedOptin {
		return fmt.Errorf("cuda: launch %s: %d bytes of shared memory a block; %s allows %d", k.name, shmem, d.info.Name, d.info.SharedOptin)
	}
	if shmem > defaultShmem && shmem > k.shmem {
		fn := k.fn
		d.post(func() error {
			if err := d.drv.allowShmem(fn, shmem); err != nil {
				return fmt.Errorf("cuda: launch %s: %w", k.name, err)
			}
			return nil
		})
		k.shmem = shmem
	}
	l := &launchCmd{fn: k.fn, grid: grid, block: block, shmem: uint32(shmem)}
	for i, a := range args {
		switch a.kind {
		case argBuf:
			if err := d.checkSpan(k.name, a.name, a.buf, a.dt, a.off, a.n); err != nil {
				return err
			}
			l.vals[i] = a.buf.ptr + uint64(a.off*a.buf.dt.Size())
			l.ptrs[i] = unsafe.Pointer(&l.vals[i])
		case argI32, argF32, argDevPtr:
			l.vals[i] = a.v
			l.ptrs[i] = unsafe.Pointer(&l.vals[i])
		case argRaw:
			if len(a.raw) == 0 {
				return fmt.Errorf("cuda: launch %s: argument %d: empty struct", k.name, i)
			}
			blob := append([]byte(nil), a.raw...)
			l.blobs = append(l.blobs, blob)
			l.ptrs[i] = unsafe.Pointer(&blob[0])
		case argTable:
			if len(a.table) > a.slots {
				return fmt.Errorf("cuda: launch %s: argument %s: %d buffers, at most %d", k.name, a.name, len(a.table), a.slots)
			}
			blob := make([]byte, 8*a.slots)
			for j, b := range a.table {
				if err := d.checkSpan(k.name, fmt.Sprintf("%s[%d]", a.name, j), b, a.dt, 0, a.n); err != nil {
					return err
				}
				*(*uint64)(unsafe.Pointer(&blob[8*j])) = b.ptr
			}
			l.blobs = append(l.blobs, blob)
			l.ptrs[i] = unsafe.Pointer(&blob[0])
		default:
			return fmt.Errorf("cuda: launch %s: argument %d has no type", k.name, i)
		}
	}
	d.post(func() error {
		if err := d.enqueue(l); err != nil {
			return fmt.Errorf("cuda: launch %s: %w", k.name, err)
		}
		return nil
	})
	return nil
}

// enqueue hands a packed launch to the driver, on the stream, overlapped
// with the kernel ahead where the device allows. Device's thread only.
func (d *Device) enqueue(l *launchCmd) error {
	var err error
	if d.info.Overlap {
		l.overlapped(d.stream)
		err = d.drv.cuLaunchKernelEx.call(uintptr(unsafe.Pointer(&l.cfg)), l.fn, uintptr(unsafe.Pointer(&l.ptrs[0])), 0)
	} else {
		err = d.drv.cuLaunchKernel.call(l.fn,
			uintptr(l.grid.x), uintptr(l.grid.y), uintptr(l.grid.z),
			uintptr(l.block.x), uintptr(l.block.y), uintptr(l.block.z),
			uintptr(l.shmem), d.stream, uintptr(unsafe.Pointer(&l.ptrs[0])), 0)
	}
	runtime.KeepAlive(l)
	return err
}

// Copies of up to smallCopyBytes between the host and the device, in whole
// 32-bit words, run as copy_words over mapped pinned memory rather than on
// the copy engine: a step's index upload and the read of its chosen tokens
// then pass between two recorded steps as two short kernels. The copy
// engine's two turns there had cost an OLMo-2-1B step about 17 µs;
// the kernels win back 13 of them (docs/cuda.md).
const smallCopyBytes = 256 << 10

// wordCopy reports whether n bytes between a and b go by copyWords.
func wordCopy(a, b uint64, n int) bool {
	return n > 0 && n <= smallCopyBytes && n%4 == 0 && a%4 == 0 && b%4 == 0
}

// copyWords queues copy_words: n 32-bit words from src to dst, device
// addresses of which either may be mapped host memory. Device's thread
// only.
func (d *Device) copyWords(dst, src uint64, n int) error {
	k := d.k("copy_words")
	l := &launchCmd{fn: k.fn, grid: grid1(min(ceilDiv(n, 256), 64)), block: grid1(256)}
	l.vals[0], l.vals[1], l.vals[2] = dst, src, uint64(uint32(int32(n)))
	for i := range 3 {
		l.ptrs[i] = unsafe.Pointer(&l.vals[i])
	}
	if err := d.enqueue(l); err != nil {
		return fmt.Errorf("cuda: copy_words: %w", err)
	}
	return nil
}
