package cuda

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/troupe/troupe/gpu"
)

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
