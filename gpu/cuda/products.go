package cuda

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"unsafe"

	"github.com/troupe/troupe/gpu"
)

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
	if err := checkProduct("matmul", []string{"out", "x", "w"}, b, []int{n * m, n * k, m * k}, 2); err != nil {
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

// overwrite forgets the rounded x on record when out, which a product is
// about to write, overlaps the rows it was formed from.
func (d *Device) overwrite(out *Buffer) {
	if r := d.rounded.x; r != nil && out.ptr < r.ptr+uint64(r.size) && r.ptr < out.ptr+uint64(out.size) {
		d.rounded = roundedX{}
	}
}

func (d *Device) matmul(out, x, w *Buffer, n, k, m int) error {
	d.overwrite(out)
	args := []arg{bufArg("out", out, gpu.F32, n*m), bufArg("x", x, gpu.F32, n*k), bufArg("w", w, w.dt, m*k)}
	if w.dt == gpu.BF16 {
		var kern *kernel
		var grid dim3
		var wa arg
		var tail []arg
		if n == 1 {
			kern, grid, wa, tail = d.codedGEMV("bf16", w, k, m)
		}
		if kern != nil {
			args[2] = wa
		} else {
			kern, grid = d.fastGEMV(false, n, k, m)
		}
		if kern != nil {
			if n > 1 {
				args = append(args, i32Arg(n))
			}
			return d.launch(kern, grid, grid1(256), 0, append(append(args, i32Arg(k), i32Arg(m)), tail...)...)
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
	maps, err := d.tensorMaps(xs, n, 128, w, m, 256, k)
	if err != nil {
		return true, err
	}
	tiles := ceilDiv(n, 128) * ceilDiv(m, 256)
	return true, d.launch(kern, grid1(min(tiles, d.info.SMs)), grid1(384), wgSharedMemory,
		append([]arg{bufArg("out", out, gpu.F32, n*m), bufArg("x", xs, gpu.BF16, n*k), bufArg("w", w, gpu.BF16, m*k),
			i32Arg(n), i32Arg(k), i32Arg(m)}, maps...)...)
}

// tensorMaps are the kernel arguments of a TMA product's descriptors
// (tensorMap): x's rows × k in boxes of xBox rows, then w's m × k in
// boxes of wBox rows.
func (d *Device) tensorMaps(xs *Buffer, rows, xBox int, w *Buffer, m, wBox, k int) ([]arg, error) {
	tmx, err := d.tensorMap(xs, rows, k, xBox)
	if err != nil {
		return nil, fmt.Errorf("matmul: %w", err)
	}
	tmw, err := d.tensorMap(w, m, k, wBox)
	if err != nil {
		return nil, fmt.Errorf("matmul: %w", err)
	}
	return []arg{rawArg(tmx), rawArg(tmw)}, nil
}

// wgSharedMemory is GEMM_WG_SMEM in kernels/cuda/gemm_wg.cu: 4 stages of
// (128+256) x 64 bf16, 1 KiB for alignment and the stages' barriers.
const wgSharedMemory = 4*(128+256)*64*2 + 1024 + 4*16

// tensorMap encodes a TMA descriptor (CUtensorMap) for b as a row-major
// [rows, k] bf16 matrix: boxes of 64 along k by boxRows rows, 128-byte
// swizzle, zeros beyond the edges. The 128 bytes are passed to the kernel
// by value; the buffer keeps the last maxTensorMaps encoded.
func (d *Device) tensorMap(b *Buffer, rows, k, boxRows int) ([]byte, error) {
	for _, c := range b.tmaps {
		if c.rows == rows && c.k == k && c.box == boxRows {
			return c.raw, nil
		}
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
	b.tmaps = append([]tensorMapKey{{rows, k, boxRows, tm}}, b.tmaps[:min(len(b.tmaps), maxTensorMaps-1)]...)
	return tm, nil
}

// maxTensorMaps is how many descriptors a buffer keeps (tensorMap): a
// decode batch's x is boxed for each size of batch and k of its products,
// a weight for prompts and for decode batches.
const maxTensorMaps = 4

// skinnySplits cuts k (a multiple of 64) for a decode-batch product whose
// blocks take rt tiles of skinnyCols rows of w into parts of at least 128
// for about perSM blocks per SM; chunk is a multiple of 64.
func skinnySplits(m, k, sms, perSM, rt int) (splits, chunk int) {
	tiles := ceilDiv(m, rt*skinnyCols)
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

// nextX is the scratch where a kernel also stores the x of the product
// with weights of type dt that reads its n rows of k next, as that product
// would form it: rounded (roundsX) or as pairs of rows (paired). It is nil
// where the product takes x as it is.
func (d *Device) nextX(dt gpu.DType, n, k int) (xq *Buffer, pairs bool, err error) {
	pairs = paired(n, k)
	if dt == gpu.F32 || !(roundsX(n, k) || pairs) {
		return nil, false, nil
	}
	xq, err = d.productX(dt, n, k, pairs)
	return xq, pairs, err
}

// productX is the scratch for a 16-bit product's x of n rows of k, of
// type dt (twice the rows as pairs): the product forms it there, and the
// kernels ahead that store it for the product (nextX) write the same
// buffer.
func (d *Device) productX(dt gpu.DType, n, k int, pairs bool) (*Buffer, error) {
	return d.scratchBuf("gemm.x."+suffix(dt), dt, xRows(n, pairs)*k)
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
	xs, err := d.productX(w.dt, n, k, false)
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
	xs, err := d.productX(w.dt, n, k, true)
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
	return d.skinnyRounded(suf, out, xs, w, n, k, m, 2)
}

// skinnyRounded runs a decode-batch product of halves × n rows of 16-bit
// x (xs) where the device runs the Hopper cubin: up to streamRows rows on
// gemm_stream (four token tiles), up to twice that on gemm_stream8 or
// gemm_stream8n (eight; streamKernel),
// the weights streamed by the TMA unit; the rest on gemm_skinny. k is split
// for about as many blocks an SM as gemm_skinny holds, and for one block an
// SM on the gemm_stream kernels, even where two of gemm_stream's fit: half
// the splits measured faster on an H200 (docs/cuda.md, "Decode-batch
// products at one tile a block"), OLMo-2-1B at 512 tokens, 16 sequences
// 1.4365-1.4375 -> 1.4008-1.4030 ms a step, 12 1.3629-1.3636 ->
// 1.3376-1.3387, 9 1.2602-1.2615 -> 1.2470-1.2482; a third as many
// (three blocks an SM's worth) slower, 16 sequences 1.5586-1.5615.
func (d *Device) skinnyRounded(suf string, out, xs, w *Buffer, n, k, m, halves int) error {
	rows := halves * n
	name, box, sh := streamKernel(suf, rows, m, d.info.SMs)
	if kern := d.k(name); name != "" && kern != nil && d.info.Code == codeCubin && w.ptr%16 == 0 && xs.ptr%16 == 0 {
		maps, err := d.tensorMaps(xs, rows, box, w, m, 32, k)
		if err != nil {
			return err
		}
		return d.skinnyLaunch(kern, 1, sh.rt, sh.shmem(), out, xs, w, n, k, m, halves, maps...)
	}
	return d.skinnyLaunch(d.k(skinnyName(suf, false)), skinnyPerSM(false), 1, 0, out, xs, w, n, k, m, halves)
}

// streamShape is a gemm_stream kernel's block: rt tiles of skinnyCols rows
// of w sharing each stage of x (four warps a tile), a ring of st slots
// of 64 k a warp, and stages of x of xm·16 KiB (STREAM and GS_SMEM_FOR in
// kernels/cuda/gemm_wg.cu).
type streamShape struct{ rt, st, xm int }

func (s streamShape) threads() int { return 128 * s.rt }

// shmem is the block's dynamic shared memory: the rings, two stages of x,
// 1 KiB more for the swizzle's alignment, and the barriers.
func (s streamShape) shmem() int {
	return 4*s.rt*s.st*4096 + 2*s.xm*streamXK/64*4096 + 1024 + 8*(4*s.rt*s.st+2)
}

// streamShapes are the gemm_stream kernels' blocks by entry point prefix.
// gemm_stream8's two tiles of w a block read each stage of x once for both
// and leave one block an SM; measured on an H200 (docs/cuda.md, "Two tiles
// of weights a stage of x"), OLMo-2-1B at 512 tokens, against one tile and
// four slots: 64 sequences 2.467 -> 2.410 ms a step, 32 2.002 -> 1.909, and
// 24 (48 rows, on gemm_skinny before) 1.797 -> 1.734. Four slots or three
// tiles were slower, and so was gemm_stream with two tiles at 12 sequences.
// Its stages of x of 128 k rather than 64 (a barrier a 128 k) took 64
// sequences 2.390-2.391 -> 2.385-2.388 ms a step, 32 1.902 -> 1.890-1.894,
// 24 1.728 -> 1.719-1.721 (docs/cuda.md, "Stages of x of 128 k").
//
// gemm_stream8n is gemm_stream8 at one tile of w a block and four slots:
// where two tiles a block leave fewer tiles than SMs, so that k is split
// for the rest, tiles of one take the SMs with half the splits (half the
// partial products to store and sum; each stage of x read by twice the
// blocks). Measured on an H200 (docs/cuda.md, "Decode-batch products at one
// tile a block"), OLMo-2-1B at 512 tokens, every product but the LM head:
// 64 sequences 2.2403-2.2414 -> 2.2050-2.2051 ms a step, 48 1.9455-1.9462
// -> 1.9345-1.9366, 32 1.7641-1.7664 -> 1.6978-1.6979, 24 1.6171-1.6178
// -> 1.5646-1.5662; the LM head too was slower (64: 2.2066-2.2087), and
// so were three slots or two blocks an SM.
var streamShapes = map[string]streamShape{
	"gemm_stream_":   {1, 4, 1},
	"gemm_stream8_":  {2, 3, 2},
	"gemm_stream8n_": {1, 4, 2},
	"gemm_stream8g_": {1, 4, 2}, // gemm_stream8n's block for a gated MLP (GatedMLP)
}

// streamKernelNames are the gemm_stream kernels' entry points: each block
// of streamShapes in bf16 and f16.
func streamKernelNames() []string {
	var names []string
	for _, prefix := range slices.Sorted(maps.Keys(streamShapes)) {
		names = append(names, prefix+"bf16", prefix+"f16")
	}
	return names
}

// streamKernel is the gemm_stream kernel for rows of x rounded to suf and
// m rows of w on sms SMs, the rows its boxes of x span and its block; ""
// where gemm_skinny takes them.
func streamKernel(suf string, rows, m, sms int) (name string, box int, sh streamShape) {
	switch {
	case rows <= streamRows:
		return "gemm_stream_" + suf, streamRows, streamShapes["gemm_stream_"]
	case rows <= 2*streamRows && ceilDiv(m, streamShapes["gemm_stream8_"].rt*skinnyCols) < sms:
		return "gemm_stream8n_" + suf, 2 * streamRows, streamShapes["gemm_stream8n_"]
	case rows <= 2*streamRows:
		return "gemm_stream8_" + suf, 2 * streamRows, streamShapes["gemm_stream8_"]
	}
	return "", 0, streamShape{}
}

// skinnyLaunch runs a decode-batch product kernel (blocks of rt·128
// threads, rt·skinnyCols rows of w) with k split for about perSM blocks
// per SM.
func (d *Device) skinnyLaunch(kern *kernel, perSM, rt, shmem int, out, x, w *Buffer, n, k, m, halves int, more ...arg) error {
	splits, chunk := skinnySplits(m, k, d.info.SMs, perSM, rt)
	grid := dim3{uint32(ceilDiv(m, rt*skinnyCols)), uint32(splits), 1}
	return d.splitProduct(kern, grid, 128*rt, shmem, out, x, w, n, k, m, splits, chunk, halves, more...)
}

// streamRows is the most rows of x gemm_stream takes (four token tiles):
// pairs of 9 to 16 rows (skinnyPairs). Measured on an H200 (docs/cuda.md,
// OLMo-2-1B at 512 tokens): 12 sequences 1.67-1.69 -> 1.62-1.63 ms a step,
// 16 1.73-1.78 -> 1.69-1.73.
const streamRows = 32

// streamXK is GS_XK in kernels/cuda/gemm_wg.cu: the k of x in a stage of
// 16 KiB of four token tiles (a kernel's stage is xm·16 KiB, of
// streamXK·4·xm/tiles k).
const streamXK = 256

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
// memory (rows of SK_XK = 256 f32), k split for about skinnyPerSM blocks
// per SM, or x rounded to suf (skinnyRounded).
func (d *Device) skinny(suf string, out, x, w *Buffer, n, k, m int) error {
	if x.dt != gpu.F32 {
		return d.skinnyRounded(suf, out, x, w, n, k, m, 1)
	}
	if n > skinnyExactTile {
		return fmt.Errorf("matmul: %d rows of f32 x on the exact kernel, at most %d", n, skinnyExactTile)
	}
	return d.skinnyLaunch(d.k(skinnyName(suf, true)), skinnyPerSM(true), 1, skinnyExactTile*256*4, out, x, w, n, k, m, 1)
}

// splitProduct launches a product kernel taking (out, x, w, rows, k, m,
// chunk) whose splits of k write partial products, then sums them in
// split order into out. x holds halves × n rows: with 2 (skinnyPairs),
// rows n.. are the remainders of rows 0.., and each split's two halves of
// the product are summed in turn.
func (d *Device) splitProduct(kern *kernel, grid dim3, threads, shmem int, out, x, w *Buffer, n, k, m, splits, chunk, halves int, more ...arg) error {
	rows, parts := halves*n, halves*splits
	dst := out
	if parts > 1 {
		var err error
		if dst, err = d.scratchBuf("gemm.part", gpu.F32, splits*rows*m); err != nil {
			return err
		}
	}
	args := append([]arg{bufArg("out", dst, gpu.F32, splits*rows*m), bufArg("x", x, x.dt, rows*k), bufArg("w", w, w.dt, m*k),
		i32Arg(rows), i32Arg(k), i32Arg(m), i32Arg(chunk)}, more...)
	err := d.launch(kern, grid, grid1(threads), shmem, args...)
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
	kind := "glu_bf16"
	if !glu {
		nv, _, _ := d.gemvShape(k, m)
		var ok bool
		if kind, ok = gemvKind(n, nv); !ok {
			return nil, dim3{}
		}
	}
	return d.gemvKernel(kind, k, m)
}

// gemvKernel is the fast GEMV gemv_KIND_nv*_ks* for k and m, with its
// grid; nil when none takes them.
func (d *Device) gemvKernel(kind string, k, m int) (*kernel, dim3) {
	nv, ks, ok := d.gemvShape(k, m)
	if !ok {
		return nil, dim3{}
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
	return min(gemvGroups(ks, m), perSM*d.info.SMs)
}

// gemvGroups is how many groups the fast GEMV cuts m rows into with ks
// warps a row: 8/ks row groups of 2 rows a block step.
func gemvGroups(ks, m int) int { return ceilDiv(m, 8/ks*2) }
