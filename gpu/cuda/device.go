package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/kernels"
)

// Info describes an open device.
type Info struct {
	Name         string
	Ordinal      int
	ComputeMajor int
	ComputeMinor int
	SMs          int
	L2Bytes      int
	MemBytes     int64
	Driver       int    // driver API version, e.g. 13000
	UUID         UUID   // the GPU's UUID, as nvidia-smi -L prints it
	Code         string // "cubin sm_90a" or "ptx compute_80 (JIT)"
	// SharedOptin is the shared memory a block may take once its kernel
	// opts in: 227 KiB on Hopper, 163 on the A100, 99 on most other GPUs.
	SharedOptin int
	// Overlap says kernels are launched as programmatic dependent
	// launches (Config.Serial).
	Overlap bool
}

// Device is one NVIDIA GPU. It implements gpu.Device, gpu.Grapher and
// gpu.Argmaxer.
//
// Every driver call for the device runs on one goroutine locked to its OS
// thread (the device's thread), where the device's CUDA context is current.
// The public methods are called from any one goroutine at a time (they also
// serialize on a mutex). Operations are validated on the caller's goroutine
// and queued to the device's thread without waiting; Read, Sync, Alloc and
// Free wait for it. An error the driver reports for a queued operation is
// returned by the next Sync, Read or Capture.
type Device struct {
	cfg  Config
	info Info

	mu      sync.Mutex
	cmds    chan func()
	reply   chan error
	done    chan struct{}
	closed  bool
	capture bool // a graph is being recorded
	bufs    map[*Buffer]struct{}
	graphs  map[*Graph]struct{}
	scratch map[string]*Buffer
	retired []*Buffer               // scratch outgrown while graphs may still use it
	drawn   map[*Buffer]*drawnLists // logit adjustments kept with a buffer of tokens (Sample)
	// rounded names the x whose 16-bit copy the last product left in
	// scratch; any other operation, or a product writing over x, forgets it.
	rounded roundedX
	// sum is the split product whose parts are not yet summed (sums.go).
	sum      pendingSum
	deferred []*Buffer // freed while recording
	kern     map[string]*kernel

	// Owned by the device's thread.
	drv       *driver
	cudev     int32
	ctx       uintptr
	stream    uintptr
	sticky    error
	fault     *[4]uint32
	faultHost unsafe.Pointer
	faultDev  uint64
	counters  *Buffer // maxCounters zeroed words (see init)
	staging   unsafe.Pointer
	stageDev  uint64 // staging's address on the device
	halves    [2]stageHalf
	late      [gpu.MaxLateReads]lateSlot // ReadLater's pinned slots
	cur       int
	modules   []uintptr
}

// stageHalf is one half of the pinned staging buffer that posted writes
// copy through: used bytes staged since the half was last entered, and ev,
// recorded when it was left, done once the copies from it are.
type stageHalf struct {
	used int
	ev   uintptr
}

var (
	_ gpu.Device   = (*Device)(nil)
	_ gpu.Grapher  = (*Device)(nil)
	_ gpu.Argmaxer = (*Device)(nil)
)

// Open starts the device cfg.Ordinal: it loads the driver, retains the
// GPU's primary context on a thread of its own, creates a stream and loads
// the kernels. ctx bounds the wait; a cancelled Open releases what it made.
func Open(ctx context.Context, cfg Config) (*Device, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	d := &Device{
		cfg:     cfg,
		cmds:    make(chan func(), cfg.QueueDepth),
		reply:   make(chan error, 1),
		done:    make(chan struct{}),
		bufs:    map[*Buffer]struct{}{},
		graphs:  map[*Graph]struct{}{},
		scratch: map[string]*Buffer{},
		drawn:   map[*Buffer]*drawnLists{},
		kern:    map[string]*kernel{},
	}
	ready := make(chan error, 1)
	go d.loop(ready)
	select {
	case err := <-ready:
		if err != nil {
			<-d.done
			return nil, err
		}
	case <-ctx.Done():
		if err := <-ready; err == nil {
			close(d.cmds)
		}
		<-d.done
		return nil, fmt.Errorf("cuda: open device %d: %w", cfg.Ordinal, ctx.Err())
	}
	return d, nil
}

