package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/troupe/troupe/gpu"
)

// suffix names a float dtype in kernel names.
func suffix(dt gpu.DType) string {
	switch dt {
	case gpu.F32:
		return "f32"
	case gpu.BF16:
		return "bf16"
	case gpu.F16:
		return "f16"
	}
	return dt.String()
}

// kernelNames lists every kernel the operations launch; Open resolves them
// all, so a stale artifact fails at Open, not mid-model.
func kernelNames() []string {
	names := []string{"add_f32", "silumul_f32", "rope_f32", "argmax_f32", "reduce_sum_f32", "attn_combine",
		"allgather_u8", "broadcast_u8", "sumsq2_allreduce_f32", "splitk_sum", "moe_topk", "moe_route", "moe_combine", "sample_rows", "adjust_follow", "adjust_compact", "adjust_append", "adjust_apply", "adjust_restore"}
	for _, s := range []string{"f32", "bf16", "f16"} {
		names = append(names, "allreduce_oneshot_"+s, "allreduce_twoshot_"+s, "allreduce_twoshot_ipc_"+s, "allreduce_ll_"+s, "allreduce_add_rmsnorm_"+s, "allreduce_rmsnorm_add_"+s, "embed_"+s, "rmsnorm_"+s, "add_rmsnorm_"+s, "rmsnorm_add_"+s, "storekv_"+s,
			"gemv_"+s, "gemm_"+s, "moe_logits_"+s, "moe_gateup_"+s, "moe_down_"+s, "moe_gateup1_"+s, "moe_down1_"+s)
		for _, hd := range []int{64, 128, 256} {
			names = append(names, fmt.Sprintf("attn_split_%s_hd%d", s, hd))
		}
	}
	for _, s := range []string{"bf16", "f16"} {
		names = append(names, "round_x_"+s, "split_x_"+s, "gemm_"+s+"_l", "gemm_"+s+"_s", "moe_mm_"+s,
			"attn_prefill_"+s+"_hd64", "attn_prefill_"+s+"_hd128", "attn_decode_"+s+"_hd64", "attn_decode_"+s+"_hd128",
			skinnyName(s, false), skinnyName(s, true))
		for _, hd := range []int{64, 128} {
			for _, g := range []int{1, 2} {
				names = append(names, mhaName(s, hd, g))
			}
		}
	}
	for _, s := range gemvSplits {
		names = append(names, fmt.Sprintf("gemv_bf16_nv%d_ks%d", s.nv, s.ks))
		for _, n := range []int{2, 4} {
			if kind, ok := gemvKind(n, s.nv); ok {
				names = append(names, fmt.Sprintf("gemv_%s_nv%d_ks%d", kind, s.nv, s.ks))
			}
		}
	}
	return names
}

// optionalKernelNames are kernels an older artifact set may lack: the
// device opens without them and the operations that need them fail.
func optionalKernelNames() []string {
	return append([]string{"gemm_wg_bf16", "sumsq2_f32", "rmsnorm_shard_f32", "rmsnorm_shard_bf16", "rmsnorm_shard_f16"}, fusedKernelNames()...)
}

func (d *Device) k(name string) *kernel { return d.kern[name] }

// room is how many blocks of the named kernel an SM holds at the shape it
// is launched with (kernel.occ), 0 when unknown.
func (d *Device) room(name string) int {
	if k := d.k(name); k != nil {
		return k.occ
	}
	return 0
}

