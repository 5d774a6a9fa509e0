// Package gpu is the device abstraction that every compute lane implements.
//
// A Device owns memory (Buffers) and runs the operations of a transformer
// forward pass on it. The model code in package models is written once
// against this interface; the CPU lane (gpu/cpu), the float64 reference
// (gpu/ref) and the CUDA lane (gpu/cuda) implement it.
//
// Shapes travel as plain ints and every per-token index (token ids,
// positions, KV slots, block tables) travels in I32 Buffers, never in Go
// slices, so that a device may record a sequence of operations once (a CUDA
// graph) and replay it after rewriting only the contents of those buffers.
//
// Concurrency: a Device is used by one goroutine at a time (its owner).
// Operations may run asynchronously; Read and Sync wait for everything
// issued before them.
package gpu
