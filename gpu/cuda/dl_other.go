//go:build !(linux && (amd64 || arm64))

package cuda

import (
	"fmt"
	"runtime"
)

const supported = false

func openLibrary(path string) (uintptr, error) {
	return 0, fmt.Errorf("cuda: unsupported on %s/%s: the CUDA lane needs linux on amd64 or arm64", runtime.GOOS, runtime.GOARCH)
}

func closeLibrary(uintptr) {}

func lookup(uintptr, string) (uintptr, error) {
	return 0, fmt.Errorf("cuda: unsupported on %s/%s", runtime.GOOS, runtime.GOARCH)
}

func ccall(uintptr, ...uintptr) uint32 { return errNotSupported }
