package cuda

import (
	"fmt"

	"github.com/troupe/troupe/gpu"
)

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
