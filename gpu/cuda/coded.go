package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/code12"
)

var _ gpu.WeightCoder = (*Device)(nil)

// coded is a bf16 weight's twin in the 12-bit code (gpu/code12): the
// one-token products (gemv_c12_* and their post-norm, gated and head
// kinds) read it instead of the bf16 rows.
type coded struct {
	data, esc *Buffer // the code's bytes and escape entries, as I32 words
	rows, k   int
	cap       int
	base4     uint32
	v0        float32
	nv, ks    int
}

// codedSplits are the (nv, ks) of the coded GEMVs in the module: x in
// shared memory takes k up to 8192 (kernels/cuda/gemv.cu).
var codedSplits = []struct{ nv, ks int }{{1, 1}, {2, 1}, {2, 2}, {2, 4}, {2, 8}}

// codedKernelNames are the coded GEMVs; an older artifact set lacks them
// and the weights then stay bf16 only.
func codedKernelNames() []string {
	var names []string
	for _, s := range codedSplits {
		for _, kind := range []string{"bf16", "glu_bf16", postKind(false), postKind(true), "bf16_head"} {
			names = append(names, codedName(kind, s.nv, s.ks))
		}
	}
	return names
}

// codedName is the coded GEMV of the bf16 GEMV kind (gemvKernel's) at
// (nv, ks): gemv_c12_*, gemv_glu_c12_post_* and so on.
func codedName(kind string, nv, ks int) string {
	return fmt.Sprintf("gemv_%s_nv%d_ks%d", strings.Replace(kind, "bf16", "c12", 1), nv, ks)
}

// codedShape is the (nv, ks) of the coded GEMV for rows of k values: a
// unit of the code is two of the bf16 GEMV's, so gemvShape at k/2, from
// the splits the module holds.
func (d *Device) codedShape(k int) (nv, ks int, ok bool) {
	if k%code12.Chunk != 0 {
		return 0, 0, false
	}
	nv, ks, ok = d.gemvShape(k/2, 0)
	if !ok {
		return 0, 0, false
	}
	for _, s := range codedSplits {
		if s.nv == nv && s.ks == ks {
			return nv, ks, true
		}
	}
	return 0, 0, false
}

// Codable implements gpu.WeightCoder: a coded GEMV of the module takes
// rows of k values.
func (d *Device) Codable(rows, k int) bool {
	nv, ks, ok := d.codedShape(k)
	return ok && rows > 0 && k <= code12.MaxK && d.k(codedName("bf16", nv, ks)) != nil
}

// Code implements gpu.WeightCoder.
func (d *Device) Code(w gpu.Buffer, rows, k int, data ...[]byte) (bool, error) {
	const op = "code weights"
	if err := d.enter(op); err != nil {
		return false, err
	}
	defer d.leave()
	b, err := d.buf(op, "w", w)
	if err != nil {
		return false, err
	}
	if b.dt != gpu.BF16 || b.parent != nil || b.n != rows*k {
		return false, fmt.Errorf("%s: w is %d %s elements (a view: %t), want an allocation of %d × %d bf16", op, b.n, b.dt,
			b.parent != nil, rows, k)
	}
	if d.capture {
		return false, fmt.Errorf("%s: not allowed while recording a graph", op)
	}
	if !d.Codable(rows, k) {
		return false, nil
	}
	nv, ks, _ := d.codedShape(k)
	m, err := code12.Encode(rows, k, data...)
	if errors.Is(err, code12.ErrNotCodable) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s: %w", op, err)
	}
	c := &coded{rows: rows, k: k, cap: m.Cap, base4: m.Base4(), v0: m.V0(), nv: nv, ks: ks}
	if c.data, err = d.constant(op, gpu.I32, m.Data); err != nil {
		return false, err
	}
	esc := make([]byte, 0, 4*len(m.Esc))
	for _, e := range m.Esc {
		esc = binary.LittleEndian.AppendUint32(esc, e)
	}
	if c.esc, err = d.constant(op, gpu.I32, esc); err != nil {
		d.freeNow(c.data)
		return false, err
	}
	if b.coded != nil {
		d.freeCoded(b)
	}
	b.coded = c
	return true, nil
}

// freeCoded releases b's twin.
func (d *Device) freeCoded(b *Buffer) {
	for _, t := range []*Buffer{b.coded.data, b.coded.esc} {
		if !t.freed {
			d.freeNow(t)
		}
	}
	b.coded = nil
}

// codedGEMV is the coded GEMV standing in for the bf16 GEMV kind
// (gemvKernel's: bf16, glu_bf16, bf16_post, glu_bf16_post, bf16_head) over
// w's rows × k, with its grid, the argument for w's code in place of its
// bf16 rows, and the arguments that follow the kernel's others; a nil
// kernel where w has no twin for that shape.
func (d *Device) codedGEMV(kind string, w *Buffer, k, rows int) (*kernel, dim3, arg, []arg) {
	c := w.coded
	if c == nil || c.k != k || c.rows != rows {
		return nil, dim3{}, arg{}, nil
	}
	kern := d.k(codedName(kind, c.nv, c.ks))
	if kern == nil {
		return nil, dim3{}, arg{}, nil
	}
	return kern, grid1(d.gemvGrid(c.ks, rows, kern.occ)), bufArg("w", c.data, gpu.I32, rows*k*3/8), []arg{
		bufArg("esc", c.esc, gpu.I32, rows*c.cap), i32Arg(c.cap), i32Arg(int(c.base4)), f32Arg(c.v0)}
}
