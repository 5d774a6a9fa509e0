package cuda

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/troupe/troupe/gpu"
)

var (
	_ gpu.QKVPreparer      = (*Device)(nil)
	_ gpu.GatedMLPer       = (*Device)(nil)
	_ gpu.GatedMatVecer    = (*Device)(nil)
	_ gpu.PostNormMatVecer = (*Device)(nil)
	_ gpu.HeadMatVecer     = (*Device)(nil)
)

// fusedKernelNames are the kernels of the fused decode operations; they are
// optional (an older artifact set lacks them and the operations then fail).
func fusedKernelNames() []string {
	var names []string
	for _, w := range []string{"f32", "bf16", "f16"} {
		for _, c := range []string{"f32", "bf16", "f16"} {
			names = append(names, "qkv_prep_"+w+"_"+c, "qkv_prep_rows_"+w+"_"+c)
		}
	}
	for _, dt := range []string{"f32", "bf16", "f16"} {
		names = append(names, "silu_rows_"+dt)
	}
	for _, s := range gemvSplits {
		for _, kind := range []string{"glu_bf16", postKind(false), postKind(true), "bf16_head"} {
			names = append(names, fmt.Sprintf("gemv_%s_nv%d_ks%d", kind, s.nv, s.ks))
		}
		if s.nv <= 2 {
			for _, glu := range []bool{false, true} {
				names = append(names, fmt.Sprintf("gemv_%s_ahead_nv%d_ks%d", postKind(glu), s.nv, s.ks))
			}
		}
	}
	return names
}

func overlaps(a, b *Buffer) bool {
	if a.ptr == 0 || b.ptr == 0 {
		return false
	}
	ae, be := a.ptr+uint64(a.n*a.dt.Size()), b.ptr+uint64(b.n*b.dt.Size())
	return a.ptr < be && b.ptr < ae
}

// qkvParams mirrors struct QKVParams in kernels/cuda/fused.cu.
func qkvParams(a gpu.QKVArgs, capSlots, ldq, ldk int) []byte {
	raw := make([]byte, 44)
	for i, v := range []int{a.N, a.Heads, a.KVHeads, a.HeadDim, int(a.Norm), capSlots} {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(int32(v)))
	}
	binary.LittleEndian.PutUint32(raw[24:], math.Float32bits(a.Eps))
	binary.LittleEndian.PutUint32(raw[28:], uint32(int32(ldq)))
	binary.LittleEndian.PutUint32(raw[32:], uint32(int32(ldk)))
	if a.Norm == gpu.QKNormSums {
		binary.LittleEndian.PutUint32(raw[36:], math.Float32bits(1/float32(a.QWidth)))
		binary.LittleEndian.PutUint32(raw[40:], math.Float32bits(1/float32(a.KWidth)))
	}
	return raw
}

