package gpu

import (
	"context"
	"fmt"
)

// DType is an element type of a Buffer.
type DType uint8

// Element types. Floating-point data is little-endian IEEE 754 (BF16 is the
// upper half of an F32).
const (
	F32 DType = iota + 1
	BF16
	F16
	I32
)

// Size is the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16, F16:
		return 2
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	case I32:
		return "i32"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d == F32 || d == BF16 || d == F16 }

// Buffer is a region of a Device's memory holding Len elements of DType.
type Buffer interface {
	DType() DType
	Len() int
}

// Device owns memory and executes operations in the order they are issued.
type Device interface {
	// Name describes the device, e.g. "cpu (2 threads, avx2)".
	Name() string
	// Alloc returns a zeroed buffer of n elements.
	Alloc(dt DType, n int) (Buffer, error)
	// Weights returns a read-only buffer holding data (raw little-endian
	// elements of dt). A host device may keep a reference to data instead of
	// copying it; the caller keeps data valid and unchanged until Close.
	Weights(dt DType, data []byte) (Buffer, error)
	// Free releases a buffer from Alloc or Weights.
	Free(b Buffer)
	// Write copies len(src)/dt.Size() elements of raw data into b starting
	// at element off.
	Write(b Buffer, off int, src []byte) error
	// Read copies len(dst)/dt.Size() elements of b starting at element off
	// into dst, after all issued work has finished.
	Read(dst []byte, b Buffer, off int) error
	// Sync waits for all issued work.
	Sync(ctx context.Context) error
	// Close releases the device and everything allocated on it.
	Close() error
	Ops
}

// AttnArgs describes a paged attention over a batch of query tokens.
//
// The KV caches hold NumBlocks*BlockSize slots of KVHeads*HeadDim elements:
// slot s of the cache starts at element s*KVHeads*HeadDim, and block b holds
// slots [b*BlockSize, (b+1)*BlockSize). Query token t belongs to the sequence
// whose block table is row Seq[t] of BlockTable; it attends causally to the
// keys at positions 0..Pos[t] of that sequence, position p living in slot
// BlockTable[Seq[t]][p/BlockSize]*BlockSize + p%BlockSize.
type AttnArgs struct {
	N          int // query tokens
	Heads      int // query heads
	KVHeads    int // key/value heads; Heads is a multiple of KVHeads (GQA)
	HeadDim    int
	BlockSize  int
	MaxBlocks  int     // columns of BlockTable
	Scale      float32 // usually 1/sqrt(HeadDim)
	Pos        Buffer  // I32 [N]
	Seq        Buffer  // I32 [N]
	BlockTable Buffer  // I32 [sequences, MaxBlocks]
	// Runs is the number of runs of consecutive tokens of one sequence
	// in the batch (a prompt is one run, each decode token one), 0 when
	// unknown. A backend may pick its kernel by it; the result does not
	// depend on it.
	Runs int
}

// MoEArgs describes a mixture-of-experts SwiGLU block with softmax routing.
type MoEArgs struct {
	N       int // tokens
	Dim     int // model width
	Inter   int // expert intermediate width
	Experts int
	TopK    int
	// NormTopK renormalizes the top-k routing weights to sum to one.
	NormTopK bool
	Router   Buffer   // [Experts, Dim]
	Gate     []Buffer // per expert [Inter, Dim]
	Up       []Buffer // per expert [Inter, Dim]
	Down     []Buffer // per expert [Dim, Inter]
}

// Ops are the operations of a forward pass. Activations are F32; weights
// may be F32, BF16 or F16 and are accumulated in at least F32. Unless stated,
// out must not alias an input.
type Ops interface {
	// Embed gathers rows: out[t,:] = table[ids[t],:] for t < n, converting to
	// F32. table is [rows, dim]; ids is I32 [n].
	Embed(out, table, ids Buffer, n, dim int) error
	// MatMul computes out[n,m] = x[n,k] · w[m,k]ᵀ.
	MatMul(out, x, w Buffer, n, k, m int) error
	// RMSNorm computes out[r,:] = x[r,:] / sqrt(mean(x[r,:]²) + eps) * w
	// for n rows of width dim; out may alias x.
	RMSNorm(out, x, w Buffer, n, dim int, eps float32) error
	// Add computes out = a + b over n elements; out may alias a or b.
	Add(out, a, b Buffer, n int) error
	// SiLUMul computes out = silu(gate) * up over n elements; out may alias.
	SiLUMul(out, gate, up Buffer, n int) error
	// RoPE rotates x [n, heads, headDim] in place with the rotate-half
	// layout: for i < headDim/2, angle = Pos[t] * invFreq[i], and the pair
	// (x[i], x[i+headDim/2]) is rotated by it. pos is I32 [n]; invFreq is
	// F32 [headDim/2].
	RoPE(x, pos, invFreq Buffer, n, heads, headDim int) error
	// StoreKV writes k and v, each [n, width], into the caches at slots
	// (I32 [n]): cache element slots[t]*width + j.
	StoreKV(kc, vc, k, v, slots Buffer, n, width int) error
	// Attention computes out [N, Heads*HeadDim] from q [N, Heads*HeadDim]
	// and the paged caches.
	Attention(out, q, kc, vc Buffer, a AttnArgs) error
	// MoE computes out [N, Dim] from x [N, Dim].
	MoE(out, x Buffer, a MoEArgs) error
}

// CheckLen returns an error naming op and arg when b is nil or shorter than n
// elements.
func CheckLen(op, arg string, b Buffer, n int) error {
	if b == nil {
		return fmt.Errorf("%s: %s is nil", op, arg)
	}
	if b.Len() < n {
		return fmt.Errorf("%s: %s holds %d elements, needs %d", op, arg, b.Len(), n)
	}
	return nil
}
