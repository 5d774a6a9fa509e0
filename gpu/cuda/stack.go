package cuda

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/troupe/troupe/gpu"
)

var _ gpu.Stacker = (*Device)(nil)

// Constants of kernels/cuda/stack.cu.
const (
	stackThreads  = 256 + 32 // eight consumer warps and a producer warp
	stackSlot     = 16384    // bytes of a ring slot
	stackMaxRing  = 16
	stackMaxSplit = 32
	// stackSharedMax is the dynamic shared memory an sm_90 block may use
	// (227 KiB), less what the kernel holds statically.
	stackSharedMax = 227<<10 - 512
)

// stackProfOff is where in the work buffer (in floats) the kernel built
// with SK_PROFILE stores its timestamps, stackProfLen how many.
func stackProfOff(s gpu.StackSpec) int {
	qw, kw := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	return qw + 2*kw + qw + s.Hidden + s.Intermediate + s.Hidden + s.Heads*stackMaxSplit*(s.HeadDim+2) + 2
}

func stackProfLen(layers int) int { return 14*layers + 2 }

func stackKernelNames() []string { return []string{"stack_step_hd64", "stack_step_hd128"} }

// layerStack is a Device's gpu.LayerStack.
type layerStack struct {
	d      *Device
	spec   gpu.StackSpec
	layers [][]*Buffer // each layer's buffers, in stackLayer's order
	inv    *Buffer
	table  *Buffer // the layers' device addresses (struct StackLayer each)
	work   *Buffer // the step's activations and attention partials
	sync   *Buffer // the grid barriers' counter and the heads'
	ring   int     // ring slots
	xs     int     // bytes of the staged vector (and attention scratch)
	slots  int     // cache slots
}

// stackPlan sizes the kernel's shared memory for s: the staged vector
// (the widest product input, in units of 256) or the attention's scratch,
// whichever is larger, and as many ring slots as the rest holds.
func stackPlan(s gpu.StackSpec) (ring, xsBytes int) {
	qw := s.Heads * s.HeadDim
	round := func(n int) int { return (n + 255) / 256 * 256 }
	rp := 256 / (s.HeadDim / 8)
	floats := max(round(max(s.Hidden, qw, s.Intermediate)), s.HeadDim*(3+rp)+2*rp+stackMaxSplit)
	xsBytes = 4 * floats
	return min(stackMaxRing, (stackSharedMax-xsBytes)/stackSlot), xsBytes
}

// Stack implements gpu.Stacker with stack_step (kernels/cuda/stack.cu): on
// an sm_90 GPU (bulk copies into shared memory), bf16 weights and caches,
// head dims of 64 or 128, and rows that fit a ring slot (a gate and an up
// row of Hidden, a down row of Intermediate: OLMo-2-1B's shapes, not 7B's).
func (d *Device) Stack(s gpu.StackSpec, layers []gpu.StackLayer) (gpu.LayerStack, error) {
	const op = "stack layers"
	if err := d.enter(op); err != nil {
		return nil, err
	}
	defer d.leave()
	if err := positive(op, len(layers), s.Hidden, s.Heads, s.KVHeads, s.HeadDim, s.Intermediate, s.BlockSize, s.MaxBlocks); err != nil {
		return nil, err
	}
	kern := d.k(fmt.Sprintf("stack_step_hd%d", s.HeadDim))
	H, F, qw, kw := s.Hidden, s.Intermediate, s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	switch {
	case kern == nil || d.info.Code != codeCubin:
		return nil, fmt.Errorf("%s: needs the sm_90a kernels (%s)", op, d.info.Code)
	case s.HeadDim != 64 && s.HeadDim != 128:
		return nil, fmt.Errorf("%s: head dim %d (64 or 128)", op, s.HeadDim)
	case s.Heads%s.KVHeads != 0:
		return nil, fmt.Errorf("%s: %d heads over %d KV heads", op, s.Heads, s.KVHeads)
	case H%8 != 0 || F%8 != 0:
		return nil, fmt.Errorf("%s: hidden %d and intermediate %d must be multiples of 8", op, H, F)
	case 4*H > stackSlot || 2*F > stackSlot || 2*qw > stackSlot:
		return nil, fmt.Errorf("%s: rows of hidden %d, intermediate %d or %d q dims exceed a %d-byte ring slot", op, H, F, qw, stackSlot)
	case d.info.SMs < s.Heads:
		return nil, fmt.Errorf("%s: %d heads on %d SMs", op, s.Heads, d.info.SMs)
	}
	ring, xs := stackPlan(s)
	if ring < 2 {
		return nil, fmt.Errorf("%s: shared memory leaves %d ring slots", op, ring)
	}
	inv, err := d.buf(op, "InvFreq", s.InvFreq)
	if err != nil {
		return nil, err
	}
	if err := wantDT(op, "InvFreq", inv, gpu.F32); err != nil {
		return nil, err
	}
	if err := gpu.CheckLen(op, "InvFreq", inv, s.HeadDim/2); err != nil {
		return nil, err
	}
	st := &layerStack{d: d, spec: s, inv: inv, ring: ring, xs: xs}
	names := []string{"QKV", "O", "GateUp", "Down", "QNorm", "KNorm", "PostAttnNorm", "PostFFNorm", "K", "V"}
	lens := []int{(qw + 2*kw) * H, H * qw, 2 * F * H, H * F, qw, kw, H, H}
	raw := make([]byte, 0, 80*len(layers))
	for i, l := range layers {
		bs, err := d.bufs2(fmt.Sprintf("%s: layer %d", op, i), names,
			l.QKV, l.O, l.GateUp, l.Down, l.QNorm, l.KNorm, l.PostAttnNorm, l.PostFFNorm, l.K, l.V)
		if err != nil {
			return nil, err
		}
		for j, b := range bs {
			if b.dt != gpu.BF16 {
				return nil, fmt.Errorf("%s: layer %d: %s is %s, not bf16", op, i, names[j], b.dt)
			}
			if j < len(lens) {
				if err := gpu.CheckLen(op, names[j], b, lens[j]); err != nil {
					return nil, fmt.Errorf("layer %d: %w", i, err)
				}
			}
			if b.ptr%16 != 0 {
				return nil, fmt.Errorf("%s: layer %d: %s is not 16-byte aligned", op, i, names[j])
			}
			raw = binary.LittleEndian.AppendUint64(raw, b.ptr)
		}
		slots := min(bs[8].n, bs[9].n) / kw
		if i == 0 || slots < st.slots {
			st.slots = slots
		}
		st.layers = append(st.layers, bs)
	}
	if st.slots < 1 {
		return nil, fmt.Errorf("%s: caches of no slot", op)
	}
	var e error
	get := func(dt gpu.DType, n int) *Buffer {
		if e != nil {
			return nil
		}
		var b *Buffer
		b, e = d.alloc(op, dt, n, true)
		return b
	}
	st.table = get(gpu.I32, len(raw)/4)
	st.work = get(gpu.F32, stackProfOff(s)+2*stackProfLen(len(layers)))
	st.sync = get(gpu.I32, 2+s.Heads) // the grid barriers' 64-bit counter, a counter per head
	if e != nil {
		st.free()
		return nil, e
	}
	c := append([]byte(nil), raw...)
	dst := st.table.ptr
	d.post(func() error { return d.upload(dst, c) })
	return st, nil
}