// PrepareQKV implements gpu.QKVPreparer with one kernel: three blocks a
// token (qkv_prep_rows) where q, k and v are the rows of one packed
// product, else a block per (token, head) of q and k (qkv_prep). A slot
// outside the caches is skipped and reported by the next Sync or Read.
func (d *Device) PrepareQKV(qOut, q, k, v, qNorm, kNorm, pos, invFreq, kc, vc, slots gpu.Buffer, a gpu.QKVArgs) error {
	const op = "prepare qkv"
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	if err := positive(op, a.N, a.Heads, a.KVHeads, a.HeadDim); err != nil {
		return err
	}
	if a.HeadDim%2 != 0 {
		return fmt.Errorf("%s: odd head dim %d", op, a.HeadDim)
	}
	if a.Norm < gpu.QKNormNone || a.Norm > gpu.QKNormSums {
		return fmt.Errorf("%s: unknown norm %d", op, a.Norm)
	}
	names := []string{"qOut", "q", "k", "v", "pos", "invFreq", "kc", "vc", "slots"}
	bs := []gpu.Buffer{qOut, q, k, v, pos, invFreq, kc, vc, slots}
	if a.Norm != gpu.QKNormNone {
		names, bs = append(names, "qNorm", "kNorm"), append(bs, qNorm, kNorm)
	}
	b, err := d.bufs2(op, names, bs...)
	if err != nil {
		return err
	}
	n, qw, kw, half := a.N, a.Heads*a.HeadDim, a.KVHeads*a.HeadDim, a.HeadDim/2
	ldq, ldk := qw, kw
	if a.Stride != 0 {
		if a.Stride < qw || a.Stride < kw {
			return fmt.Errorf("%s: row stride %d is narrower than q (%d) or k (%d)", op, a.Stride, qw, kw)
		}
		ldq, ldk = a.Stride, a.Stride
	}
	lq, lk := (n-1)*ldq+qw, (n-1)*ldk+kw // elements spanned by q's and k's (v's) rows
	if err := checkLens(op, names[:6], b[:6], []int{n * qw, lq, lk, lk, n, half}); err != nil {
		return err
	}
	if err := checkLens(op, names[8:9], b[8:9], []int{n}); err != nil {
		return err
	}
	for i, nm := range names[:6] {
		want := gpu.F32
		if nm == "pos" {
			want = gpu.I32
		}
		if err := wantDT(op, nm, b[i], want); err != nil {
			return err
		}
	}
	if err := wantDT(op, "slots", b[8], gpu.I32); err != nil {
		return err
	}
	if overlaps(b[0], b[1]) {
		return fmt.Errorf("%s: qOut overlaps q", op)
	}
	if b[6].dt != b[7].dt || !b[6].dt.IsFloat() {
		return fmt.Errorf("%s: kc is %s, vc is %s", op, b[6].dt, b[7].dt)
	}
	sums := devPtrArg(0)
	if a.Norm == gpu.QKNormSums {
		if a.QWidth < qw || a.KWidth < kw {
			return fmt.Errorf("%s: whole rows of %d and %d are narrower than the slices' %d and %d", op, a.QWidth, a.KWidth, qw, kw)
		}
		sb, err := d.bufs2(op, []string{"sums"}, a.Sums)
		if err != nil {
			return err
		}
		if err := checkLens(op, []string{"sums"}, sb, []int{2 * n}); err != nil {
			return err
		}
		if err := wantDT(op, "sums", sb[0], gpu.F32); err != nil {
			return err
		}
		sums = bufArg("sums", sb[0], gpu.F32, 2*n)
	}
	wdt := gpu.F32
	normArgs := []arg{devPtrArg(0), devPtrArg(0)}
	if a.Norm != gpu.QKNormNone {
		wdt = b[9].dt
		if !wdt.IsFloat() || b[10].dt != wdt {
			return fmt.Errorf("%s: qNorm is %s, kNorm is %s", op, wdt, b[10].dt)
		}
		wq, wk := qw, kw
		if a.Norm == gpu.QKNormHead {
			wq, wk = a.HeadDim, a.HeadDim
		}
		if err := checkLens(op, names[9:], b[9:], []int{wq, wk}); err != nil {
			return err
		}
		normArgs = []arg{bufArg("qNorm", b[9], wdt, wq), bufArg("kNorm", b[10], wdt, wk)}
	}
	capSlots := min(b[6].n, b[7].n) / kw
	if ok, err := d.prepareRows(b, wdt, sums, normArgs, capSlots, a); ok || err != nil {
		return err
	}
	kern := d.k("qkv_prep_" + suffix(wdt) + "_" + suffix(b[6].dt))
	if kern == nil {
		return fmt.Errorf("%s: the fused kernels are not loaded: rebuild with kernels/build.sh", op)
	}
	args := []arg{
		bufArg("qOut", b[0], gpu.F32, n*qw), bufArg("q", b[1], gpu.F32, lq), bufArg("k", b[2], gpu.F32, lk),
		bufArg("v", b[3], gpu.F32, lk), normArgs[0], normArgs[1], bufArg("pos", b[4], gpu.I32, n),
		bufArg("invFreq", b[5], gpu.F32, half), bufArg("kc", b[6], b[6].dt, capSlots*kw),
		bufArg("vc", b[7], b[7].dt, capSlots*kw), bufArg("slots", b[8], gpu.I32, n), sums,
		rawArg(qkvParams(a, capSlots, ldq, ldk)), devPtrArg(d.faultDev),
	}
	// 256 threads sum a block's row of squares sooner than 128: a decode
	// step 1.1% faster on the OLMo-2-7B shape, 1.4% on 1B (H200); 512
	// are slower again.
	return d.launch(kern, grid1(n*(a.Heads+a.KVHeads)), grid1(256), 0, args...)
}

