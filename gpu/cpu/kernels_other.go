//go:build !amd64 || purego

package cpu

// fastKernels returns the best kernels for this processor: the portable
// ones on this architecture.
func fastKernels() *kernels { return genericKernels }

// asmKernels returns the assembly kernel sets this processor runs: none.
func asmKernels() []*kernels { return nil }