// loop is the device's thread: it owns the context and runs queued
// commands until Close closes the queue.
func (d *Device) loop(ready chan<- error) {
	// Never unlocked: the thread ends with this goroutine, and the context
	// current on it with it.
	runtime.LockOSThread()
	defer close(d.done)
	if err := d.init(); err != nil {
		d.teardown()
		ready <- err
		return
	}
	ready <- nil
	for {
		f, ok := spinRecv(d.cmds, d.cfg.Spin)
		if !ok {
			break
		}
		f()
	}
	d.teardown()
}

// spinRecv receives from c, polling for up to spin before blocking:
// waking a parked goroutine on a locked thread costs several microseconds,
// more than most driver calls.
func spinRecv[T any](c <-chan T, spin time.Duration) (T, bool) {
	if spin <= 0 {
		v, ok := <-c
		return v, ok
	}
	var start time.Time
	for i := 0; ; i++ {
		select {
		case v, ok := <-c:
			return v, ok
		default:
		}
		if i&63 == 63 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > spin {
				v, ok := <-c
				return v, ok
			}
		}
	}
}

// ptr is the address of *p for a driver call that reads or writes it. The
// value must live on the heap, not on a goroutine stack: the runtime moves
// a stack when it grows, possibly between taking the address and the
// driver's use of it, and a driver write would then land in the old copy.
// Handing p to a Pinner makes the compiler allocate it on the heap, which
// the collector never moves; the caller keeps it alive past the call.
func ptr[T any](p *T) uintptr {
	var pin runtime.Pinner
	pin.Pin(p)
	pin.Unpin()
	return uintptr(unsafe.Pointer(p))
}