// prepareRows runs PrepareQKV on qkv_prep_rows where q, k and v (b[1],
// b[2], b[3]) are the rows of one packed product: three blocks a token,
// where qkv_prep takes one a head. When the product's k was split and its
// parts are not summed yet, the kernel sums them, stores the product and
// prepares its rows, where splitk_sum and qkv_prep took two kernels (for
// enough tokens). It reports whether it ran; otherwise any pending sum has
// been summed.
func (d *Device) prepareRows(b []*Buffer, wdt gpu.DType, sums arg, normArgs []arg, capSlots int, a gpu.QKVArgs) (bool, error) {
	n, ld, qw, kw := a.N, a.Stride, a.Heads*a.HeadDim, a.KVHeads*a.HeadDim
	kern := d.k("qkv_prep_rows_" + suffix(wdt) + "_" + suffix(b[6].dt))
	// A thread takes one pair of values, or two (QP_PAIRS): a block of
	// 1,024 threads at 64 registers fills an SM, so where the 3n blocks
	// would take more than one wave of SMs, two pairs a thread let two
	// blocks share one. Measured on an H200 (docs/cuda.md): 64 sequences
	// 2% faster a step with two pairs, 12 to 32 sequences 0.3-0.8%
	// slower.
	rowThreads := func(pairs int) int { return 32 * ceilDiv(max(qw, kw), 64*pairs) }
	threads := rowThreads(1)
	if threads > 1024 || 3*n > d.info.SMs {
		threads = rowThreads(2)
	}
	packed := ld == qw+2*kw && b[1].n >= n*ld && b[2].ptr == b[1].ptr+uint64(4*qw) && b[3].ptr == b[2].ptr+uint64(4*kw)
	if kern == nil || !packed || a.HeadDim%64 != 0 || threads > 1024 {
		return false, d.flushSum()
	}
	// Few tokens' 3n blocks would read every part on a few SMs: up to a
	// quarter of the SMs, splitk_sum sums the parts first, over more
	// blocks. Measured on an H200 (132 SMs, docs/cuda.md): 9 to 11
	// sequences 2.5-3.2% faster a step that way, 3 to 8 up to 0.9%, and
	// 12 to 64 0.3-0.8% slower.
	if 3*n <= d.info.SMs/4 {
		if err := d.flushSum(); err != nil {
			return false, err
		}
	}
	src, splits, err := d.takeSum(b[1], n*ld)
	if err != nil {
		return false, err
	}
	args := []arg{
		bufArg("qOut", b[0], gpu.F32, n*qw), bufArg("qkv", b[1], gpu.F32, n*ld), bufArg("src", src, gpu.F32, splits*n*ld),
		i32Arg(splits), normArgs[0], normArgs[1], bufArg("pos", b[4], gpu.I32, n),
		bufArg("invFreq", b[5], gpu.F32, a.HeadDim/2), bufArg("kc", b[6], b[6].dt, capSlots*kw),
		bufArg("vc", b[7], b[7].dt, capSlots*kw), bufArg("slots", b[8], gpu.I32, n), sums,
		rawArg(qkvParams(a, capSlots, ld, ld)), devPtrArg(d.faultDev),
	}
	return true, d.launch(kern, dim3{3, uint32(n), 1}, grid1(threads), 0, args...)
}

// GatedMLP implements gpu.GatedMLPer. Where the gate|up product of 33 to
// 64 rows runs whole on gemm_stream8n (16-bit weights, f a multiple of 64,
// k unsplit), gemm_stream8g takes each block's gate rows with the same up
// rows and stores silu(gate)·up rounded for the down product, which reads
// it: no gate|up product in memory, no silu_rows (gu is left as it was).
// Otherwise the gate|up product goes to gu and the down product follows
// as SiLUMatMul runs it.
func (d *Device) GatedMLP(out, gu, x, gateUp, down gpu.Buffer, n, k, f, m int) error {
	const op = "gated mlp"
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	names := []string{"out", "gu", "x", "gateUp", "down"}
	b, err := d.bufs2(op, names, out, gu, x, gateUp, down)
	if err != nil {
		return err
	}
	if err := positive(op, n, k, f, m); err != nil {
		return err
	}
	if err := checkProduct(op, names, b, []int{n * m, 2 * n * f, n * k, 2 * f * k, m * f}, 3); err != nil {
		return err
	}
	if ok, err := d.gatedStream(b[0], b[2], b[3], b[4], n, k, f, m); ok || err != nil {
		return err
	}
	if err := d.matmul(b[1], b[2], b[3], n, k, 2*f); err != nil {
		return err
	}
	return d.siluMatMul(op, b[0], b[1], b[4], n, f, m)
}

