package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/troupe/troupe/gpu"
)

// IPCHandleBytes is the size of the driver's opaque handle of an
// allocation (CUipcMemHandle).
const IPCHandleBytes = 64

// IPCHandle names part of a device allocation for another process of the
// same host (CUDA IPC). It is plain bytes (MarshalBinary): the processes
// exchange it however they like, and the importer maps the memory into
// its own address space with ImportIPC.
type IPCHandle struct {
	// Mem is the driver's handle of the whole allocation.
	Mem [IPCHandleBytes]byte
	// Offset is where the exported span starts, in bytes from the start of
	// the allocation (a view made by Slice starts inside it).
	Offset uint64
	// Bytes is the span's length.
	Bytes uint64
	// GPU is the UUID of the GPU that holds the memory.
	GPU UUID
	// PID is the exporting process.
	PID int
}

// UUID identifies a GPU (cuDeviceGetUuid).
type UUID [16]byte

// String formats u as nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func (u UUID) String() string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// ipcMagic starts a marshalled IPCHandle; its last byte is the version.
var ipcMagic = [4]byte{'t', 'i', 'p', 1}

// ipcWireBytes is the size of a marshalled IPCHandle.
const ipcWireBytes = 4 + IPCHandleBytes + 8 + 8 + 16 + 8

// MarshalBinary encodes h in a fixed little-endian layout.
func (h IPCHandle) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, ipcWireBytes)
	b = append(b, ipcMagic[:]...)
	b = append(b, h.Mem[:]...)
	b = binary.LittleEndian.AppendUint64(b, h.Offset)
	b = binary.LittleEndian.AppendUint64(b, h.Bytes)
	b = append(b, h.GPU[:]...)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.PID))
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary encoded.
func (h *IPCHandle) UnmarshalBinary(b []byte) error {
	if len(b) != ipcWireBytes {
		return fmt.Errorf("cuda: ipc handle of %d bytes, want %d", len(b), ipcWireBytes)
	}
	if [4]byte(b[:4]) != ipcMagic {
		return fmt.Errorf("cuda: ipc handle: bad magic or version %x", b[:4])
	}
	b = b[4:]
	copy(h.Mem[:], b)
	b = b[IPCHandleBytes:]
	h.Offset = binary.LittleEndian.Uint64(b)
	h.Bytes = binary.LittleEndian.Uint64(b[8:])
	copy(h.GPU[:], b[16:32])
	pid := binary.LittleEndian.Uint64(b[32:])
	if pid > 1<<31 {
		return fmt.Errorf("cuda: ipc handle: process id %d out of range", pid)
	}
	h.PID = int(pid)
	if h.Offset > 1<<62 || h.Bytes > 1<<62 {
		return fmt.Errorf("cuda: ipc handle: span of %d bytes at %d out of range", h.Bytes, h.Offset)
	}
	return nil
}

// ExportIPC returns the handle of b's memory (elements [0, Len) of b) for
// another process, which maps it with ImportIPC. b stays owned by this
// process: free it only once every importer has freed its mapping.
func (d *Device) ExportIPC(b gpu.Buffer) (IPCHandle, error) {
	const op = "cuda: export ipc"
	if err := d.enter("export ipc"); err != nil {
		return IPCHandle{}, err
	}
	defer d.leave()
	cb, err := d.buf(op, "b", b)
	if err != nil {
		return IPCHandle{}, err
	}
	return d.exportIPC(cb)
}

func (d *Device) exportIPC(b *Buffer) (IPCHandle, error) {
	const op = "cuda: export ipc"
	if b.ptr == 0 {
		return IPCHandle{}, fmt.Errorf("%s: the buffer is empty: no memory to export", op)
	}
	if b.ipcBase != 0 || (b.parent != nil && b.parent.ipcBase != 0) {
		return IPCHandle{}, fmt.Errorf("%s: the buffer maps another process's memory: only its owner can export it", op)
	}
	// The handle names the driver's whole allocation, which may start
	// before the buffer: a view made by Slice starts inside its parent,
	// and the driver may place small allocations inside a larger one.
	base, size := new(uint64), new(uint64)
	mem := new([IPCHandleBytes]byte)
	p := b.ptr
	err := d.do(func() error {
		if err := d.drv.cuMemGetAddressRange_v2.call(ptr(base), ptr(size), uintptr(p)); err != nil {
			return err
		}
		return d.drv.cuIpcGetMemHandle.call(ptr(&mem[0]), uintptr(*base))
	})
	if err != nil {
		return IPCHandle{}, fmt.Errorf("%s: GPU %d: %w%s", op, d.info.Ordinal, err, ipcHint(err, false))
	}
	h := IPCHandle{Mem: *mem, Offset: p - *base, Bytes: uint64(b.n * b.dt.Size()), GPU: d.info.UUID, PID: os.Getpid()}
	if h.Offset+h.Bytes > *size {
		return IPCHandle{}, fmt.Errorf("%s: %d bytes at offset %d exceed the driver's %d-byte allocation", op, h.Bytes, h.Offset, *size)
	}
	return h, nil
}

