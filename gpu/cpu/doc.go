// Package cpu is the fast CPU lane: a gpu.Device that runs the operations of
// a forward pass on the host's cores.
//
// Weights stay where the caller keeps them (host.Memory aliases memory-mapped
// checkpoints); BF16 and F16 weights are widened to F32 in registers or in
// small per-thread panels, and every sum accumulates in F32.
//
// On x86-64 processors with AVX2, FMA and F16C the inner loops are assembly
// kernels chosen at run time, and where the processor also has AVX-512 the
// products (the prompt's GEMM, the decode GEMVs) run on 512-bit registers;
// elsewhere, and with the purego
// build tag, a portable Go implementation of the same kernels runs instead.
// Name reports which set a Device uses (avx512, avx2 or generic).
//
// Concurrency: a Device belongs to one goroutine at a time, like every
// gpu.Device. It owns Threads-1 worker goroutines; together with the calling
// goroutine they split each large operation into row ranges, claimed one at
// a time, and the caller waits for the ranges, not for the workers: a worker
// the operating system has not scheduled yet delays nothing. Small
// operations run on the caller alone. Idle workers poll for new work for
// Config.Spin (so that the many small operations of a decode step start
// within about a microsecond, at the cost of keeping the cores busy that
// long) before parking. Close stops the workers and waits for them;
// operations issued after Close fail.
//
// Operations run synchronously: when a method returns, its output is
// written, so Sync only reports the context's error.
package cpu