// gatedStream runs GatedMLP's products through gemm_stream8g where it
// applies (GatedMLP); ok is false where it does not.
func (d *Device) gatedStream(out, x, gateUp, down *Buffer, n, k, f, m int) (ok bool, err error) {
	suf := suffix(gateUp.dt)
	kern := d.k("gemm_stream8g_" + suf)
	if kern == nil || d.info.Code != codeCubin || gateUp.dt == gpu.F32 || down.dt != gateUp.dt || gateUp.ptr%16 != 0 ||
		!streamsGated(n, k, f, d.info.SMs) {
		return false, nil
	}
	xs, err := d.productX(gateUp.dt, n, k, false)
	if err != nil {
		return true, err
	}
	if err := d.roundOnce(xs, x, n*k, false); err != nil {
		return true, err
	}
	xg, err := d.scratchBuf(gluScratch(gateUp.dt), gateUp.dt, n*f)
	if err != nil {
		return true, err
	}
	maps, err := d.tensorMaps(xs, n, 2*streamRows, gateUp, 2*f, 32, k)
	if err != nil {
		return true, err
	}
	sh := streamShapes["gemm_stream8g_"]
	if err := d.launch(kern, dim3{uint32(f / 64), 1, 1}, grid1(sh.threads()), sh.shmem(),
		append([]arg{bufArg("out", xg, xg.dt, n*f), bufArg("x", xs, xs.dt, n*k), bufArg("w", gateUp, gateUp.dt, 2*f*k),
			i32Arg(n), i32Arg(k), i32Arg(2 * f), i32Arg(k)}, maps...)...); err != nil {
		return true, err
	}
	d.overwrite(out) // by the down product
	return true, d.skinnyRounded(suf, out, xg, down, n, f, m, 1)
}

// gluScratch names the scratch where gemm_stream8g stores the down
// product's x of weights of type dt.
func gluScratch(dt gpu.DType) string { return "gemm.glu." + suffix(dt) }

// streamsGated says whether gemm_stream8g takes a gated MLP's products of
// n rows of x over k, f rows each of gate and up, on sms SMs: x rounded to
// 16 bits (more rows than the exact products take, at most skinnyRows),
// and gate|up's 2f rows on gemm_stream8n, k unsplit.
func streamsGated(n, k, f, sms int) bool {
	if n <= skinnyExactRows || n > skinnyRows || k%64 != 0 || f%64 != 0 {
		return false
	}
	name, _, _ := streamKernel("", n, 2*f, sms)
	splits, _ := skinnySplits(2*f, k, sms, 1, 1)
	return name == "gemm_stream8n_" && splits == 1
}

// SiLUMatMul runs a gated MLP's down projection with its activation
// folded in: out[r, j] = Σ_i silu(gu[r, i]) * gu[r, k+i] * w[j, i], for n
// rows of gu [n, 2k] (each gate then up, f32), w [m, k], out [n, m] (f32).
func (d *Device) SiLUMatMul(out, gu, w gpu.Buffer, n, k, m int) error {
	const op = "silu matmul"
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	b, err := d.bufs2(op, []string{"out", "gu", "w"}, out, gu, w)
	if err != nil {
		return err
	}
	if err := positive(op, n, k, m); err != nil {
		return err
	}
	if err := checkProduct(op, []string{"out", "gu", "w"}, b, []int{n * m, 2 * n * k, m * k}, 2); err != nil {
		return err
	}
	return d.siluMatMul(op, b[0], b[1], b[2], n, k, m)
}

// siluMatMul is SiLUMatMul inside operation op, on checked buffers. More
// than 8 rows with 16-bit weights form the rounded x of the tensor-core
// product from gu (silu_rows) and run it; other shapes, and the decode
// batches whose product takes x in f32, form silu(gate)*up in f32
// scratch, then the product. (One token is faster through GatedMatVec and
// a plain MatMul.)
func (d *Device) siluMatMul(op string, out, gu, w *Buffer, n, k, m int) error {
	if w.dt != gpu.F32 && (roundsX(n, k) || paired(n, k)) {
		return d.gemm(out, gu, w, n, k, m, true)
	}
	s, err := d.scratchBuf("silu", gpu.F32, n*k)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := d.siluRows(s, gu, n, k, false); err != nil {
		return err
	}
	return d.matmul(out, s, w, n, k, m)
}