// ImportIPC maps the memory h names, exported by another process of this
// host, and returns it as a buffer of this device holding Bytes/size
// elements of dt. Kernels and copies of this device address it like its
// own buffers (peer access between the two GPUs is enabled on demand).
// Free unmaps it; the exporter must not free the memory before then.
func (d *Device) ImportIPC(h IPCHandle, dt gpu.DType) (*Buffer, error) {
	if err := d.enter("import ipc"); err != nil {
		return nil, err
	}
	defer d.leave()
	return d.importIPC(h, dt)
}

func (d *Device) importIPC(h IPCHandle, dt gpu.DType) (*Buffer, error) {
	op := fmt.Sprintf("cuda: import ipc memory of %s (process %d) on GPU %d", h.GPU, h.PID, d.info.Ordinal)
	if dt.Size() == 0 {
		return nil, fmt.Errorf("%s: invalid dtype %s", op, dt)
	}
	if h.PID == os.Getpid() {
		return nil, fmt.Errorf("%s: the memory belongs to this process: use it directly (peer access joins the GPUs of one process)", op)
	}
	if h.Bytes == 0 || h.Bytes%uint64(dt.Size()) != 0 {
		return nil, fmt.Errorf("%s: a span of %d bytes is not a positive number of %s elements", op, h.Bytes, dt)
	}
	base, rbase, size := new(uint64), new(uint64), new(uint64)
	mem := new([IPCHandleBytes]byte)
	*mem = h.Mem
	err := d.do(func() error {
		err := d.drv.cuIpcOpenMemHandle_v2.call(ipcOpenArgs(ptr(base), mem, ipcLazyPeerAccess)...)
		runtime.KeepAlive(mem)
		if err != nil {
			return err
		}
		// The span must lie in what the handle mapped, where the driver
		// says how much that is.
		if d.drv.cuMemGetAddressRange_v2.call(ptr(rbase), ptr(size), uintptr(*base)) == nil &&
			*rbase == *base && h.Offset+h.Bytes > *size {
			_ = d.drv.cuIpcCloseMemHandle.call(uintptr(*base))
			return fmt.Errorf("%d bytes at offset %d lie outside the %d bytes mapped", h.Bytes, h.Offset, *size)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w%s", op, err, ipcHint(err, true))
	}
	b := &Buffer{dev: d, ptr: *base + h.Offset, dt: dt, n: int(h.Bytes) / dt.Size(), size: int(h.Bytes), ipcBase: *base}
	d.bufs[b] = struct{}{}
	return b, nil
}

// ipcHint explains the driver errors CUDA IPC commonly meets, exporting
// or importing.
func ipcHint(err error, importing bool) string {
	var ce *Error
	if !errors.As(err, &ce) {
		return ""
	}
	switch ce.Code {
	case errInvalidValue, errInvalidHandle, errInvalidContext:
		if !importing {
			return ": the buffer's memory cannot be exported (it must come from cuMemAlloc on this GPU)"
		}
		return ": the handle names no live memory of this host (the exporter freed it or exited, or the handle comes from another host: CUDA IPC needs both processes on one host)"
	case errNotSupported:
		return ": CUDA IPC is not supported here (WSL, some virtual machines and containers, or a driver without it)"
	case errInvalidDevice:
		return ": the GPU that holds the memory is not usable from this process"
	case errPeerUnsupported:
		return ": the two GPUs cannot access each other's memory (no peer access between them)"
	case errTooManyPeers:
		return ": the GPU has peer mappings to too many GPUs already"
	case 208:
		return ": the memory is mapped already by another context of this process"
	}
	return ""
}