// typed returns the kernel name+"_"+dtype suffix for a float dtype.
func (d *Device) typed(op, arg, name string, dt gpu.DType) (*kernel, error) {
	if !dt.IsFloat() {
		return nil, fmt.Errorf("%s: %s is %s, want f32, bf16 or f16", op, arg, dt)
	}
	return d.k(name + "_" + suffix(dt)), nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// bufs resolves gpu.Buffers to this device's buffers, naming the first bad one.
func (d *Device) bufs2(op string, names []string, bs ...gpu.Buffer) ([]*Buffer, error) {
	out := make([]*Buffer, len(bs))
	for i, b := range bs {
		cb, err := d.buf(op, names[i], b)
		if err != nil {
			return nil, err
		}
		out[i] = cb
	}
	return out, nil
}

func wantDT(op, arg string, b *Buffer, dt gpu.DType) error {
	if b.dt != dt {
		return fmt.Errorf("%s: %s is %s, want %s", op, arg, b.dt, dt)
	}
	return nil
}

func checkLens(op string, names []string, bs []*Buffer, lens []int) error {
	for i, b := range bs {
		if err := gpu.CheckLen(op, names[i], b, lens[i]); err != nil {
			return err
		}
	}
	return nil
}

func positive(op string, vals ...int) error {
	for _, v := range vals {
		if v <= 0 {
			return fmt.Errorf("%s: invalid shape %v", op, vals)
		}
	}
	return nil
}

func blockFor(width int) int {
	t := 32
	for t < 1024 && t*4 < width {
		t *= 2
	}
	return t
}

// Embed implements gpu.Ops. Outside graph recording it waits for the
// gather and returns an error for an id outside the table; while
// recording, such an error is returned by the next Sync or Read.
func (d *Device) Embed(out, table, ids gpu.Buffer, n, dim int) error {
	if err := d.enter("embed"); err != nil {
		return err
	}
	defer d.leave()
	b, err := d.bufs2("embed", []string{"out", "table", "ids"}, out, table, ids)
	if err != nil {
		return err
	}
	if err := positive("embed", n, dim); err != nil {
		return err
	}
	if err := checkLens("embed", []string{"out", "ids"}, []*Buffer{b[0], b[2]}, []int{n * dim, n}); err != nil {
		return err
	}
	if err := wantDT("embed", "out", b[0], gpu.F32); err != nil {
		return err
	}
	if err := wantDT("embed", "ids", b[2], gpu.I32); err != nil {
		return err
	}
	k, err := d.typed("embed", "table", "embed", b[1].dt)
	if err != nil {
		return err
	}
	rows := b[1].n / dim
	err = d.launch(k, grid1(n), grid1(min(256, blockFor(dim))), 0,
		bufArg("out", b[0], gpu.F32, n*dim), bufArg("table", b[1], 0, rows*dim), bufArg("ids", b[2], gpu.I32, n),
		i32Arg(n), i32Arg(dim), i32Arg(rows), devPtrArg(d.faultDev))
	if err != nil || d.capture {
		return err
	}
	return d.do(func() error {
		if err := d.syncStream(); err != nil {
			return fmt.Errorf("embed: %w", err)
		}
		return d.takeErr()
	})
}

// MatMul implements gpu.Ops. Up to 4 rows with bf16 weights run the
// split-K GEMV, which reads each weight once for all rows (up to 2 or 1
// rows where k needs more registers); other 16-bit products the
// tensor-core kernels (gemm: up to skinnyExactRows rows as exact as f32 x,
// more with x rounded to the weight's type); the rest up to 8 rows a GEMV
// that reads each weight once, and more rows the f32 tiled GEMM.
func (d *Device) MatMul(out, x, w gpu.Buffer, n, k, m int) error {
	if err := d.enter("matmul"); err != nil {
		return err
	}
	defer d.leave()
	b, err := d.bufs2("matmul", []string{"out", "x", "w"}, out, x, w)
	if err != nil {
		return err
	}
	if err := positive("matmul", n, k, m); err != nil {
		return err
	}
	if err := checkProduct("matmul", []string{"out", "x", "w"}, b, []int{n * m, n * k, m * k}); err != nil {
		return err
	}
	return d.matmul(b[0], b[1], b[2], n, k, m)
}

// roundedX identifies a 16-bit copy of x (n elements of type dt) in the
// scratch buffer xs.
type roundedX struct {
	x, xs *Buffer
	n     int
	dt    gpu.DType
	pairs bool // split_x's rounding and remainder, 2n rows
}

func (d *Device) matmul(out, x, w *Buffer, n, k, m int) error {
	if r := d.rounded.x; r != nil && out.ptr < r.ptr+uint64(r.size) && r.ptr < out.ptr+uint64(out.size) {
		d.rounded = roundedX{} // the product overwrites the rounded x
	}
	args := []arg{bufArg("out", out, gpu.F32, n*m), bufArg("x", x, gpu.F32, n*k), bufArg("w", w, w.dt, m*k)}
	if w.dt == gpu.BF16 {
		if kern, grid := d.fastGEMV(false, n, k, m); kern != nil {
			if n > 1 {
				args = append(args, i32Arg(n))
			}
			return d.launch(kern, grid, grid1(256), 0, append(args, i32Arg(k), i32Arg(m))...)
		}
	}
	if w.dt != gpu.F32 && k%8 == 0 && (n > 8 || exactSkinny(n, k)) {
		return d.gemm(out, x, w, n, k, m, false)
	}
	suf := suffix(w.dt)
	if n <= 8 {
		return d.launch(d.k("gemv_"+suf), grid1(ceilDiv(m, 8)), grid1(256), 0, append(args, i32Arg(n), i32Arg(k), i32Arg(m))...)
	}
	if ceilDiv(n, 64) > 65535 {
		return fmt.Errorf("matmul: %d rows of x, at most %d", n, 65535*64)
	}
	tile := 128
	if w.dt == gpu.F32 {
		tile = 64
	}
	return d.launch(d.k("gemm_"+suf), dim3{uint32(ceilDiv(m, tile)), uint32(ceilDiv(n, 64)), 1}, grid1(256), 0,
		append(args, i32Arg(n), i32Arg(k), i32Arg(m))...)
}

// skinnyRows is the most rows of x gemm_skinny takes; skinnyCols the rows
// of w per block (kernels/cuda/gemm.cu).
const skinnyRows, skinnyCols = 64, 128

// gemmWG runs a product of more than skinnyRows rows with bf16 weights on
// Hopper's warpgroup tensor cores (gemm_wg_bf16 in the sm_90a cubin), x16
// and w reached through TMA descriptors. ok is false when the product or
// the device does not qualify; the caller then runs gemm_pipe.
func (d *Device) gemmWG(out, xs, w *Buffer, n, k, m int) (ok bool, err error) {
	kern := d.k("gemm_wg_bf16")
	if kern == nil || d.info.Code != codeCubin || w.dt != gpu.BF16 || n <= skinnyRows || k%64 != 0 || w.ptr%16 != 0 {
		return false, nil
	}
	tmx, err := d.tensorMap(xs, n, k, 128)
	if err != nil {
		return true, fmt.Errorf("matmul: %w", err)
	}
	tmw, err := d.tensorMap(w, m, k, 256)
	if err != nil {
		return true, fmt.Errorf("matmul: %w", err)
	}
	tiles := ceilDiv(n, 128) * ceilDiv(m, 256)
	return true, d.launch(kern, grid1(min(tiles, d.info.SMs)), grid1(384), wgSharedMemory,
		bufArg("out", out, gpu.F32, n*m), bufArg("x", xs, gpu.BF16, n*k), bufArg("w", w, gpu.BF16, m*k),
		i32Arg(n), i32Arg(k), i32Arg(m), rawArg(tmx), rawArg(tmw))
}

// wgSharedMemory is GEMM_WG_SMEM in kernels/cuda/gemm_wg.cu: 4 stages of
// (128+256) x 64 bf16, 1 KiB for alignment and the stages' barriers.
const wgSharedMemory = 4*(128+256)*64*2 + 1024 + 4*16

// tensorMap encodes a TMA descriptor (CUtensorMap) for b as a row-major
// [rows, k] bf16 matrix: boxes of 64 along k by boxRows rows, 128-byte
// swizzle, zeros beyond the edges. The 128 bytes are passed to the kernel
// by value; the buffer keeps the last ones encoded.
func (d *Device) tensorMap(b *Buffer, rows, k, boxRows int) ([]byte, error) {
	if c := &b.tmap; c.raw != nil && c.rows == rows && c.k == k && c.box == boxRows {
		return c.raw, nil
	}
	const (
		dtBF16     = 9 // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
		swizzle128 = 3 // CU_TENSOR_MAP_SWIZZLE_128B
		l2Promo256 = 3 // CU_TENSOR_MAP_L2_PROMOTION_L2_256B
	)
	if b.ptr%16 != 0 || (2*k)%16 != 0 {
		return nil, fmt.Errorf("tensor map: address or row stride not 16-byte aligned")
	}
	// Every argument lives on the heap (ptr); CUtensorMap is 64-byte aligned.
	raw := new([128 + 64]byte)
	off := (64 - int(uintptr(unsafe.Pointer(&raw[0]))%64)) % 64
	dims := &[2]uint64{uint64(k), uint64(rows)}
	strides := &[1]uint64{uint64(2 * k)}
	box := &[2]uint32{64, uint32(boxRows)}
	elem := &[2]uint32{1, 1}
	// The driver checks the address against the current context: encode
	// on the device's thread.
	err := d.do(func() error {
		return d.drv.cuTensorMapEncodeTiled.call(ptr(raw)+uintptr(off), dtBF16, 2, uintptr(b.ptr),
			ptr(dims), ptr(strides), ptr(box), ptr(elem), 0, swizzle128, l2Promo256, 0)
	})
	runtime.KeepAlive(raw)
	runtime.KeepAlive(dims)
	runtime.KeepAlive(strides)
	runtime.KeepAlive(box)
	runtime.KeepAlive(elem)
	if err != nil {
		return nil, fmt.Errorf("tensor map of %d x %d: %w", rows, k, err)
	}
	tm := append([]byte(nil), raw[off:off+128]...)
	b.tmap.rows, b.tmap.k, b.tmap.box, b.tmap.raw = rows, k, boxRows, tm
	return tm, nil
}

// skinnySplits cuts k (a multiple of 64) for gemm_skinny into parts of
// at least 128 for about perSM blocks per SM (its occupancy); chunk is a
// multiple of 64.
func skinnySplits(m, k, sms, perSM int) (splits, chunk int) {
	tiles := ceilDiv(m, skinnyCols)
	splits = max(1, min(perSM*sms/tiles, k/128, 16))
	chunk = ceilDiv(k/64, splits) * 64
	return ceilDiv(k, chunk), chunk
}

// gemmTile is a tile configuration of the pipelined tensor-core GEMM
// (gemm_pipe in kernels/cuda/gemm.cu).
type gemmTile struct {
	suffix     string // kernel name suffix
	rows, cols int    // output tile
	threads    int
	shmem      int // dynamic shared memory: stages × (rows+cols) × 32 × 2 bytes
	// When the tiles alone leave SMs idle, k is split for about perSM
	// blocks per SM, each at least minSteps steps of 32 along k.
	perSM, minSteps int
}

// gemmTileFor picks 128x128 tiles for prompts and 64x64 for decode batches,
// whose few rows make the product a stream of the weights. The splits were
// measured on an H200 (docs/cuda.md, "Prompt and batch products").
func gemmTileFor(n int) gemmTile {
	if n > 64 {
		return gemmTile{"_l", 128, 128, 256, 4 * (128 + 128) * 32 * 2, 2, 8}
	}
	return gemmTile{"_s", 64, 64, 128, 6 * (64 + 64) * 32 * 2, 4, 4}
}

// splits returns how many parts k is cut into for an output of the given
// tiles on sms SMs, and chunk, the k of each part (a multiple of 32).
func (t gemmTile) splits(tiles, k, sms int) (splits, chunk int) {
	steps := ceilDiv(k, 32)
	splits = 1
	if tiles < sms {
		splits = max(1, min(t.perSM*sms/tiles, steps/t.minSteps, 16))
	}
	chunk = ceilDiv(steps, splits) * 32
	return ceilDiv(k, chunk), chunk
}

// roundX writes the first count elements of x (f32) rounded to xs's
// 16-bit type into xs (round_x), or with pairs their rounding and then
// their remainder's, 2·count elements (split_x).
func (d *Device) roundX(xs, x *Buffer, count int, pairs bool) error {
	name, n := "round_x_", count
	if pairs {
		name, n = "split_x_", 2*count
	}
	return d.launch(d.k(name+suffix(xs.dt)), grid1(ceilDiv(ceilDiv(count, 8), 256)), grid1(256), 0,
		bufArg("out", xs, xs.dt, n), bufArg("x", x, gpu.F32, count), i64Arg(count))
}

// roundOnce is roundX unless xs already holds that rounding of x
// (d.rounded): products of one x in a row (q, k, v; gate, up) round it
// once.
func (d *Device) roundOnce(xs, x *Buffer, count int, pairs bool) error {
	key := roundedX{x: x, n: count, dt: xs.dt, xs: xs, pairs: pairs}
	if d.rounded == key {
		return nil
	}
	if err := d.roundX(xs, x, count, pairs); err != nil {
		d.rounded = roundedX{}
		return err
	}
	d.rounded = key
	return nil
}

// gemm runs out = x · wᵀ for 16-bit w and k a multiple of 8. Decode
// batches of up to skinnyExactRows rows take x as exactly as f32
// (SiLUMatMul forms their f32 rows itself): up to 8 rows on
// gemm_skinny_*_exact, more as twice the rows of 16 bits (skinnyPairs);
// otherwise x is rounded to w's type once and the product runs on
// gemm_skinny (up to 64 rows), the Hopper product or gemm_pipe tiles. When
// k is split, the ordered sum of the partial products follows. With silu,
// x holds n rows of gate then up ([n, 2k]) and the product's input is
// silu(gate)*up.
func (d *Device) gemm(out, x, w *Buffer, n, k, m int, silu bool) error {
	suf := suffix(w.dt)
	if paired(n, k) {
		return d.skinnyPairs(suf, out, x, w, n, k, m, silu)
	}
	if !silu && exactSkinny(n, k) {
		return d.skinny(suf, out, x, w, n, k, m)
	}
	xs, err := d.scratchBuf("gemm.x."+suf, w.dt, n*k)
	if err != nil {
		return err
	}
	if silu {
		d.rounded = roundedX{}
		if err := d.siluRows(xs, x, n, k, false); err != nil {
			return err
		}
	} else if err := d.roundOnce(xs, x, n*k, false); err != nil {
		return err
	}
	if n <= skinnyRows && k%64 == 0 {
		return d.skinny(suf, out, xs, w, n, k, m)
	}
	if ok, err := d.gemmWG(out, xs, w, n, k, m); ok || err != nil {
		return err
	}
	t := gemmTileFor(n)
	if ceilDiv(n, t.rows) > 65535 {
		return fmt.Errorf("matmul: %d rows of x, at most %d", n, 65535*t.rows)
	}
	splits, chunk := t.splits(ceilDiv(n, t.rows)*ceilDiv(m, t.cols), k, d.info.SMs)
	grid := dim3{uint32(ceilDiv(m, t.cols)), uint32(ceilDiv(n, t.rows)), uint32(splits)}
	return d.splitProduct(d.k("gemm_"+suf+t.suffix), grid, t.threads, t.shmem, out, xs, w, n, k, m, splits, chunk, 1)
}

// skinnyExactRows is the most rows for which decode-batch products also
// multiply the remainder of x's rounding to 16 bits: as exact as f32 x for
// steps of a few tokens (and the fixtures' prompts). More rows round x to
// 16 bits: the remainder doubles the bytes of x a block stages, which at
// 64 rows cost as much as the weights (docs/cuda.md).
const skinnyExactRows = 32

// exactSkinny says whether a product of n rows of x over k takes x in f32
// as exactly as the exact decode-batch kernel does.
func exactSkinny(n, k int) bool { return n <= skinnyExactRows && k%64 == 0 }

// pairsX says whether an exact product of n rows takes x as 2n rows of
// 16 bits (skinnyPairs) rather than in f32 (gemm_skinny_*_exact_t1): from
// 9 rows, where exact kernels of two and eight token tiles ran at 1.0-2.2
// TB/s of weights and the pairs at 1.6-2.8; at 6 and 8 rows the pairs
// made a step slower (docs/cuda.md).
func pairsX(n int) bool { return n > skinnyExactTile }

// paired says whether a product of n rows over k with 16-bit weights takes
// x as pairs of 16-bit rows (skinnyPairs), which the kernel ahead may
// store itself (the norms, silu_rows).
func paired(n, k int) bool { return exactSkinny(n, k) && pairsX(n) }

// skinnyPairs runs an exact decode-batch product of n rows of x (f32) as a
// rounded one of 2n: split_x writes x's rounding to w's type as rows 0..n-1
// and its remainder's as rows n..2n-1, gemm_skinny multiplies both, and
// the sum of its parts, the two halves of each split in turn, is the
// product (splitProduct). The same sums as the exact kernel's, which splits x
// in every block and runs two mmas a step where this runs one. With silu,
// x holds n rows of gate then up ([n, 2k]) and silu_rows writes the pairs
// of silu(gate)*up.
func (d *Device) skinnyPairs(suf string, out, x, w *Buffer, n, k, m int, silu bool) error {
	xs, err := d.scratchBuf("gemm.x."+suf, w.dt, 2*n*k)
	if err != nil {
		return err
	}
	if silu {
		d.rounded = roundedX{}
		err = d.siluRows(xs, x, n, k, true)
	} else {
		err = d.roundOnce(xs, x, n*k, true)
	}
	if err != nil {
		return err
	}
	splits, chunk := skinnySplits(m, k, d.info.SMs, skinnyPerSM(false))
	grid := dim3{uint32(ceilDiv(m, skinnyCols)), uint32(splits), 1}
	return d.splitProduct(d.k(skinnyName(suf, false)), grid, 128, 0, out, xs, w, n, k, m, splits, chunk, 2)
}

// skinnyName is gemm_skinny's entry point for x exact (f32, up to
// skinnyExactTile rows: one token tile) or rounded to the weights' type suf
// (eight token tiles of 8 rows).
func skinnyName(suf string, exact bool) string {
	if exact {
		return "gemm_skinny_" + suf + "_exact_t1"
	}
	return "gemm_skinny_" + suf + "_t8"
}

// skinnyExactTile is the most rows the exact kernel takes: its one token
// tile holds few accumulators, so four blocks fit on an SM (pairsX sends
// more rows to skinnyPairs).
const skinnyExactTile = 8

// skinnyPerSM is the blocks per SM gemm_skinny's splits of k aim for: its
// occupancy, four blocks of the exact kernel, three of the rounded one.
func skinnyPerSM(exact bool) int {
	if exact {
		return 4
	}
	return 3
}

// skinny launches gemm_skinny over n rows of x: f32 x (at most
// skinnyExactTile rows) on the exact kernel, staged in dynamic shared
// memory (rows of SK_XK = 256 f32), or x rounded to suf; k split for about
// skinnyPerSM blocks per SM.
func (d *Device) skinny(suf string, out, x, w *Buffer, n, k, m int) error {
	exact, shmem := x.dt == gpu.F32, 0
	if exact {
		if n > skinnyExactTile {
			return fmt.Errorf("matmul: %d rows of f32 x on the exact kernel, at most %d", n, skinnyExactTile)
		}
		shmem = skinnyExactTile * 256 * 4
	}
	splits, chunk := skinnySplits(m, k, d.info.SMs, skinnyPerSM(exact))
	grid := dim3{uint32(ceilDiv(m, skinnyCols)), uint32(splits), 1}
	return d.splitProduct(d.k(skinnyName(suf, exact)), grid, 128, shmem, out, x, w, n, k, m, splits, chunk, 1)
}

// splitProduct launches a product kernel taking (out, x, w, rows, k, m,
// chunk) whose splits of k write partial products, then sums them in
// split order into out. x holds halves × n rows: with 2 (skinnyPairs),
// rows n.. are the remainders of rows 0.., and each split's two halves of
// the product are summed in turn.
func (d *Device) splitProduct(kern *kernel, grid dim3, threads, shmem int, out, x, w *Buffer, n, k, m, splits, chunk, halves int) error {
	rows, parts := halves*n, halves*splits
	dst := out
	if parts > 1 {
		var err error
		if dst, err = d.scratchBuf("gemm.part", gpu.F32, splits*rows*m); err != nil {
			return err
		}
	}
	err := d.launch(kern, grid, grid1(threads), shmem,
		bufArg("out", dst, gpu.F32, splits*rows*m), bufArg("x", x, x.dt, rows*k), bufArg("w", w, w.dt, m*k),
		i32Arg(rows), i32Arg(k), i32Arg(m), i32Arg(chunk))
	if err != nil || parts == 1 {
		return err
	}
	// The parts are summed by whatever reads out next (sums.go).
	d.sum = pendingSum{out: out, part: dst, count: n * m, splits: parts}
	return nil
}

// gemvSplits are the splits of the fast GEMV's kernels (gemv.cu): nv units
// of k a warp, ks warps a row, in increasing nv for each ks.
var gemvSplits = []struct{ nv, ks int }{{1, 1}, {2, 1}, {2, 2}, {2, 4}, {2, 8}, {3, 8}, {4, 8}, {6, 8}, {8, 8}}

// gemvShape picks the split of k for the batch-1 bf16 GEMV (k a multiple
// of 8, up to 16384): k is cut into ceil(k/256) units and ks warps share a
// row, each taking its share of the units in a kernel of the fewest units
// that cover it. As many warps as leave each at least two units (two
// 16-byte loads per lane) were measured best on the H200 for the
// OLMo-2-1B shapes (see docs/cuda.md).
func (d *Device) gemvShape(k, m int) (nv, ks int, ok bool) {
	if k%8 != 0 || k <= 0 {
		return 0, 0, false
	}
	units := ceilDiv(k, 256)
	for _, c := range []int{8, 4, 2, 1} {
		per := ceilDiv(units, c)
		if c > units || (per < 2 && units > 1) {
			continue
		}
		for _, s := range gemvSplits {
			if s.ks == c && s.nv >= per {
				return s.nv, c, true
			}
		}
		return 0, 0, false
	}
	return 0, 0, false
}

// gemvKind is the kind of fast GEMV that takes n rows of x at nv units of
// k a warp: "bf16" for one row, "bf16_b2" for two, "bf16_b4" for three or
// four; false where each lane's registers cannot hold the rows' units of
// x (kernels/cuda/gemv.cu).
func gemvKind(n, nv int) (string, bool) {
	switch {
	case n == 1:
		return "bf16", true
	case n == 2 && nv <= 6:
		return "bf16_b2", true
	case n >= 3 && n <= 4 && nv <= 4:
		return "bf16_b4", true
	}
	return "", false
}

// fastGEMV is the bf16 split-K GEMV for n rows of x and k, m (with glu,
// GatedMatVec's: one row, m = 2f), with its grid; nil when no kernel
// takes them.
func (d *Device) fastGEMV(glu bool, n, k, m int) (*kernel, dim3) {
	nv, ks, ok := d.gemvShape(k, m)
	if !ok {
		return nil, dim3{}
	}
	kind := "glu_bf16"
	if !glu {
		if kind, ok = gemvKind(n, nv); !ok {
			return nil, dim3{}
		}
	}
	kern := d.k(fmt.Sprintf("gemv_%s_nv%d_ks%d", kind, nv, ks))
	if kern == nil {
		return nil, dim3{}
	}
	return kern, grid1(d.gemvGrid(ks, m, kern.occ))
}

// gemvGrid is the fast GEMV's grid: every group of m's rows its own
// block, up to four blocks per SM (the grid strides beyond that; measured
// best on an H200, BenchmarkGEMVGrid in docs/cuda.md), and no more than
// fit on an SM at once (occ, from the driver; 0 when unknown).
func (d *Device) gemvGrid(ks, m, occ int) int {
	perSM := 4
	if occ > 0 {
		perSM = min(perSM, occ)
	}
	return min(ceilDiv(m, 8/ks*2), perSM*d.info.SMs)
}

// RMSNorm implements gpu.Ops.
func (d *Device) RMSNorm(out, x, w gpu.Buffer, n, dim int, eps float32) error {
	return d.norm("rmsnorm", 0, out, nil, x, w, n, dim, eps)
}

// AddRMSNorm adds x into the residual r and normalises the sum:
// r += x; out = rmsnorm(r) * w (pre-norm blocks). out may alias x.
func (d *Device) AddRMSNorm(out, r, x, w gpu.Buffer, n, dim int, eps float32) error {
	return d.norm("addrmsnorm", 1, out, r, x, w, n, dim, eps)
}

// RMSNormAdd adds the normalised x into the residual r:
// r += rmsnorm(x) * w (post-norm blocks such as OLMo 2).
func (d *Device) RMSNormAdd(r, x, w gpu.Buffer, n, dim int, eps float32) error {
	return d.norm("rmsnormadd", 2, nil, r, x, w, n, dim, eps)
}

// normBufs resolves a norm's buffers, named names: "w" holds dim
// weights, every other n·dim f32 values.
func (d *Device) normBufs(op string, names []string, bs []gpu.Buffer, n, dim int) ([]*Buffer, error) {
	b, err := d.bufs2(op, names, bs...)
	if err != nil {
		return nil, err
	}
	for i, nm := range names {
		want := n * dim
		if nm == "w" {
			want = dim
		} else if err := wantDT(op, nm, b[i], gpu.F32); err != nil {
			return nil, err
		}
		if err := gpu.CheckLen(op, nm, b[i], want); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (d *Device) norm(op string, mode int, out, r, x, w gpu.Buffer, n, dim int, eps float32) error {
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	if err := positive(op, n, dim); err != nil {
		return err
	}
	names := []string{"x", "w"}
	bs := []gpu.Buffer{x, w}
	if mode != 2 {
		names, bs = append(names, "out"), append(bs, out)
	}
	if mode != 0 {
		names, bs = append(names, "r"), append(bs, r)
	}
	b, err := d.normBufs(op, names, bs, n, dim)
	if err != nil {
		return err
	}
	prefix := [...]string{"rmsnorm", "add_rmsnorm", "rmsnorm_add"}[mode]
	k, err := d.typed(op, "w", prefix, b[1].dt)
	if err != nil {
		return err
	}
	xa, wa := bufArg("x", b[0], gpu.F32, n*dim), bufArg("w", b[1], b[1].dt, dim)
	// The rows a product reads next: out, or r after a post-norm. When
	// that product rounds x to w's 16-bit type, the kernel stores the
	// rounding too, or both halves where the product takes x as pairs of
	// 16-bit rows (as split_x would), and the product skips its own
	// (d.rounded). A norm in place (a QK-norm; the final norm) is left out:
	// attention reads the former.
	next, xq, pairs := b[2], (*Buffer)(nil), false
	if mode != 0 || b[0] != b[2] {
		if xq, pairs, err = d.nextX(b[1].dt, n, dim); err != nil {
			return err
		}
	}
	tail := append([]arg{i32Arg(n), i32Arg(dim), f32Arg(eps)}, nextXArgs(xq, pairs, n, dim)...)
	var args []arg
	switch mode {
	case 0:
		args = append([]arg{bufArg("out", b[2], gpu.F32, n*dim), xa, wa}, tail...)
	case 1:
		args = append([]arg{bufArg("out", b[2], gpu.F32, n*dim), bufArg("r", b[3], gpu.F32, n*dim), xa, wa}, tail...)
	default:
		args = append([]arg{bufArg("r", b[2], gpu.F32, n*dim), xa, wa}, tail...)
	}
	if err := d.launch(k, grid1(n), grid1(blockFor(dim)), 0, args...); err != nil {
		return err
	}
	d.keepX(next, xq, pairs, n*dim)
	return nil
}

// nextX is the scratch where a kernel also stores the x of the product
// with weights of type dt that reads its n rows of k next, as that product
// would form it: rounded (roundsX) or as pairs of rows (paired). It is nil
// where the product takes x as it is.
func (d *Device) nextX(dt gpu.DType, n, k int) (xq *Buffer, pairs bool, err error) {
	pairs = paired(n, k)
	if dt == gpu.F32 || !(roundsX(n, k) || pairs) {
		return nil, false, nil
	}
	xq, err = d.scratchBuf("gemm.x."+suffix(dt), dt, xRows(n, pairs)*k)
	return xq, pairs, err
}

// nextXArgs are the kernel arguments (xq, pairs) for nextX's scratch:
// null and 0 without one.
func nextXArgs(xq *Buffer, pairs bool, n, k int) []arg {
	if xq == nil {
		return []arg{devPtrArg(0), i32Arg(0)}
	}
	return []arg{bufArg("xq", xq, xq.dt, xRows(n, pairs)*k), i32Arg(b2i(pairs))}
}

// keepX records that xq (from nextX, when not nil) holds the product's x
// formed from the count elements of x, so the product skips forming it.
func (d *Device) keepX(x, xq *Buffer, pairs bool, count int) {
	if xq != nil {
		d.rounded = roundedX{x: x, xs: xq, n: count, dt: xq.dt, pairs: pairs}
	}
}

// xRows is the rows of 16 bits a product's x of n rows takes.
func xRows(n int, pairs bool) int {
	if pairs {
		return 2 * n
	}
	return n
}

func (d *Device) elementwise(op, kname string, out, a, c gpu.Buffer, names [3]string, n int) error {
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	b, err := d.bufs2(op, names[:], out, a, c)
	if err != nil {
		return err
	}
	if err := checkLens(op, names[:], b, []int{n, n, n}); err != nil {
		return err
	}
	for i := range b {
		if err := wantDT(op, names[i], b[i], gpu.F32); err != nil {
			return err
		}
	}
	if n == 0 {
		return nil
	}
	g := max(1, min(ceilDiv(ceilDiv(n, 4), 256), 8*d.info.SMs))
	return d.launch(d.k(kname), grid1(g), grid1(256), 0,
		bufArg(names[0], b[0], gpu.F32, n), bufArg(names[1], b[1], gpu.F32, n), bufArg(names[2], b[2], gpu.F32, n), i32Arg(n))
}

// Add implements gpu.Ops.
func (d *Device) Add(out, a, b gpu.Buffer, n int) error {
	return d.elementwise("add", "add_f32", out, a, b, [3]string{"out", "a", "b"}, n)
}

// SiLUMul implements gpu.Ops.
func (d *Device) SiLUMul(out, gate, up gpu.Buffer, n int) error {
	return d.elementwise("silumul", "silumul_f32", out, gate, up, [3]string{"out", "gate", "up"}, n)
}

// RoPE implements gpu.Ops.
func (d *Device) RoPE(x, pos, invFreq gpu.Buffer, n, heads, headDim int) error {
	if err := d.enter("rope"); err != nil {
		return err
	}
	defer d.leave()
	b, err := d.bufs2("rope", []string{"x", "pos", "invFreq"}, x, pos, invFreq)
	if err != nil {
		return err
	}
	if err := positive("rope", n, heads, headDim); err != nil {
		return err
	}
	if headDim%2 != 0 {
		return fmt.Errorf("rope: odd head dim %d", headDim)
	}
	half := headDim / 2
	if err := checkLens("rope", []string{"x", "pos", "invFreq"}, b, []int{n * heads * headDim, n, half}); err != nil {
		return err
	}
	return d.launch(d.k("rope_f32"), grid1(n*heads), grid1(min(1024, ceilDiv(half, 32)*32)), 0,
		bufArg("x", b[0], gpu.F32, n*heads*headDim), bufArg("pos", b[1], gpu.I32, n), bufArg("invFreq", b[2], gpu.F32, half),
		i32Arg(n), i32Arg(heads), i32Arg(headDim))
}

// StoreKV implements gpu.Ops. A slot outside the caches is skipped and
// reported by the next Sync or Read.
func (d *Device) StoreKV(kc, vc, k, v, slots gpu.Buffer, n, width int) error {
	if err := d.enter("storekv"); err != nil {
		return err
	}
	defer d.leave()
	names := []string{"kc", "vc", "k", "v", "slots"}
	b, err := d.bufs2("storekv", names, kc, vc, k, v, slots)
	if err != nil {
		return err
	}
	if err := positive("storekv", n, width); err != nil {
		return err
	}
	if err := checkLens("storekv", names[2:], b[2:], []int{n * width, n * width, n}); err != nil {
		return err
	}
	if b[0].dt != b[1].dt {
		return fmt.Errorf("storekv: kc is %s, vc is %s", b[0].dt, b[1].dt)
	}
	kern, err := d.typed("storekv", "kc", "storekv", b[0].dt)
	if err != nil {
		return err
	}
	capSlots := min(b[0].n, b[1].n) / width
	return d.launch(kern, grid1(n), grid1(min(256, blockFor(width))), 0,
		bufArg("kc", b[0], b[0].dt, capSlots*width), bufArg("vc", b[1], b[1].dt, capSlots*width),
		bufArg("k", b[2], gpu.F32, n*width), bufArg("v", b[3], gpu.F32, n*width), bufArg("slots", b[4], gpu.I32, n),
		i32Arg(n), i32Arg(width), i32Arg(capSlots), devPtrArg(d.faultDev))
}

// scratchBuf returns an internal buffer of at least n elements. A buffer
// that grows is retired, not freed, while the device lives: a recorded graph
// may still use it.
func (d *Device) scratchBuf(name string, dt gpu.DType, n int) (*Buffer, error) {
	if b := d.scratch[name]; b != nil && b.n >= n {
		return b, nil
	}
	b, err := d.alloc("scratch "+name, dt, max(n+n/2, 1024), false)
	if err != nil {
		return nil, err
	}
	if old := d.scratch[name]; old != nil {
		d.retired = append(d.retired, old)
	}
	d.scratch[name] = b
	return b, nil
}

// attnParams mirrors struct AttnParams in kernels/cuda/attention.cu.
func attnParams(a gpu.AttnArgs, cacheSlots, splits, btRows int) []byte {
	raw := make([]byte, 40)
	for i, v := range []int{a.N, a.Heads, a.KVHeads, a.HeadDim, a.BlockSize, a.MaxBlocks, cacheSlots, splits, btRows} {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(int32(v)))
	}
	binary.LittleEndian.PutUint32(raw[36:], math.Float32bits(a.Scale))
	return raw
}

// Attention implements gpu.Ops: split-KV attention over the paged caches
// and a combine of the splits (in the split kernel itself for 16-bit
// caches). The number of splits depends only on the
// shape, the share of each split on the token's position, so a graph
// recorded once serves any context length.
func (d *Device) Attention(out, q, kc, vc gpu.Buffer, a gpu.AttnArgs) error {
	return d.attention(out, q, kc, vc, a, -1)
}

// attention is Attention with g query heads a block of a decode step's
// CUDA-core kernel, 0 for the tensor-core kernel, or -1 for attnHeads'
// choice.
func (d *Device) attention(out, q, kc, vc gpu.Buffer, a gpu.AttnArgs, g int) error {
	if err := d.enter("attention"); err != nil {
		return err
	}
	defer d.leave()
	names := []string{"out", "q", "kc", "vc", "pos", "seq", "blockTable"}
	b, err := d.bufs2("attention", names, out, q, kc, vc, a.Pos, a.Seq, a.BlockTable)
	if err != nil {
		return err
	}
	if a.N <= 0 || a.Heads <= 0 || a.KVHeads <= 0 || a.Heads%a.KVHeads != 0 || a.BlockSize <= 0 || a.MaxBlocks <= 0 {
		return fmt.Errorf("attention: invalid shape %+v", a)
	}
	hd := a.HeadDim
	if hd != 64 && hd != 128 && hd != 256 {
		return fmt.Errorf("attention: head dim %d, supported 64, 128, 256", hd)
	}
	if b[2].dt != b[3].dt {
		return fmt.Errorf("attention: kc is %s, vc is %s", b[2].dt, b[3].dt)
	}
	qw, kw := a.Heads*hd, a.KVHeads*hd
	if err := checkLens("attention", names[:2], b[:2], []int{a.N * qw, a.N * qw}); err != nil {
		return err
	}
	if err := checkLens("attention", names[4:], b[4:], []int{a.N, a.N, a.MaxBlocks}); err != nil {
		return err
	}
	if !b[2].dt.IsFloat() {
		return fmt.Errorf("attention: kc is %s, want f32, bf16 or f16", b[2].dt)
	}
	slots := min(b[2].n, b[3].n) / kw
	btRows := b[6].n / a.MaxBlocks
	// inputs are the kernels' arguments after their outputs.
	inputs := func(splits int) []arg {
		return []arg{bufArg("q", b[1], gpu.F32, a.N*qw), bufArg("kc", b[2], b[2].dt, slots*kw), bufArg("vc", b[3], b[3].dt, slots*kw),
			bufArg("pos", b[4], gpu.I32, a.N), bufArg("seq", b[5], gpu.I32, a.N), bufArg("blockTable", b[6], gpu.I32, btRows*a.MaxBlocks),
			rawArg(attnParams(a, slots, splits, btRows)), devPtrArg(d.faultDev)}
	}
	if usePrefillAttention(a, b[2].dt) {
		// Two stages each of 64 keys and 64 values (kernels/cuda/attention.cu).
		return d.launch(d.k(fmt.Sprintf("attn_prefill_%s_hd%d", suffix(b[2].dt), hd)),
			dim3{uint32(ceilDiv(a.N, 64)), uint32(a.Heads), 1}, grid1(128), 4*64*hd*2,
			append([]arg{bufArg("out", b[0], gpu.F32, a.N*qw)}, inputs(1)...)...)
	}
	if g < 0 {
		g = attnHeads(a)
	}
	pl, err := planAttention(a, b[2].dt, d.info.SMs, g, d.room)
	if err != nil {
		return err
	}
	kern, parts := d.k(pl.kernel), a.N*a.Heads*pl.splits
	acc, err := d.scratchBuf("attn.acc", gpu.F32, parts*hd)
	if err != nil {
		return err
	}
	ml, err := d.scratchBuf("attn.ml", gpu.F32, parts*2)
	if err != nil {
		return err
	}
	args := append([]arg{bufArg("partAcc", acc, gpu.F32, parts*hd), bufArg("partML", ml, gpu.F32, parts*2)}, inputs(pl.splits)...)
	if pl.selfCombine {
		// The kernel combines the splits itself, with a counter per token
		// and block row, when there are enough counters; it then also
		// stores the o product's x (the rows rounded to the cache's type,
		// or their pairs) where that product would form it (d.rounded).
		if pl.blocks <= maxCounters {
			xq, pairs, err := d.nextX(b[2].dt, a.N, qw)
			if err != nil {
				return err
			}
			args = append(args, bufArg("out", b[0], gpu.F32, a.N*qw), bufArg("cnt", d.counters, gpu.I32, pl.blocks))
			if err := d.launch(kern, pl.grid, grid1(128), pl.shmem, append(args, nextXArgs(xq, pairs, a.N, qw)...)...); err != nil {
				return err
			}
			d.keepX(b[0], xq, pairs, a.N*qw)
			return nil
		}
		args = append(args, devPtrArg(0), devPtrArg(0), devPtrArg(0), i32Arg(0))
	}
	if err := d.launch(kern, pl.grid, grid1(128), pl.shmem, args...); err != nil {
		return err
	}
	return d.launch(d.k("attn_combine"), grid1(a.N*a.Heads), grid1(hd), 0,
		bufArg("out", b[0], gpu.F32, a.N*qw), bufArg("partAcc", acc, gpu.F32, parts*hd), bufArg("partML", ml, gpu.F32, parts*2),
		i32Arg(a.N*a.Heads), i32Arg(hd), i32Arg(pl.splits))
}

// decodeAttention is how Attention runs a step that does not take the
// prompt kernel.
type decodeAttention struct {
	kernel        string
	grid          dim3
	shmem, splits int
	blocks        int  // blocks of one split: tokens × grid rows
	selfCombine   bool // the kernel combines its splits (given counters)
}

// attnHeads is how many query heads a block of the CUDA-core kernel
// (attn_mha) takes, or 0 for the tensor-core kernel (attn_decode), for a
// 16-bit cache with head dim 64 or 128 (the others take attn_split and
// attn_combine, whatever it returns). MHA takes one head a block. A GQA
// step of one token is bound by the kernel's chain of latencies, not by
// the cache's bytes: it takes the CUDA-core kernel, one head a block (more
// blocks) at head dim 128, two at 64. Larger GQA steps take the tensor
// cores, the query heads of a KV head sharing a block. Measured on an H200
// (docs/cuda.md): one token over 512 keys of Qwen3-0.6B's shape in 5.1 µs
// where the tensor cores take 8.0; 2 to 16 tokens gained in some shapes
// and lost in others.
func attnHeads(a gpu.AttnArgs) int {
	group := a.Heads / a.KVHeads
	switch {
	case group == 1:
		return 1
	case a.N > 1:
		return 0
	case a.HeadDim == 64 && group%2 == 0:
		return 2
	}
	return 1
}

// mhaName is attn_mha's kernel for g query heads a block.
func mhaName(cache string, hd, g int) string {
	if g == 1 {
		return fmt.Sprintf("attn_mha_%s_hd%d", cache, hd)
	}
	return fmt.Sprintf("attn_mha%d_%s_hd%d", g, cache, hd)
}

// planAttention is the decode attention's plan with g query heads a block
// of attn_mha, or the tensor-core kernel for g = 0. Keys are split for
// about perSM blocks per SM on sms SMs, in tiles of tile keys. Measured
// best on an H200 (docs/cuda.md): the CUDA-core kernel's 4 (OLMo-2-1B
// shapes: against 8, 64 sequences of 512 tokens take one split instead of
// two, 3.16 to 3.00 ms a step, and one sequence of 3,000 half as many); the
// tensor-core kernel's 2, whose blocks hold 32 or 64 KiB of shared memory
// (against 4, GQA batches of 4 to 64 sequences 1-4% faster a step), and
// one split wherever its blocks fill half the SMs' room for them (room,
// the blocks of a kernel an SM holds, from the driver), since combining
// splits then costs more than the room a second split would fill: 64
// sequences of Qwen3-30B-A3B's 4 KV heads over 512 keys take 26 µs in one
// split, 34 in two (on an H200 an SM holds 3 blocks at head dim 128, 5 at
// 64).
func planAttention(a gpu.AttnArgs, cache gpu.DType, sms, g int, room func(kernel string) int) (decodeAttention, error) {
	hd, suf := a.HeadDim, suffix(cache)
	p := decodeAttention{kernel: fmt.Sprintf("attn_split_%s_hd%d", suf, hd)}
	rows, tile, perSM := 8, 32, 2
	switch {
	case cache == gpu.F32 || hd > 128: // attn_split and attn_combine
	case g > 0:
		if g > 2 || (a.Heads/a.KVHeads)%g != 0 {
			return p, fmt.Errorf("attention: %d query heads a block, %d a KV head", g, a.Heads/a.KVHeads)
		}
		p.kernel, rows, tile, perSM, p.selfCombine = mhaName(suf, hd, g), g, 64, 4, true
	default:
		p.kernel, rows, tile, perSM, p.selfCombine = fmt.Sprintf("attn_decode_%s_hd%d", suf, hd), 16, 64, 2, true
		p.shmem = decodeShmem(hd)
	}
	ngroup := ceilDiv(a.Heads/a.KVHeads, rows)
	if a.N > 65535 || a.KVHeads*ngroup > 65535 {
		return p, fmt.Errorf("attention: %d tokens, %d kv heads: grid too large", a.N, a.KVHeads)
	}
	p.blocks = a.N * a.KVHeads * ngroup
	fill := ceilDiv(perSM*sms, p.blocks)
	if r := room(p.kernel); g == 0 && p.selfCombine && r > 0 && 2*p.blocks >= r*sms {
		fill = 1
	}
	p.splits = max(1, min(fill, ceilDiv(a.MaxBlocks*a.BlockSize, tile), 256))
	p.grid = dim3{uint32(p.splits), uint32(a.KVHeads * ngroup), uint32(a.N)}
	return p, nil
}

// decodeShmem is attn_decode's dynamic shared memory at head dim hd: two
// stages of a tile of 64 keys and values.
func decodeShmem(hd int) int { return 4 * 64 * hd * 2 }

// usePrefillAttention: the tensor-core kernel for steps of more than 64
// tokens that come in runs of at least 16 (prompts), with a 16-bit cache
// and head dim 64 or 128. It is right for any batch, but makes one pass
// per sequence in each block of 64 tokens, so decode batches keep the
// split kernel.
func usePrefillAttention(a gpu.AttnArgs, cache gpu.DType) bool {
	return a.Runs > 0 && a.N > 64 && a.N >= 16*a.Runs && cache != gpu.F32 && (a.HeadDim == 64 || a.HeadDim == 128)
}

// maxExperts is MAX_EXPERTS in kernels/cuda/moe.cu: the expert pointer
// tables travel as kernel parameters.
const maxExperts = 128

// moePath is the way a MoE call's experts run.
type moePath int

const (
	// moeFew: each token's experts read for it alone (moe_gateup1,
	// moe_down1), chosen and summed in the products' blocks, with no
	// routing or combining kernel.
	moeFew moePath = iota
	// moeTiles: the slots grouped by expert (moe_route) into tiles of up
	// to four on the CUDA cores (moe_gateup, moe_down), then moe_combine.
	moeTiles
	// moeTensorCores: tiles of up to 64 slots on the tensor cores (moe_mm).
	moeTensorCores
)

// moeWay chooses a MoE call's path. One H200, Qwen3-30B-A3B's experts (8
// of 128 a token), ms a step (docs/cuda.md): each token's own experts
// against the tiles grouped by expert, 2 tokens 1.16 against 1.35–1.36, 4
// 1.72–1.74 against 1.97–1.98, 6 2.34 against 2.48–2.50, 8 level; the
// tiles on the CUDA cores against the tensor cores, 8 tokens 2.84–2.88
// against 3.55–3.56, 24 5.65–5.74 against 5.89–5.93, level at 32, slower
// from 48. So the tokens go alone while their slots are at most half the
// experts (an expert two tokens share is read twice; a lone token's are
// distinct), and the tensor cores (16-bit weights, widths of whole 16-byte
// pieces) take the calls where an expert averages more than two slots.
func moeWay(a gpu.MoEArgs, dt gpu.DType) moePath {
	switch {
	case a.N == 1 || 2*a.N*a.TopK <= a.Experts:
		return moeFew
	case a.N*a.TopK > 2*a.Experts && (dt == gpu.BF16 || dt == gpu.F16) && a.Dim%8 == 0 && a.Inter%8 == 0:
		return moeTensorCores
	}
	return moeTiles
}

// MoE implements gpu.Ops: routing on the device (the router's logits
// from x in f32, then softmax and top-k), the chosen (token, expert) slots
// grouped by expert into tiles (moe_route), a gate/up product with SwiGLU
// and a down product a tile, so that an expert's rows are read once for
// a tile of its tokens (up to 64 on the tensor cores), and the weighted
// sum over each token's experts (moe_combine). A few tokens' experts are
// chosen by the gate/up product's blocks and summed by the down product's
// (moe_gateup1, moe_down1): three kernels with the router's product.
func (d *Device) MoE(out, x gpu.Buffer, a gpu.MoEArgs) error {
	if err := d.enter("moe"); err != nil {
		return err
	}
	defer d.leave()
	if len(a.Gate) != a.Experts || len(a.Up) != a.Experts || len(a.Down) != a.Experts || a.TopK < 1 || a.TopK > a.Experts {
		return fmt.Errorf("moe: %d experts with %d/%d/%d weights, top %d", a.Experts, len(a.Gate), len(a.Up), len(a.Down), a.TopK)
	}
	if a.Experts > maxExperts {
		return fmt.Errorf("moe: %d experts, at most %d", a.Experts, maxExperts)
	}
	if err := positive("moe", a.N, a.Dim, a.Inter); err != nil {
		return err
	}
	b, err := d.bufs2("moe", []string{"out", "x", "router"}, out, x, a.Router)
	if err != nil {
		return err
	}
	if err := checkLens("moe", []string{"out", "x", "router"}, b, []int{a.N * a.Dim, a.N * a.Dim, a.Experts * a.Dim}); err != nil {
		return err
	}
	dt := b[2].dt
	var gate, up, down []*Buffer
	for e := 0; e < a.Experts; e++ {
		w, err := d.bufs2("moe", []string{fmt.Sprintf("gate[%d]", e), fmt.Sprintf("up[%d]", e), fmt.Sprintf("down[%d]", e)}, a.Gate[e], a.Up[e], a.Down[e])
		if err != nil {
			return err
		}
		for i, nm := range []string{"gate", "up", "down"} {
			if w[i].dt != dt {
				return fmt.Errorf("moe: %s[%d] is %s, router is %s", nm, e, w[i].dt, dt)
			}
			if err := gpu.CheckLen("moe", fmt.Sprintf("%s[%d]", nm, e), w[i], a.Inter*a.Dim); err != nil {
				return err
			}
		}
		gate, up, down = append(gate, w[0]), append(up, w[1]), append(down, w[2])
	}
	// Tiles of slots of one expert: of up to 64 on the tensor cores
	// (moe_mm_*), of up to four on the CUDA cores (moe_gateup_*,
	// moe_down_*). At most a full tile a tile's worth of slots and one
	// part-filled tile an expert.
	way, slots, tile := moeWay(a, dt), a.N*a.TopK, 4
	tc := way == moeTensorCores
	if tc {
		tile = 64
	}
	bound := min(slots, slots/tile+min(a.Experts, slots))
	if a.N > 65535 || bound > 65535 {
		return fmt.Errorf("moe: %d tokens: grid too large", a.N)
	}
	suf := suffix(dt)
	scratch := func(name string, dt gpu.DType, n int) (arg, error) {
		buf, err := d.scratchBuf("moe."+name, dt, n)
		return bufArg(name, buf, dt, n), err
	}
	hdt, hn := gpu.F32, slots*a.Inter // the SwiGLU rows: f32, or rounded for the tensor cores
	if tc {
		hdt = dt
	}
	var logits, ids, wts, h, order, tiles, ntiles, y arg
	for _, s := range []struct {
		to    *arg
		name  string
		dt    gpu.DType
		n     int
		tiled bool // used by the tiles only
	}{{&logits, "logits", gpu.F32, a.N * a.Experts, false}, {&ids, "ids", gpu.I32, slots, false},
		{&wts, "wts", gpu.F32, slots, false}, {&h, "h." + hdt.String(), hdt, hn, false}, {&order, "order", gpu.I32, slots, true},
		{&tiles, "tiles", gpu.I32, 4 * bound, true}, {&ntiles, "ntiles", gpu.I32, 1, true}, {&y, "y", gpu.F32, slots * a.Dim, true}} {
		if s.tiled && way == moeFew {
			continue
		}
		if *s.to, err = scratch(s.name, s.dt, s.n); err != nil {
			return err
		}
	}
	norm := 0
	if a.NormTopK {
		norm = 1
	}
	// The router's logits from x in f32, so that the experts chosen are the
	// CPU lane's: by the GEMVs and the exact skinny product, which keep x
	// in f32, or by moe_logits.
	if a.N <= 8 || exactSkinny(a.N, a.Dim) {
		if err := d.matmul(logits.buf, b[1], b[2], a.N, a.Dim, a.Experts); err != nil {
			return fmt.Errorf("moe: router: %w", err)
		}
	} else if err := d.launch(d.k("moe_logits_"+suf), dim3{uint32(ceilDiv(a.Experts, 8)), uint32(a.N), 1}, grid1(256), 0,
		logits, bufArg("x", b[1], gpu.F32, a.N*a.Dim), bufArg("router", b[2], dt, a.Experts*a.Dim),
		i32Arg(a.N), i32Arg(a.Dim), i32Arg(a.Experts)); err != nil {
		return err
	}
	xa := bufArg("x", b[1], gpu.F32, a.N*a.Dim)
	gt, ut, dn := tableArg("gate", gate, dt, a.Inter*a.Dim, maxExperts), tableArg("up", up, dt, a.Inter*a.Dim, maxExperts),
		tableArg("down", down, dt, a.Dim*a.Inter, maxExperts)
	if way == moeFew {
		// 256 threads: eight warps of two gate|up rows, or of a down row.
		if err := d.launch(d.k("moe_gateup1_"+suf), dim3{uint32(ceilDiv(a.Inter, 16)), uint32(slots), 1}, grid1(256), 0,
			h, xa, logits, ids, wts, gt, ut, i32Arg(a.Experts), i32Arg(a.TopK), i32Arg(norm), i32Arg(a.Dim), i32Arg(a.Inter),
			devPtrArg(d.faultDev)); err != nil {
			return err
		}
		return d.launch(d.k("moe_down1_"+suf), dim3{uint32(ceilDiv(a.Dim, 8)), uint32(a.N), 1}, grid1(256), 0,
			bufArg("out", b[0], gpu.F32, a.N*a.Dim), h, ids, wts, dn, i32Arg(a.Experts), i32Arg(a.TopK), i32Arg(a.Dim), i32Arg(a.Inter))
	}
	// moe_route chooses a few tokens' experts itself; a prompt's, a warp a
	// token over many blocks (moe_topk).
	chosen := 0
	if a.N > 64 {
		chosen = 1
		if err := d.launch(d.k("moe_topk"), grid1(ceilDiv(a.N, 8)), grid1(256), 0, ids, wts, logits,
			i32Arg(a.N), i32Arg(a.Experts), i32Arg(a.TopK), i32Arg(norm)); err != nil {
			return err
		}
	}
	if err := d.launch(d.k("moe_route"), grid1(1), grid1(1024), 0, ids, wts, logits, i32Arg(a.N), i32Arg(a.Experts),
		i32Arg(a.TopK), i32Arg(norm), i32Arg(chosen), i32Arg(tile), order, tiles, ntiles, devPtrArg(d.faultDev)); err != nil {
		return err
	}
	if tc {
		// x rounded; gate|up a product of 2·inter columns; silu(gate)·up
		// rounded; down.
		x16, err := scratch("x16."+dt.String(), dt, a.N*a.Dim)
		if err != nil {
			return err
		}
		gu, err := scratch("gu", gpu.F32, slots*2*a.Inter)
		if err != nil {
			return err
		}
		const mmShmem = 4 * (64 + 64) * 32 * 2 // stages of 64 rows of each side, 32 of k
		if err := d.roundX(x16.buf, b[1], a.N*a.Dim, false); err != nil {
			return err
		}
		mm := d.k("moe_mm_" + suf)
		if err := d.launch(mm, dim3{uint32(ceilDiv(2*a.Inter, 64)), uint32(bound), 1}, grid1(128), mmShmem,
			gu, x16, order, tiles, ntiles, gt, ut, i32Arg(a.Inter), i32Arg(a.TopK), i32Arg(a.Dim), i32Arg(2*a.Inter)); err != nil {
			return err
		}
		if err := d.siluRows(h.buf, gu.buf, slots, a.Inter, false); err != nil {
			return err
		}
		if err := d.launch(mm, dim3{uint32(ceilDiv(a.Dim, 64)), uint32(bound), 1}, grid1(128), mmShmem,
			y, h, order, tiles, ntiles, dn, dn, i32Arg(a.Dim), i32Arg(1), i32Arg(a.Inter), i32Arg(a.Dim)); err != nil {
			return err
		}
	} else {
		// 256 threads: eight warps of two gate|up rows, or of four down rows.
		if err := d.launch(d.k("moe_gateup_"+suf), dim3{uint32(ceilDiv(a.Inter, 16)), uint32(bound), 1}, grid1(256), tile*a.Dim*4,
			h, xa, order, tiles, ntiles, gt, ut, i32Arg(a.TopK), i32Arg(a.Dim), i32Arg(a.Inter)); err != nil {
			return err
		}
		if err := d.launch(d.k("moe_down_"+suf), dim3{uint32(ceilDiv(a.Dim, 32)), uint32(bound), 1}, grid1(256), tile*a.Inter*4,
			y, h, order, tiles, ntiles, dn, i32Arg(a.Dim), i32Arg(a.Inter)); err != nil {
			return err
		}
	}
	return d.launch(d.k("moe_combine"), dim3{uint32(ceilDiv(a.Dim, 256)), uint32(a.N), 1}, grid1(256), 0,
		bufArg("out", b[0], gpu.F32, a.N*a.Dim), y, ids, wts, i32Arg(a.N), i32Arg(a.TopK), i32Arg(a.Dim), i32Arg(a.Experts))
}

// Argmax implements gpu.Argmaxer: ties go to the lowest index, NaNs are
// skipped.
func (d *Device) Argmax(out, logits gpu.Buffer, n, width int) error {
	if err := d.enter("argmax"); err != nil {
		return err
	}
	defer d.leave()
	b, err := d.bufs2("argmax", []string{"out", "logits"}, out, logits)
	if err != nil {
		return err
	}
	if err := positive("argmax", n, width); err != nil {
		return err
	}
	if err := checkLens("argmax", []string{"out", "logits"}, b, []int{n, n * width}); err != nil {
		return err
	}
	if err := wantDT("argmax", "out", b[0], gpu.I32); err != nil {
		return err
	}
	if err := wantDT("argmax", "logits", b[1], gpu.F32); err != nil {
		return err
	}
	if n > maxCounters {
		return fmt.Errorf("argmax: %d rows, at most %d", n, maxCounters)
	}
	// Blocks of about 2048 values share a row; the last to finish reduces.
	parts := max(1, min(ceilDiv(width, 2048), 128))
	pv, err := d.scratchBuf("argmax.v", gpu.F32, n*parts)
	if err != nil {
		return fmt.Errorf("argmax: %w", err)
	}
	pi, err := d.scratchBuf("argmax.i", gpu.I32, n*parts)
	if err != nil {
		return fmt.Errorf("argmax: %w", err)
	}
	return d.launch(d.k("argmax_f32"), dim3{uint32(parts), uint32(n), 1}, grid1(256), 0,
		bufArg("out", b[0], gpu.I32, n), bufArg("logits", b[1], gpu.F32, n*width), i32Arg(n), i32Arg(width),
		bufArg("pv", pv, gpu.F32, n*parts), bufArg("pi", pi, gpu.I32, n*parts), bufArg("cnt", d.counters, gpu.I32, n))
}