// checkProduct checks the lengths of a product's buffers (b, named
// names): that the first f32s (outputs and activations) are f32 and the
// rest (weights) a float type.
func checkProduct(op string, names []string, b []*Buffer, lens []int, f32s int) error {
	if err := checkLens(op, names, b, lens); err != nil {
		return err
	}
	for i := range f32s {
		if err := wantDT(op, names[i], b[i], gpu.F32); err != nil {
			return err
		}
	}
	for i := f32s; i < len(b); i++ {
		if !b[i].dt.IsFloat() {
			return fmt.Errorf("%s: %s is %s, want f32, bf16 or f16", op, names[i], b[i].dt)
		}
	}
	return nil
}

// GatedMatVec implements gpu.GatedMatVecer. With bf16 weights and k a
// multiple of 8 one split-K GEMV takes each gate row with its up row and
// stores silu(gate)*up; other weights run MatMul into scratch, then
// silu_rows.
func (d *Device) GatedMatVec(out, x, w gpu.Buffer, k, f int) error {
	const op = "gated matvec"
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	b, err := d.bufs2(op, []string{"out", "x", "w"}, out, x, w)
	if err != nil {
		return err
	}
	if err := positive(op, k, f); err != nil {
		return err
	}
	if err := checkProduct(op, []string{"out", "x", "w"}, b, []int{f, k, 2 * f * k}, 2); err != nil {
		return err
	}
	return d.gatedMatVec(op, b[0], b[1], b[2], k, f)
}

// gatedMatVec is GatedMatVec inside an operation, on checked buffers.
func (d *Device) gatedMatVec(op string, out, x, w *Buffer, k, f int) error {
	kern, grid, wArg, tail := d.codedGEMV("glu_bf16", w, k, 2*f)
	if kern == nil && w.dt == gpu.BF16 {
		kern, grid = d.fastGEMV(true, 1, k, 2*f)
		wArg = bufArg("w", w, gpu.BF16, 2*f*k)
	}
	if kern != nil {
		return d.launch(kern, grid, grid1(256), 0, append([]arg{
			bufArg("out", out, gpu.F32, f), bufArg("x", x, gpu.F32, k), wArg, i32Arg(k), i32Arg(2 * f)}, tail...)...)
	}
	gu, err := d.scratchBuf("glu", gpu.F32, 2*f)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := d.matmul(gu, x, w, 1, k, 2*f); err != nil {
		return err
	}
	return d.siluRows(out, gu, 1, f, false)
}

