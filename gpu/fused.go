package gpu

// Optional capabilities for fewer, larger operations, found by type
// assertion on a Device. A model uses them when present and falls back to
// the plain Ops otherwise, with the same results up to rounding.

// Slicer is a device whose buffers can be viewed in part: Slice returns a
// Buffer of n elements starting at element off of b, sharing its memory.
// A view lives as long as b; freeing a view releases nothing. A device may
// refuse offsets its kernels cannot use (alignment), with an error.
type Slicer interface {
	Slice(b Buffer, off, n int) (Buffer, error)
}

// Packer is a device whose Weights copies into device memory, so that
// storing several tensors back to back in one buffer costs nothing at run
// time and lets one MatMul compute several products (q, k and v; gate and
// up). Pack returns one read-only buffer holding parts (raw little-endian
// elements of dt) in order; the caller may reuse parts at once.
type Packer interface {
	Slicer
	Pack(dt DType, parts ...[]byte) (Buffer, error)
}

// ResidualNormer fuses a residual add with an RMSNorm (one pass over the
// rows instead of two).
type ResidualNormer interface {
	// AddRMSNorm adds x into the residual r and normalises the sum:
	// r += x; out = rmsnorm(r) * w, for n rows of width dim (pre-norm
	// blocks). out may alias x.
	AddRMSNorm(out, r, x, w Buffer, n, dim int, eps float32) error
	// RMSNormAdd adds the normalised x into the residual r:
	// r += rmsnorm(x) * w (post-norm blocks such as OLMo 2).
	RMSNormAdd(r, x, w Buffer, n, dim int, eps float32) error
}

// ShardNormer is a device that normalises a projection held in slices by
// the ranks of a tensor-parallel group (OLMo 2's QK-norm spans every head):
// each rank sums the squares of its slice, the ranks all-reduce the sums,
// and each normalises its slice with the total.
type ShardNormer interface {
	// SumSquares2 writes Σ a[i, :]² into out[i] and Σ b[i, :]² into
	// out[n+i] for the n rows of a ([n, wa]) and b ([n, wb]), in f32.
	SumSquares2(out, a, b Buffer, n, wa, wb int) error
	// RMSNormShard scales x ([n, dim], f32) in place by
	// w / sqrt(ss[ssOff+i] / total + eps), where ss holds each row's sum
	// of squares over the whole projection of width total.
	RMSNormShard(x, ss Buffer, ssOff int, w Buffer, n, dim, total int, eps float32) error
}
