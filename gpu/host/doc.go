// Package host provides Buffers in ordinary host memory and the memory
// half of a gpu.Device for lanes that compute on the CPU (gpu/cpu and the
// float64 reference gpu/ref).
//
// Buffers created by Weights alias the caller's bytes (for example a
// memory-mapped checkpoint) instead of copying them.
package host