// PostNormMatVec implements gpu.PostNormMatVecer. With bf16 weights (the
// norm's bf16 or f32) and k a multiple of 8, the split-K GEMV forms
// the new residual in every block from the rows of y, r and wn its warps
// load for the product (gemv_bf16_post_*, gemv_glu_bf16_post_*): no norm
// kernel between the products. Other shapes copy r to rOut, normalise
// into it and run the product.
func (d *Device) PostNormMatVec(out, rOut, r, y, wn, w gpu.Buffer, k, m int, glu bool, eps float32) error {
	const op = "post-norm matvec"
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	names := []string{"out", "rOut", "r", "y", "wn", "w"}
	b, err := d.bufs2(op, names, out, rOut, r, y, wn, w)
	if err != nil {
		return err
	}
	if err := positive(op, k, m); err != nil {
		return err
	}
	rows := m
	if glu {
		rows = 2 * m
	}
	if err := checkProduct(op, names, b, []int{m, k, k, k, k, rows * k}, 4); err != nil {
		return err
	}
	// The outputs are written while other blocks still read the inputs.
	for o := range 2 {
		for i := o + 1; i < len(b); i++ {
			if overlaps(b[o], b[i]) {
				return fmt.Errorf("%s: %s overlaps %s", op, names[o], names[i])
			}
		}
	}
	d.overwrite(b[0])
	d.overwrite(b[1])
	if b[4].dt == gpu.BF16 || b[4].dt == gpu.F32 {
		kern, grid, wArg, tail := d.codedGEMV(postKind(glu), b[5], k, rows)
		if kern == nil && b[5].dt == gpu.BF16 {
			if kern, grid = d.gemvKernel(postKind(glu), k, rows); kern != nil {
				_, ks, _ := d.gemvShape(k, rows)
				if ak, _ := d.gemvKernel(postKind(glu)+"_ahead", k, rows); ak != nil && postAhead(ks, rows, int(grid.x)) {
					kern = ak
				}
			}
			wArg = bufArg("w", b[5], gpu.BF16, rows*k)
		}
		if kern != nil {
			return d.launch(kern, grid, grid1(256), 0, append([]arg{
				bufArg("out", b[0], gpu.F32, m), bufArg("y", b[3], gpu.F32, k), wArg,
				i32Arg(k), i32Arg(rows), bufArg("rOut", b[1], gpu.F32, k), bufArg("r", b[2], gpu.F32, k),
				bufArg("wn", b[4], b[4].dt, k), i32Arg(b2i(b[4].dt == gpu.F32)), f32Arg(eps)}, tail...)...)
		}
	}
	if err := d.copyD(b[1], b[2], 4*k); err != nil {
		return err
	}
	if err := d.normLocked(op, 2, nil, b[1], b[3], b[4], 1, k, eps); err != nil {
		return err
	}
	if glu {
		return d.gatedMatVec(op, b[0], b[1], b[5], k, m)
	}
	return d.matmul(b[0], b[1], b[5], 1, k, m)
}

// HeadMatVec implements gpu.HeadMatVecer. With bf16 weights (the norms'
// bf16 or f32) and k a multiple of 8, the split-K GEMV forms x in every
// block from the rows of r, y and the norms its warps load, and its blocks
// hand their best logits to the last to finish (gemv_bf16_head_*): no
// norm or argmax kernels around the LM head. Other shapes run the norms,
// the product and the argmax one after another in scratch.
func (d *Device) HeadMatVec(out, next, r, y, wn, wf, w gpu.Buffer, k, m int, eps float32) error {
	const op = "head matvec"
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	names := []string{"out", "r", "y", "wf", "w"}
	b, err := d.bufs2(op, names, out, r, y, wf, w)
	if err != nil {
		return err
	}
	if err := positive(op, k, m); err != nil {
		return err
	}
	if err := checkProduct(op, names, b, []int{m, k, k, k, m * k}, 3); err != nil {
		return err
	}
	bo, bw := b[0], b[4]
	var bwn, bnext *Buffer
	if wn != nil {
		if bwn, err = d.buf(op, "wn", wn); err != nil {
			return err
		}
		if err := checkProduct(op, []string{"wn"}, []*Buffer{bwn}, []int{k}, 0); err != nil {
			return err
		}
		names, b = append(names, "wn"), append(b, bwn)
	}
	if next != nil {
		if bnext, err = d.buf(op, "next", next); err != nil {
			return err
		}
		if err := gpu.CheckLen(op, "next", bnext, 1); err != nil {
			return err
		}
		if err := wantDT(op, "next", bnext, gpu.I32); err != nil {
			return err
		}
		if overlaps(bo, bnext) {
			return fmt.Errorf("%s: next overlaps out", op)
		}
	}
	// The outputs are written while other blocks still read the inputs.
	for i, ib := range b[1:] {
		if overlaps(bo, ib) {
			return fmt.Errorf("%s: out overlaps %s", op, names[1+i])
		}
		if bnext != nil && overlaps(bnext, ib) {
			return fmt.Errorf("%s: next overlaps %s", op, names[1+i])
		}
	}
	d.overwrite(bo)
	norms := func(n *Buffer) bool { return n == nil || n.dt == gpu.BF16 || n.dt == gpu.F32 }
	if bw.dt == gpu.BF16 && norms(bwn) && norms(b[3]) {
		kern, grid, wArg, tail := d.codedGEMV("bf16_head", bw, k, m)
		if kern == nil {
			kern, grid = d.gemvKernel("bf16_head", k, m)
			wArg = bufArg("w", bw, gpu.BF16, m*k)
		}
		if kern != nil {
			wnArg, wnF32 := devPtrArg(0), 0
			if bwn != nil {
				wnArg, wnF32 = bufArg("wn", bwn, bwn.dt, k), b2i(bwn.dt == gpu.F32)
			}
			am := []arg{devPtrArg(0), devPtrArg(0), devPtrArg(0), devPtrArg(0)}
			if bnext != nil {
				parts := int(grid.x)
				pv, pi, err := d.argmaxParts(parts)
				if err != nil {
					return fmt.Errorf("%s: %w", op, err)
				}
				am = []arg{bufArg("next", bnext, gpu.I32, 1), bufArg("pv", pv, gpu.F32, parts),
					bufArg("pi", pi, gpu.I32, parts), bufArg("cnt", d.counters, gpu.I32, 1)}
			}
			return d.launch(kern, grid, grid1(256), 0, append([]arg{
				bufArg("out", bo, gpu.F32, m), bufArg("y", b[2], gpu.F32, k), wArg,
				i32Arg(k), i32Arg(m), bufArg("r", b[1], gpu.F32, k), wnArg, i32Arg(wnF32),
				bufArg("wf", b[3], b[3].dt, k), i32Arg(b2i(b[3].dt == gpu.F32)), f32Arg(eps)}, append(am, tail...)...)...)
		}
	}
	// x = rmsnorm(r + u) * wf in scratch: r's copy takes u, then the norm.
	sr, err := d.scratchBuf("head.r", gpu.F32, k)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	sx, err := d.scratchBuf("head.x", gpu.F32, k)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := d.copyD(sr, b[1], 4*k); err != nil {
		return err
	}
	if bwn != nil {
		if err := d.normLocked(op, 2, nil, sr, b[2], bwn, 1, k, eps); err != nil {
			return err
		}
		if err := d.normLocked(op, 0, sx, nil, sr, b[3], 1, k, eps); err != nil {
			return err
		}
	} else if err := d.normLocked(op, 1, sx, sr, b[2], b[3], 1, k, eps); err != nil {
		return err
	}
	if err := d.matmul(bo, sx, bw, 1, k, m); err != nil {
		return err
	}
	if bnext == nil {
		return nil
	}
	return d.argmax(bnext, bo, 1, m)
}