func (d *Device) init() error {
	drv, err := loadDriver(d.cfg.Library)
	if err != nil {
		return err
	}
	d.drv = drv
	if err := drv.cuInit.call(0); err != nil {
		var ce *Error
		if errors.As(err, &ce) && ce.Code == errNoDevice {
			return fmt.Errorf("cuda: no CUDA-capable GPU found: %w", err)
		}
		return fmt.Errorf("cuda: initialise driver: %w", err)
	}
	var ver, count int32
	if err := drv.cuDriverGetVersion.call(ptr(&ver)); err != nil {
		return err
	}
	if err := drv.cuDeviceGetCount.call(ptr(&count)); err != nil {
		return err
	}
	if d.cfg.Ordinal >= int(count) {
		return fmt.Errorf("cuda: open device %d: only %d GPUs are visible", d.cfg.Ordinal, count)
	}
	if err := drv.cuDeviceGet.call(ptr(&d.cudev), uintptr(d.cfg.Ordinal)); err != nil {
		return err
	}
	var name [256]byte
	if err := drv.cuDeviceGetName.call(ptr(&name[0]), uintptr(len(name)), uintptr(d.cudev)); err != nil {
		return err
	}
	attr := func(a int) int {
		var v int32
		if err := drv.cuDeviceGetAttribute.call(ptr(&v), uintptr(a), uintptr(d.cudev)); err != nil {
			return 0
		}
		return int(v)
	}
	var mem uint64
	if err := drv.cuDeviceTotalMem_v2.call(ptr(&mem), uintptr(d.cudev)); err != nil {
		return err
	}
	d.info = Info{
		Name: cstring(name[:]), Ordinal: d.cfg.Ordinal,
		ComputeMajor: attr(attrComputeMajor), ComputeMinor: attr(attrComputeMinor),
		SMs: attr(attrMultiprocessors), L2Bytes: attr(attrL2CacheSize), MemBytes: int64(mem), Driver: int(ver),
		SharedOptin: attr(attrSharedOptin),
	}
	uuid := new(UUID)
	if err := drv.cuDeviceGetUuid_v2.call(ptr(&uuid[0]), uintptr(d.cudev)); err != nil {
		return err
	}
	d.info.UUID = *uuid
	if attr(attrUnifiedAddressing) == 0 || attr(attrCanMapHostMemory) == 0 {
		return fmt.Errorf("cuda: open device %d (%s): needs unified addressing and mapped host memory", d.cfg.Ordinal, d.info.Name)
	}
	// Spin, not yield or block, while waiting for the GPU: a decode step
	// waits for its argmax every token. Fails harmlessly when another user
	// of the process already made the primary context active.
	_ = drv.cuDevicePrimaryCtxSetFlags_v2.call(uintptr(d.cudev), ctxSchedSpin)
	if err := drv.cuDevicePrimaryCtxRetain.call(ptr(&d.ctx), uintptr(d.cudev)); err != nil {
		return err
	}
	if err := drv.cuCtxSetCurrent.call(d.ctx); err != nil {
		return err
	}
	if err := drv.cuStreamCreate.call(ptr(&d.stream), streamNonBlocking); err != nil {
		return err
	}
	// The fault word: mapped host memory kernels write when they meet a
	// bad index, read by the host after each synchronisation.
	if err := drv.cuMemHostAlloc.call(ptr(&d.faultHost), 64, hostAllocPortable|hostAllocDeviceMap); err != nil {
		return err
	}
	d.fault = (*[4]uint32)(d.faultHost)
	*d.fault = [4]uint32{}
	if err := drv.cuMemHostGetDevicePointer_v2.call(ptr(&d.faultDev), uintptr(d.faultHost), 0); err != nil {
		return err
	}
	if err := drv.cuMemHostAlloc.call(ptr(&d.staging), uintptr(d.cfg.StagingBytes), hostAllocPortable|hostAllocDeviceMap); err != nil {
		return fmt.Errorf("cuda: pinned staging of %d bytes: %w", d.cfg.StagingBytes, err)
	}
	if err := drv.cuMemHostGetDevicePointer_v2.call(ptr(&d.stageDev), uintptr(d.staging), 0); err != nil {
		return err
	}
	for i := range d.halves {
		if err := drv.cuEventCreate.call(ptr(&d.halves[i].ev), eventDisableTiming); err != nil {
			return err
		}
	}
	for i := range d.late {
		if err := d.growLate(&d.late[i], lateSlotBytes); err != nil {
			return fmt.Errorf("cuda: %w", err)
		}
		if err := drv.cuEventCreate.call(ptr(&d.late[i].ev), eventDisableTiming); err != nil {
			return err
		}
	}
	// Counters of the kernels whose last block finishes the work (Argmax),
	// zero between launches. Made here, before anything is recorded, so
	// that their zeroing is never only a node of a graph.
	d.counters = &Buffer{dev: d, dt: gpu.I32, n: maxCounters, size: 4 * maxCounters}
	if err := drv.cuMemAlloc_v2.call(ptr(&d.counters.ptr), uintptr(d.counters.size)); err != nil {
		return err
	}
	d.bufs[d.counters] = struct{}{}
	if err := drv.cuMemsetD8Async.call(uintptr(d.counters.ptr), 0, uintptr(d.counters.size), d.stream); err != nil {
		return err
	}
	return d.loadKernels()
}

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// maxCounters is the length of Device.counters: one per row of an Argmax,
// or per token and block row of an Attention.
const maxCounters = 65535

// codeCubin is Info.Code when the Hopper cubins are loaded.
const codeCubin = "cubin sm_90a"

