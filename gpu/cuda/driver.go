package cuda

import (
	"fmt"
	"reflect"
)

// Result is a CUresult: a status code of the CUDA driver API.
type Result uint32

// Error is a failed driver call.
type Error struct {
	Func string // the driver entry point, e.g. "cuMemAlloc_v2"
	Code Result
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d)", e.Func, e.Code.Name(), uint32(e.Code))
}

const (
	errNotReady            = 600
	errNotSupported        = 801
	errPeerAlreadyEnabled  = 704
	errNoDevice            = 100
	errInvalidDevice       = 101
	errStreamCaptureUnsupp = 900
	errInvalidValue        = 1
	errInvalidContext      = 201
	errInvalidHandle       = 400
	errPeerUnsupported     = 217
	errTooManyPeers        = 711
)

// Name is the CUDA_ERROR_* name of common codes.
func (r Result) Name() string {
	switch r {
	case 0:
		return "CUDA_SUCCESS"
	case 1:
		return "CUDA_ERROR_INVALID_VALUE"
	case 2:
		return "CUDA_ERROR_OUT_OF_MEMORY"
	case 3:
		return "CUDA_ERROR_NOT_INITIALIZED"
	case 4:
		return "CUDA_ERROR_DEINITIALIZED"
	case 34:
		return "CUDA_ERROR_STUB_LIBRARY"
	case 35:
		return "CUDA_ERROR_INSUFFICIENT_DRIVER"
	case 46:
		return "CUDA_ERROR_DEVICE_UNAVAILABLE"
	case errNoDevice:
		return "CUDA_ERROR_NO_DEVICE"
	case 205:
		return "CUDA_ERROR_MAP_FAILED"
	case 208:
		return "CUDA_ERROR_ALREADY_MAPPED"
	case errPeerUnsupported:
		return "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"
	case errInvalidDevice:
		return "CUDA_ERROR_INVALID_DEVICE"
	case 200:
		return "CUDA_ERROR_INVALID_IMAGE"
	case 201:
		return "CUDA_ERROR_INVALID_CONTEXT"
	case 209:
		return "CUDA_ERROR_NO_BINARY_FOR_GPU"
	case 218:
		return "CUDA_ERROR_INVALID_PTX"
	case 222:
		return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"
	case 400:
		return "CUDA_ERROR_INVALID_HANDLE"
	case 500:
		return "CUDA_ERROR_NOT_FOUND"
	case errNotReady:
		return "CUDA_ERROR_NOT_READY"
	case 700:
		return "CUDA_ERROR_ILLEGAL_ADDRESS"
	case 701:
		return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
	case 702:
		return "CUDA_ERROR_LAUNCH_TIMEOUT"
	case 704:
		return "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"
	case 705:
		return "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"
	case 710:
		return "CUDA_ERROR_ASSERT"
	case errTooManyPeers:
		return "CUDA_ERROR_TOO_MANY_PEERS"
	case 715:
		return "CUDA_ERROR_ILLEGAL_INSTRUCTION"
	case 716:
		return "CUDA_ERROR_MISALIGNED_ADDRESS"
	case 719:
		return "CUDA_ERROR_LAUNCH_FAILED"
	case errNotSupported:
		return "CUDA_ERROR_NOT_SUPPORTED"
	case errStreamCaptureUnsupp:
		return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
	case 901:
		return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
	case 904:
		return "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"
	case 906:
		return "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"
	case 999:
		return "CUDA_ERROR_UNKNOWN"
	}
	return "CUDA_ERROR"
}

// proc is one driver entry point.
type proc struct {
	name string
	addr uintptr
}

func (p proc) call(args ...uintptr) error {
	if r := ccall(p.addr, args...); r != 0 {
		return &Error{Func: p.name, Code: Result(r)}
	}
	return nil
}

// Driver API constants used here.
const (
	streamNonBlocking     = 1
	ctxSchedSpin          = 1
	ipcLazyPeerAccess     = 1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
	eventDisableTiming    = 2
	hostAllocPortable     = 1
	hostAllocDeviceMap    = 2
	captureModeRelaxed    = 2
	attrMultiprocessors   = 16
	attrCanMapHostMemory  = 19
	attrL2CacheSize       = 38
	attrUnifiedAddressing = 41
	attrComputeMajor      = 75
	attrComputeMinor      = 76
	attrSharedOptin       = 97 // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
)