// postAhead says whether a post-norm product of rows rows of weights, each
// row's k split over ks warps, on a grid of blocks takes the kernel that asks for
// its second group of weights before the post-norm's prologue
// (gemv_*_post_ahead_*, up to two units of k a warp): where each block
// sums at most 8 groups, so that the prologue is a large part of its
// life. Measured on an H200 (docs/cuda.md): OLMo-2-1B's q|k|v and gate|up
// products (3 and 8 groups a block) 0.8095 → 0.800 ms a token; OLMo-2-7B's
// (12 and 21) would go 3.591 → 3.607.
func postAhead(ks, rows, blocks int) bool {
	return ceilDiv(gemvGroups(ks, rows), blocks) <= 8
}

// postKind is the kind of fast GEMV (gemvKernel) that forms its row of x
// from a post-norm.
func postKind(glu bool) string {
	if glu {
		return "glu_bf16_post"
	}
	return "bf16_post"
}

// siluRows writes silu(gate)*up of gu's n rows ([n, 2k]) into out ([n, k],
// f32 or the 16-bit type of a product's rounded x; with pairs, [2n, k]:
// the roundings, then the remainders' as split_x writes them, k % 8 = 0).
func (d *Device) siluRows(out, gu *Buffer, n, k int, pairs bool) error {
	kern := d.k("silu_rows_" + suffix(out.dt))
	if kern == nil {
		return fmt.Errorf("silu matmul: the fused kernels are not loaded: rebuild with kernels/build.sh")
	}
	part, splits, err := d.takeSum(gu, 2*n*k)
	if err != nil {
		return err
	}
	rows := n
	if pairs {
		if out.dt == gpu.F32 || k%8 != 0 {
			return fmt.Errorf("silu matmul: pairs of %s rows of %d", out.dt, k)
		}
		rows = 2 * n
	}
	return d.launch(kern, grid1(ceilDiv(ceilDiv(n*k, 8), 256)), grid1(256), 0,
		bufArg("out", out, out.dt, rows*k), bufArg("gu", part, gpu.F32, splits*2*n*k), i32Arg(n), i32Arg(k), i32Arg(splits),
		i32Arg(b2i(pairs)))
}