// loadKernels loads every module (the Hopper cubin on compute capability
// 9.0 unless Config.PTX, the PTX elsewhere) and resolves the kernels the
// operations use.
func (d *Device) loadKernels() error {
	fsys := d.cfg.Kernels
	if fsys == nil {
		fsys = kernels.FS()
	}
	man, err := kernels.ReadManifest(fsys)
	if err != nil {
		return err
	}
	useCubin := d.info.ComputeMajor == 9 && d.info.ComputeMinor == 0 && !d.cfg.PTX
	if useCubin {
		d.info.Code = codeCubin
		d.info.Overlap = !d.cfg.Serial && d.drv.cuLaunchKernelEx.addr != 0
	} else {
		d.info.Code = "ptx compute_80 (JIT)"
	}
	if d.info.ComputeMajor < 8 {
		return fmt.Errorf("cuda: open device %d (%s): compute capability %d.%d, the kernels need 8.0 or later", d.cfg.Ordinal, d.info.Name, d.info.ComputeMajor, d.info.ComputeMinor)
	}
	for _, m := range man.Modules {
		file := m.PTX
		if useCubin {
			file = m.Cubin
		}
		img, err := readFile(fsys, file)
		if err != nil {
			return fmt.Errorf("cuda: load module %s: %w", m.Name, err)
		}
		if !useCubin {
			img = append(img, 0) // PTX is loaded as a C string
		}
		var mod uintptr
		err = d.drv.cuModuleLoadData.call(ptr(&mod), uintptr(unsafe.Pointer(&img[0])))
		runtime.KeepAlive(img)
		if err != nil {
			return fmt.Errorf("cuda: load module %s (%s): %w", m.Name, file, err)
		}
		d.modules = append(d.modules, mod)
	}
	required := len(kernelNames())
	for i, name := range append(kernelNames(), optionalKernelNames()...) {
		cname := make([]byte, len(name)+1)
		copy(cname, name)
		var fn uintptr
		for _, mod := range d.modules {
			if d.drv.cuModuleGetFunction.call(ptr(&fn), mod, ptr(&cname[0])) == nil {
				break
			}
			fn = 0
		}
		runtime.KeepAlive(cname)
		if fn == 0 && i >= required {
			continue
		}
		if fn == 0 {
			return fmt.Errorf("cuda: kernel %s is in no module: rebuild with kernels/build.sh", name)
		}
		k := &kernel{name: name, fn: fn}
		var threads int32
		// CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
		if err := d.drv.cuFuncGetAttribute.call(ptr(&threads), 0, fn); err != nil {
			return fmt.Errorf("cuda: threads of %s: %w", name, err)
		}
		k.threads = int(threads)
		if threads, shmem, ok := occupancyShape(name); ok {
			if shmem > d.info.SharedOptin {
				// A GPU with less shared memory than the block takes
				// (a kernel meant for Hopper, loaded from the PTX) goes
				// without it; its callers take another path.
				if i < required {
					return fmt.Errorf("cuda: %s takes %d bytes of shared memory a block; %s allows %d", name, shmem, d.info.Name, d.info.SharedOptin)
				}
				continue
			}
			if shmem > defaultShmem {
				// The driver counts no blocks for more shared memory than
				// the kernel is allowed: allow it first, as launch would.
				if err := d.drv.allowShmem(fn, shmem); err != nil {
					return fmt.Errorf("cuda: %s: %w", name, err)
				}
				k.shmem = shmem
			}
			var occ int32
			if err := d.drv.cuOccupancyMaxActiveBlocksPerMultiprocessor.call(ptr(&occ), fn, uintptr(threads), uintptr(shmem)); err != nil {
				return fmt.Errorf("cuda: occupancy of %s: %w", name, err)
			}
			k.occ = int(occ)
		}
		d.kern[name] = k
	}
	return nil
}

