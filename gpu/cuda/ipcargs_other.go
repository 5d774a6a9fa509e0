//go:build !arm64

package cuda

import "encoding/binary"

// ipcOpenArgs lays out the arguments of cuIpcOpenMemHandle_v2(CUdeviceptr*,
// CUipcMemHandle, unsigned) for the System V AMD64 ABI: the 64-byte handle
// is of class MEMORY, so it is copied onto the stack and takes no
// register; the pointer and the flags take the first two integer
// registers, the four remaining ones are unused, and the handle's eight
// words follow as the first stack arguments.
func ipcOpenArgs(pdptr uintptr, mem *[IPCHandleBytes]byte, flags uintptr) []uintptr {
	args := []uintptr{pdptr, flags, 0, 0, 0, 0}
	for i := 0; i < IPCHandleBytes; i += 8 {
		args = append(args, uintptr(binary.LittleEndian.Uint64(mem[i:])))
	}
	return args
}