// stackParams mirrors struct StackParams in kernels/cuda/stack.cu.
func (st *layerStack) params(btRows int) []byte {
	s := st.spec
	raw := make([]byte, 0, 56)
	for _, v := range []int{len(st.layers), s.Hidden, s.Heads, s.KVHeads, s.HeadDim, s.Intermediate,
		s.BlockSize, s.MaxBlocks, st.slots, btRows, st.ring, stackMaxSplit} {
		raw = binary.LittleEndian.AppendUint32(raw, uint32(int32(v)))
	}
	raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(s.Eps))
	return binary.LittleEndian.AppendUint32(raw, math.Float32bits(float32(1/math.Sqrt(float64(s.HeadDim)))))
}

// Decode implements gpu.LayerStack: one launch of stack_step, a block an
// SM (each needs the whole SM's shared memory, so all are resident at
// once, which its grid barriers rely on).
func (st *layerStack) Decode(x, pos, seq, slots, table gpu.Buffer) error {
	const op = "stack decode"
	d := st.d
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	if st.table == nil || st.table.dead() {
		return fmt.Errorf("%s: the stack was freed", op)
	}
	for i, bs := range st.layers {
		for _, b := range bs {
			if b.dead() {
				return fmt.Errorf("%s: a buffer of layer %d was freed", op, i)
			}
		}
	}
	if st.inv.dead() {
		return fmt.Errorf("%s: InvFreq was freed", op)
	}
	b, err := d.bufs2(op, []string{"x", "pos", "seq", "slots", "table"}, x, pos, seq, slots, table)
	if err != nil {
		return err
	}
	s := st.spec
	if err := checkLens(op, []string{"x", "pos", "seq", "slots", "table"}, b, []int{s.Hidden, 1, 1, 1, s.MaxBlocks}); err != nil {
		return err
	}
	if err := wantDT(op, "x", b[0], gpu.F32); err != nil {
		return err
	}
	for i, nm := range []string{"pos", "seq", "slots", "table"} {
		if err := wantDT(op, nm, b[i+1], gpu.I32); err != nil {
			return err
		}
	}
	rows := b[4].n / s.MaxBlocks
	kern := d.k(fmt.Sprintf("stack_step_hd%d", s.HeadDim))
	return d.launch(kern, grid1(d.info.SMs), grid1(stackThreads), st.ring*stackSlot+st.xs,
		bufArg("layers", st.table, gpu.I32, st.table.n), bufArg("x", b[0], gpu.F32, s.Hidden),
		bufArg("work", st.work, gpu.F32, st.work.n), bufArg("sync", st.sync, gpu.I32, st.sync.n),
		bufArg("pos", b[1], gpu.I32, 1), bufArg("seq", b[2], gpu.I32, 1), bufArg("slots", b[3], gpu.I32, 1),
		bufArg("table", b[4], gpu.I32, rows*s.MaxBlocks), bufArg("invFreq", st.inv, gpu.F32, s.HeadDim/2),
		rawArg(st.params(rows)), devPtrArg(d.faultDev))
}

// Free implements gpu.LayerStack.
func (st *layerStack) Free() error {
	if err := st.d.enter("stack free"); err != nil {
		return err
	}
	defer st.d.leave()
	st.free()
	return nil
}

func (st *layerStack) free() {
	for _, b := range []*Buffer{st.table, st.work, st.sync} {
		if b == nil || b.dead() {
			continue
		}
		b.freed = true
		if st.d.capture {
			st.d.deferred = append(st.d.deferred, b)
		} else {
			st.d.freeNow(b)
		}
	}
}