// occupancyShape is the block (threads, dynamic shared memory) at which
// the driver is asked how many blocks of a kernel fit on an SM, for the
// kernels whose grids depend on it: the fast GEMVs, gemm_stream and
// attn_decode.
func occupancyShape(name string) (threads, shmem int, ok bool) {
	switch {
	case strings.HasPrefix(name, "gemv_") && strings.Contains(name, "_nv"):
		return 256, 0, true
	case strings.HasPrefix(name, "gemm_stream"):
		sh, ok := streamShapes[name[:strings.LastIndexByte(name, '_')+1]]
		return sh.threads(), sh.shmem(), ok
	case strings.HasPrefix(name, "attn_decode_"):
		hd := 128
		if strings.HasSuffix(name, "_hd64") {
			hd = 64
		}
		return 128, decodeShmem(hd), true
	}
	return 0, 0, false
}

func (d *Device) teardown() {
	drv := d.drv
	if drv == nil {
		return
	}
	if d.ctx != 0 {
		if d.stream != 0 {
			_ = drv.cuStreamSynchronize.call(d.stream)
		}
		for b := range d.bufs {
			switch {
			case b.ipcBase != 0:
				_ = drv.cuIpcCloseMemHandle.call(uintptr(b.ipcBase))
			case b.ptr != 0:
				_ = drv.cuMemFree_v2.call(uintptr(b.ptr))
			}
		}
		for _, m := range d.modules {
			_ = drv.cuModuleUnload.call(m)
		}
		for _, h := range d.halves {
			if h.ev != 0 {
				_ = drv.cuEventDestroy_v2.call(h.ev)
			}
		}
		for _, s := range d.late {
			if s.ev != 0 {
				_ = drv.cuEventDestroy_v2.call(s.ev)
			}
			if s.host != nil {
				_ = drv.cuMemFreeHost.call(uintptr(s.host))
			}
		}
		if d.staging != nil {
			_ = drv.cuMemFreeHost.call(uintptr(d.staging))
		}
		if d.faultHost != nil {
			_ = drv.cuMemFreeHost.call(uintptr(d.faultHost))
		}
		if d.stream != 0 {
			_ = drv.cuStreamDestroy_v2.call(d.stream)
		}
		_ = drv.cuDevicePrimaryCtxRelease_v2.call(uintptr(d.cudev))
	}
	drv.close()
	d.drv = nil
}

// post queues f to the device's thread without waiting; its error becomes
// the device's pending error.
func (d *Device) post(f func() error) {
	d.cmds <- func() {
		if err := f(); err != nil && d.sticky == nil {
			d.sticky = err
		}
	}
}

// do runs f on the device's thread and waits for it.
func (d *Device) do(f func() error) error {
	d.cmds <- func() { d.reply <- f() }
	err, _ := spinRecv(d.reply, d.cfg.Spin)
	return err
}

// takeErr returns and clears the pending error, first the driver's, then a
// kernel's fault. It runs on the device's thread after a synchronisation.
func (d *Device) takeErr() error {
	if err := d.sticky; err != nil {
		d.sticky = nil
		d.clearFault()
		return err
	}
	return d.takeFault()
}

func (d *Device) syncStream() error {
	if err := d.drv.cuStreamSynchronize.call(d.stream); err != nil {
		return err
	}
	d.halves[0].used, d.halves[1].used = 0, 0
	return nil
}

func (d *Device) enter(op string) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("cuda: %s: device is closed", op)
	}
	if op != "matmul" {
		d.rounded = roundedX{}
	}
	if !readsSums(op) {
		if err := d.flushSum(); err != nil {
			d.mu.Unlock()
			return err
		}
	}
	return nil
}

func (d *Device) leave() { d.mu.Unlock() }

// Name implements gpu.Device.
func (d *Device) Name() string {
	code := d.info.Code
	if d.info.Overlap {
		code += ", overlapped launches"
	}
	return fmt.Sprintf("cuda %d: %s (sm_%d%d, %d SMs, %s)", d.info.Ordinal, d.info.Name, d.info.ComputeMajor, d.info.ComputeMinor, d.info.SMs, code)
}

// Info describes the device.
func (d *Device) Info() Info { return d.info }

