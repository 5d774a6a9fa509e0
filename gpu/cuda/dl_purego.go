//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"

	"github.com/ebitengine/purego"
)

const supported = true

func openLibrary(path string) (uintptr, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return 0, fmt.Errorf("cuda: %s not found: is the NVIDIA driver installed? (%v)", path, err)
	}
	return h, nil
}

func closeLibrary(h uintptr) { _ = purego.Dlclose(h) }

func lookup(h uintptr, name string) (uintptr, error) { return purego.Dlsym(h, name) }

// ccall calls a C function of the driver; the result is a CUresult.
func ccall(fn uintptr, args ...uintptr) uint32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return uint32(r)
}