// driver is the table of libcuda entry points. Field names are the symbol
// names; the struct is filled by reflection once per Open.
type driver struct {
	lib uintptr

	cuInit                                      proc
	cuDriverGetVersion                          proc
	cuDeviceGetCount                            proc
	cuDeviceGet                                 proc
	cuDeviceGetName                             proc
	cuDeviceGetAttribute                        proc
	cuDeviceTotalMem_v2                         proc
	cuDeviceCanAccessPeer                       proc
	cuDeviceGetUuid_v2                          proc
	cuDevicePrimaryCtxRetain                    proc
	cuDevicePrimaryCtxRelease_v2                proc
	cuDevicePrimaryCtxSetFlags_v2               proc
	cuCtxSetCurrent                             proc
	cuCtxSynchronize                            proc
	cuCtxEnablePeerAccess                       proc
	cuCtxDisablePeerAccess                      proc
	cuStreamCreate                              proc
	cuStreamDestroy_v2                          proc
	cuStreamSynchronize                         proc
	cuStreamQuery                               proc
	cuStreamBeginCapture_v2                     proc
	cuStreamEndCapture                          proc
	cuGraphInstantiateWithFlags                 proc
	cuGraphLaunch                               proc
	cuGraphExecDestroy                          proc
	cuGraphDestroy                              proc
	cuGraphGetNodes                             proc
	cuEventCreate                               proc
	cuEventRecord                               proc
	cuEventSynchronize                          proc
	cuEventElapsedTime                          proc
	cuEventDestroy_v2                           proc
	cuMemAlloc_v2                               proc
	cuMemFree_v2                                proc
	cuMemGetInfo_v2                             proc
	cuMemGetAddressRange_v2                     proc
	cuMemsetD8Async                             proc
	cuMemsetD32Async                            proc
	cuMemcpyHtoD_v2                             proc
	cuMemcpyHtoDAsync_v2                        proc
	cuMemcpyDtoHAsync_v2                        proc
	cuMemcpyDtoDAsync_v2                        proc
	cuMemcpyPeerAsync                           proc
	cuMemHostAlloc                              proc
	cuMemFreeHost                               proc
	cuMemHostGetDevicePointer_v2                proc
	cuIpcGetMemHandle                           proc
	cuIpcOpenMemHandle_v2                       proc
	cuIpcCloseMemHandle                         proc
	cuModuleLoadData                            proc
	cuModuleUnload                              proc
	cuModuleGetFunction                         proc
	cuFuncSetAttribute                          proc
	cuFuncGetAttribute                          proc
	cuOccupancyMaxActiveBlocksPerMultiprocessor proc
	cuTensorMapEncodeTiled                      proc
	cuLaunchKernel                              proc
	cuLaunchKernelEx                            proc `cuda:"optional"` // CUDA 12.0
}

// loadDriver opens the driver library and resolves every entry point.
func loadDriver(path string) (*driver, error) {
	h, err := openLibrary(path)
	if err != nil {
		return nil, err
	}
	d := &driver{lib: h}
	v := reflect.ValueOf(d).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Type != reflect.TypeOf(proc{}) {
			continue
		}
		addr, err := lookup(h, f.Name)
		if err != nil && f.Tag.Get("cuda") == "optional" {
			continue // left zero: the caller checks
		}
		if err != nil {
			closeLibrary(h)
			return nil, fmt.Errorf("cuda: %s lacks %s: the NVIDIA driver is too old (%v)", path, f.Name, err)
		}
		// Unexported fields cannot be set through reflect; write through
		// the field's address instead.
		p := (*proc)(v.Field(i).Addr().UnsafePointer())
		*p = proc{name: f.Name, addr: addr}
	}
	return d, nil
}

func (d *driver) close() { closeLibrary(d.lib) }

// allowShmem lets kernel fn launch with bytes of dynamic shared memory,
// beyond the default 48 KiB (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
// the caller is on the context's thread.
func (d *driver) allowShmem(fn uintptr, bytes int) error {
	if err := d.cuFuncSetAttribute.call(fn, 8, uintptr(bytes)); err != nil {
		return fmt.Errorf("%d bytes of shared memory: %w", bytes, err)
	}
	return nil
}
