//go:build !amd64 || purego

package cpu

// asmKernels returns the assembly kernel sets this processor runs: none.
func asmKernels() []*kernels { return nil }
