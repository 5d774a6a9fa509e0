// Package cuda is the CUDA lane: a gpu.Device on an NVIDIA GPU, driven
// from pure Go (no cgo) through the CUDA driver API in libcuda.so.1, loaded
// at run time with purego. It builds for any GOOS/GOARCH; Open fails with a
// clear error where the driver, a GPU or the platform (linux on amd64 or
// arm64) is missing.
//
//	dev, err := cuda.Open(ctx, cuda.Config{Ordinal: 0})
//	...
//	defer dev.Close()
//
// # Threads
//
// A CUDA context is current per OS thread, so each Device owns one
// goroutine locked to its own thread; every driver call for the device runs
// there, fed through a bounded queue of commands. The public methods
// validate their arguments on the caller's goroutine (including every
// kernel argument's span against its allocation, naming the kernel and the
// argument) and queue launches without waiting: issuing an operation costs
// the caller a queue send, the device's thread the driver's launch.
// Alloc, Weights, Read, Sync and Close wait for the device's thread. A
// Device is used by one goroutine at a time, as gpu.Device says; the
// methods also serialise on a mutex.
//
// # Errors
//
// Argument errors are returned by the operation. Driver errors of queued
// work, and faults kernels record when a device-side index (token id, KV
// slot, position, block, expert) is out of range, are returned by the next
// Sync, Read or Capture (a *FaultError for the latter). Embed, outside graph
// recording, waits for its gather so that a bad token id is returned by
// Embed itself.
//
// # Memory
//
// Buffers are device allocations. Weights copies to the device before it
// returns. Write is stream-ordered and asynchronous (through pinned staging
// memory); Read waits for all issued work. Free releases memory once the
// work issued before it is done. Slice (gpu.Slicer) views part of a buffer
// (16-byte aligned start) without copying; Pack (gpu.Packer) stores several
// weights back to back in one allocation, so that one GEMV computes several
// products. A view releases nothing and dies with its allocation.
// ExportIPC and ImportIPC share memory with other processes of the host
// (CUDA IPC): an imported buffer is a mapping of a peer's memory, and
// Free unmaps it. Group joins GPUs for collectives, of this process by
// peer access (NewGroup) or of several processes by IPC (NewIPCGroup).
// Addresses the driver reads or writes are heap values (the runtime moves
// goroutine stacks).
//
// # Graphs
//
// Device implements gpu.Grapher with stream capture: record a decode step
// once, then per token Write the index buffers and Launch the graph (one
// driver call). Attention splits its keys by the token's own position, so a
// graph serves any context length up to the block table's.
//
// # Kernels and precision
//
// Kernels come from package kernels: a cubin for sm_90a (H100, H200),
// PTX for other GPUs of compute capability 8.0 or later (compiled by the
// driver at Open). Accumulation is f32 everywhere. MatMul with bf16 or f16
// weights and more than 8 rows of x rounds x to the weight's type for the
// tensor cores (relative error about 2e-3); the GEMV paths (up to 8 rows)
// keep x in f32. BF16 and F16 KV caches round k and v on store.
//
// Code (gpu.WeightCoder; Codable says which shapes it takes) gives a bf16
// weight a twin in the lossless 12-bit code of package gpu/code12; the
// products of one row of x then read the twin (gemv_c12_* and their
// gated, post-norm and LM-head kinds), the others the bf16 rows.
package cuda
