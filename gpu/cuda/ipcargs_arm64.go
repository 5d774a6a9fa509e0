//go:build arm64

package cuda

import "unsafe"

// ipcOpenArgs lays out the arguments of cuIpcOpenMemHandle_v2(CUdeviceptr*,
// CUipcMemHandle, unsigned): AAPCS64 passes a struct larger than 16 bytes
// by reference, as the address of a copy in the next register. mem must
// stay alive until the call returns.
func ipcOpenArgs(pdptr uintptr, mem *[IPCHandleBytes]byte, flags uintptr) []uintptr {
	return []uintptr{pdptr, uintptr(unsafe.Pointer(mem)), flags}
}