// FreeMemory implements gpu.MemoryReporter: the device memory free now
// (cuMemGetInfo, so other processes' allocations count) and in all.
func (d *Device) FreeMemory() (free, total int64, err error) {
	if err := d.enter("free memory"); err != nil {
		return 0, 0, err
	}
	defer d.leave()
	var f, t uint64
	if err := d.do(func() error { return d.drv.cuMemGetInfo_v2.call(ptr(&f), ptr(&t)) }); err != nil {
		return 0, 0, fmt.Errorf("cuda: free memory: %w", err)
	}
	return int64(f), int64(t), nil
}

// Sync implements gpu.Device: it waits for all issued work and returns the
// first error any of it met. If ctx ends first, Sync returns ctx's error
// and the work goes on.
func (d *Device) Sync(ctx context.Context) error {
	if err := d.enter("sync"); err != nil {
		return err
	}
	defer d.leave()
	if d.capture {
		return fmt.Errorf("cuda: sync: not allowed while recording a graph")
	}
	if ctx.Done() == nil {
		return d.do(func() error {
			if err := d.syncStream(); err != nil {
				return fmt.Errorf("cuda: sync: %w", err)
			}
			return d.takeErr()
		})
	}
	res := make(chan error, 1)
	d.cmds <- func() {
		err := d.syncStream()
		if err == nil {
			err = d.takeErr()
		} else {
			err = fmt.Errorf("cuda: sync: %w", err)
		}
		res <- err
	}
	start := time.Now()
	for i := 0; d.cfg.Spin > 0; i++ {
		select {
		case err := <-res:
			return err
		case <-ctx.Done():
			return fmt.Errorf("cuda: sync: %w", ctx.Err())
		default:
		}
		if i&63 == 63 && time.Since(start) > d.cfg.Spin {
			break
		}
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return fmt.Errorf("cuda: sync: %w", ctx.Err())
	}
}

// Close implements gpu.Device: it waits for issued work, releases every
// buffer, graph, module and the context, and stops the device's thread.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	err := d.do(func() error {
		if err := d.syncStream(); err != nil {
			return err
		}
		return d.takeErr()
	})
	for g := range d.graphs {
		_ = d.do(g.destroy)
	}
	d.closed = true
	close(d.cmds)
	<-d.done
	return err
}

// Elapsed runs f, which issues operations, between two events and returns
// the device time between them.
func (d *Device) Elapsed(f func() error) (time.Duration, error) {
	var start, stop uintptr
	if err := d.enter("elapsed"); err != nil {
		return 0, err
	}
	err := d.do(func() error {
		if err := d.drv.cuEventCreate.call(ptr(&start), 0); err != nil {
			return err
		}
		if err := d.drv.cuEventCreate.call(ptr(&stop), 0); err != nil {
			return err
		}
		return d.drv.cuEventRecord.call(start, d.stream)
	})
	d.leave()
	if err != nil {
		return 0, fmt.Errorf("cuda: elapsed: %w", err)
	}
	ferr := f()
	if err := d.enter("elapsed"); err != nil {
		return 0, err
	}
	defer d.leave()
	var ms float32
	err = d.do(func() error {
		defer func() {
			_ = d.drv.cuEventDestroy_v2.call(start)
			_ = d.drv.cuEventDestroy_v2.call(stop)
		}()
		if err := d.drv.cuEventRecord.call(stop, d.stream); err != nil {
			return err
		}
		if err := d.drv.cuEventSynchronize.call(stop); err != nil {
			return err
		}
		if err := d.drv.cuEventElapsedTime.call(ptr(&ms), start, stop); err != nil {
			return err
		}
		return d.takeErr()
	})
	if ferr != nil {
		return 0, ferr
	}
	if err != nil {
		return 0, fmt.Errorf("cuda: elapsed: %w", err)
	}
	return time.Duration(float64(ms) * 1e6), nil
}
