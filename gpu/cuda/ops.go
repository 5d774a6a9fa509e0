package cuda

import (
	"fmt"

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
	names := []string{"add_f32", "copy_words", "silumul_f32", "rope_f32", "argmax_f32", "reduce_sum_f32", "attn_combine",
		"allgather_u8", "broadcast_u8", "sumsq2_allreduce_f32", "splitk_sum", "moe_topk", "moe_route", "moe_combine", "sample_rows", "summary_rows", "adjust_follow", "adjust_compact", "adjust_append", "adjust_apply", "adjust_restore"}
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
	names := append([]string{"gemm_wg_bf16", "sumsq2_f32", "rmsnorm_shard_f32", "rmsnorm_shard_bf16", "rmsnorm_shard_f16"}, streamKernelNames()...)
	names = append(names, codedKernelNames()...)
	return append(names, fusedKernelNames()...)
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
	return d.argmax(b[0], b[1], n, width)
}

// argmaxParts is the scratch where n blocks of an argmax leave their best
// values and indexes for the last to finish (grid_best).
func (d *Device) argmaxParts(n int) (pv, pi *Buffer, err error) {
	if pv, err = d.scratchBuf("argmax.v", gpu.F32, n); err != nil {
		return nil, nil, err
	}
	pi, err = d.scratchBuf("argmax.i", gpu.I32, n)
	return pv, pi, err
}

// argmax is Argmax inside an operation.
func (d *Device) argmax(out, logits *Buffer, n, width int) error {
	b := []*Buffer{out, logits}
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
	pv, pi, err := d.argmaxParts(n * parts)
	if err != nil {
		return fmt.Errorf("argmax: %w", err)
	}
	return d.launch(d.k("argmax_f32"), dim3{uint32(parts), uint32(n), 1}, grid1(256), 0,
		bufArg("out", b[0], gpu.I32, n), bufArg("logits", b[1], gpu.F32, n*width), i32Arg(n), i32Arg(width),
		bufArg("pv", pv, gpu.F32, n*parts), bufArg("pi", pi, gpu.I32, n*parts), bufArg("cnt", d.counters, gpu.I32, n))
}
