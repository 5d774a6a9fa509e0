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

// WeightCoder is a device that can also hold a bf16 weight matrix in a
// lossless 12-bit code (package gpu/code12) for the products of one row
// of x, which stream every weight once a token: Code attaches to w (an
// allocation of rows × k bf16 values, not a view) the code of data, w's
// bytes given as parts of whole rows, and those products then read a
// quarter fewer bytes with the same values. Other products still read w,
// so the twin costs three quarters of w's memory more. Code returns false
// where the code does not fit the matrix or no kernel reads its shape;
// Codable says beforehand whether a kernel reads the shape.
type WeightCoder interface {
	Code(w Buffer, rows, k int, data ...[]byte) (bool, error)
	Codable(rows, k int) bool
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

// QKNorm says how QKVPreparer normalises q and k.
type QKNorm int

const (
	// QKNormNone leaves q and k as projected.
	QKNormNone QKNorm = iota
	// QKNormRow normalises each token's whole q (k) projection (OLMo 2).
	QKNormRow
	// QKNormHead normalises each head of q (k) (Qwen 3).
	QKNormHead
	// QKNormSums is QKNormRow for a tensor-parallel rank's slice of the
	// projections: the sums of squares of each token's whole q and k rows
	// come in QKVArgs.Sums, summed over the ranks, and qNorm and kNorm are
	// the rank's slices of the weights.
	QKNormSums
)

// QKVArgs shapes a QKVPreparer step.
type QKVArgs struct {
	N, Heads, KVHeads, HeadDim int
	Norm                       QKNorm
	Eps                        float32
	// Stride is the distance in elements between the rows of q, of k and
	// of v, as when they are views of one packed q|k|v product; 0 means
	// each is dense ([N, width]).
	Stride int
	// With QKNormSums: Sums ([2N] f32) holds the sums of squares of the
	// tokens' whole q rows, then of their whole k rows, which are QWidth
	// and KWidth wide.
	Sums           Buffer
	QWidth, KWidth int
}

// QKVPreparer fuses what lies between the q/k/v projections and attention:
// the optional RMSNorm of q and k (weights qNorm, kNorm; nil with
// QKNormNone), rotate-half RoPE at pos (invFreq as for RoPE), and the store
// of k and v into the caches at slots. q ([N, Heads*HeadDim]) is read and
// the result written to qOut, which must not overlap q; k ([N,
// KVHeads*HeadDim]) is left as projected, its result going to the cache
// only. The same as RMSNorm, RoPE and StoreKV in sequence, up to rounding.
type QKVPreparer interface {
	PrepareQKV(qOut, q, k, v, qNorm, kNorm, pos, invFreq, kc, vc, slots Buffer, a QKVArgs) error
}

// GatedMLPer runs a gated MLP's two products for n rows of x ([n, k],
// f32): out = (silu(x·gateᵀ) * (x·upᵀ))·downᵀ, with gateUp the gate rows
// then the up rows ([2f, k]), down [m, f] and out [n, m] (f32). gu ([n,
// 2f], f32) is scratch that may receive the gate|up product (each row gate
// then up); what it holds afterwards is unspecified. The device may form
// the activation inside either product.
type GatedMLPer interface {
	GatedMLP(out, gu, x, gateUp, down Buffer, n, k, f, m int) error
}

// GatedMatVecer forms a gated MLP's activation in its gate and up
// projection, for one token: out[j] = silu(w[j]·x) * (w[f+j]·x) for j < f,
// with w the gate rows then the up rows ([2f, k]), x [k] and out [f] (f32).
// The down projection then reads f values instead of 2f.
type GatedMatVecer interface {
	GatedMatVec(out, x, w Buffer, k, f int) error
}

// PostNormMatVecer folds a post-norm block's residual update (OLMo 2) into
// the one-token product that reads the new residual: rOut = r +
// rmsnorm(y) * wn over k values, then out = w·rOut (w [m, k]), or with glu
// (w the gate rows then the up rows, [2m, k]) out[j] = silu(w[j]·rOut) *
// (w[m+j]·rOut) as GatedMatVecer forms it. r and y are left as they were;
// out and rOut must not overlap each other or the inputs.
type PostNormMatVecer interface {
	PostNormMatVec(out, rOut, r, y, wn, w Buffer, k, m int, glu bool, eps float32) error
}

// HeadMatVecer folds a step's last residual update and its final norm into
// the LM head over one token: x = rmsnorm(r + u) * wf over k values, with
// u = rmsnorm(y) * wn (a post-norm, OLMo 2) or u = y when wn is nil, then
// out = w·x (w [m, k]); and when next is not nil, next[0] = the argmax of
// out as Argmaxer chooses it. r and y are left as they were; out and next
// must not overlap the inputs or each other.
type HeadMatVecer interface {
	HeadMatVec(out, next, r, y, wn, wf, w Buffer, k, m int, eps float32) error
}
