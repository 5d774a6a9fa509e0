package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/host"
)

// elemGrain is the least number of elements worth handing to another
// thread in an elementwise operation.
const elemGrain = 16 << 10

// Add implements gpu.Ops.
func (d *Device) Add(out, a, c gpu.Buffer, n int) error {
	return d.binary("add", [3]string{"out", "a", "b"}, out, a, c, n, elemGrain, d.k.add)
}

// SiLUMul implements gpu.Ops.
func (d *Device) SiLUMul(out, gate, up gpu.Buffer, n int) error {
	return d.binary("silumul", [3]string{"out", "gate", "up"}, out, gate, up, n, elemGrain/4, d.k.siluMul)
}

// binary checks three F32 buffers of n elements and runs kernel over them
// in parallel chunks of at least grain elements.
func (d *Device) binary(op string, names [3]string, out, x, y gpu.Buffer, n, grain int, kernel func(o, x, y []float32)) error {
	b, err := d.args(op, out, x, y)
	if err != nil {
		return err
	}
	if err := checkDims(op, n); err != nil {
		return err
	}
	var v [3][]float32
	for i := range v {
		if v[i], err = f32(op, names[i], b[i], n); err != nil {
			return err
		}
	}
	d.pool.For(n, grain, func(_, lo, hi int) { kernel(v[0][lo:hi], v[1][lo:hi], v[2][lo:hi]) })
	return nil
}

// RMSNorm implements gpu.Ops.
func (d *Device) RMSNorm(out, x, w gpu.Buffer, n, dim int, eps float32) error {
	const op = "rmsnorm"
	b, err := d.args(op, out, x, w)
	if err != nil {
		return err
	}
	if err := checkDims(op, n, dim); err != nil {
		return err
	}
	o, err := f32(op, "out", b[0], n*dim)
	if err != nil {
		return err
	}
	xv, err := f32(op, "x", b[1], n*dim)
	if err != nil {
		return err
	}
	wm, err := matOf(op, "w", b[2], dim)
	if err != nil {
		return err
	}
	if n == 0 || dim == 0 {
		return nil
	}
	wf := wm.floats(d.k, dim)
	d.pool.For(n, max(1, elemGrain/dim), func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			xr := xv[r*dim : (r+1)*dim]
			inv := float32(1 / math.Sqrt(float64(d.k.sumSq(xr))/float64(dim)+float64(eps)))
			d.k.scaleMul(o[r*dim:(r+1)*dim], xr, wf, inv)
		}
	})
	return nil
}

// Embed implements gpu.Ops.
func (d *Device) Embed(out, table, ids gpu.Buffer, n, dim int) error {
	const op = "embed"
	b, err := d.args(op, out, table, ids)
	if err != nil {
		return err
	}
	if err := checkDims(op, n, dim); err != nil {
		return err
	}
	if dim == 0 {
		return fmt.Errorf("%s: zero dim", op)
	}
	o, err := f32(op, "out", b[0], n*dim)
	if err != nil {
		return err
	}
	id, err := i32(op, "ids", b[2], n)
	if err != nil {
		return err
	}
	t, err := matOf(op, "table", b[1], 0)
	if err != nil {
		return err
	}
	rows := b[1].Len() / dim
	for i, r := range id[:n] {
		if r < 0 || int(r) >= rows {
			return fmt.Errorf("%s: id %d of token %d outside [0,%d)", op, r, i, rows)
		}
	}
	for i, r := range id[:n] {
		t.row(d.k, o[i*dim:(i+1)*dim], int(r)*dim)
	}
	return nil
}

// ropeRestart is how many consecutive positions RoPE steps its angles
// through before it computes them afresh, bounding the rounding that the
// steps accumulate (about 1e-16 each, in float64).
const ropeRestart = 64

// rotor holds the cosines and sines of pos·invFreq[i] in float64 and steps
// them to the next position by an angle addition, which costs a few
// multiplications where math.Sincos costs tens of nanoseconds.
type rotor struct {
	f            []float32
	cos, sin     []float64 // of the current position's angles
	cstep, sstep []float64 // of invFreq: one position's rotation
}

// newRotor returns a rotor for invFreq f using buf (4*len(f) floats).
func newRotor(buf []float64, f []float32) rotor {
	h := len(f)
	r := rotor{f: f, cos: buf[:h], sin: buf[h : 2*h], cstep: buf[2*h : 3*h], sstep: buf[3*h : 4*h]}
	for i, v := range f {
		r.sstep[i], r.cstep[i] = math.Sincos(float64(v))
	}
	return r
}

// set computes the angles of position p afresh.
func (r rotor) set(p int32) {
	for i, v := range r.f {
		r.sin[i], r.cos[i] = math.Sincos(float64(p) * float64(v))
	}
}

// step moves the angles on by one position.
func (r rotor) step() {
	for i := range r.cos {
		c, s := r.cos[i], r.sin[i]
		r.cos[i] = c*r.cstep[i] - s*r.sstep[i]
		r.sin[i] = s*r.cstep[i] + c*r.sstep[i]
	}
}

// store rounds the cosines and sines into cos and sin.
func (r rotor) store(cos, sin []float32) {
	for i := range r.cos {
		cos[i], sin[i] = float32(r.cos[i]), float32(r.sin[i])
	}
}

// RoPE implements gpu.Ops. Angles are formed in float64 (positions reach
// the thousands), once per token and frequency, and shared by the heads.
func (d *Device) RoPE(x, pos, invFreq gpu.Buffer, n, heads, headDim int) error {
	const op = "rope"
	b, err := d.args(op, x, pos, invFreq)
	if err != nil {
		return err
	}
	if err := checkDims(op, n, heads, headDim); err != nil {
		return err
	}
	if headDim%2 != 0 {
		return fmt.Errorf("%s: odd head dim %d", op, headDim)
	}
	half := headDim / 2
	xv, err := f32(op, "x", b[0], n*heads*headDim)
	if err != nil {
		return err
	}
	p, err := i32(op, "pos", b[1], n)
	if err != nil {
		return err
	}
	f, err := f32(op, "invFreq", b[2], half)
	if err != nil {
		return err
	}
	width := heads * headDim
	d.pool.For(n, max(1, elemGrain/max(1, 4*width)), func(tid, lo, hi int) {
		cs := d.scratch[tid].get(2 * half)
		cos, sin := cs[:half], cs[half:]
		rot := newRotor(d.scratch[tid].get64(4*half), f)
		for t := lo; t < hi; t++ {
			if t > lo && p[t] == p[t-1]+1 && (t-lo)%ropeRestart != 0 {
				rot.step()
			} else {
				rot.set(p[t])
			}
			rot.store(cos, sin)
			for h := range heads {
				row := xv[t*width+h*headDim : t*width+(h+1)*headDim]
				d.k.rotate(row[:half], row[half:], cos, sin)
			}
		}
	})
	return nil
}

// StoreKV implements gpu.Ops for F32, BF16 and F16 caches. Tokens are
// stored in parallel, so when two share a slot which one lands is
// unspecified.
func (d *Device) StoreKV(kc, vc, k, v, slots gpu.Buffer, n, width int) error {
	const op = "storekv"
	b, err := d.args(op, kc, vc, k, v, slots)
	if err != nil {
		return err
	}
	if err := checkDims(op, n, width); err != nil {
		return err
	}
	kv, err := f32(op, "k", b[2], n*width)
	if err != nil {
		return err
	}
	vv, err := f32(op, "v", b[3], n*width)
	if err != nil {
		return err
	}
	sl, err := i32(op, "slots", b[4], n)
	if err != nil {
		return err
	}
	for i, c := range b[:2] {
		if !c.DType().IsFloat() {
			return fmt.Errorf("%s: cache %d has dtype %s", op, i, c.DType())
		}
	}
	for t, s := range sl[:n] {
		if s < 0 || (int(s)+1)*width > b[0].Len() || (int(s)+1)*width > b[1].Len() {
			return fmt.Errorf("%s: slot %d of token %d outside the cache", op, s, t)
		}
	}
	d.pool.For(n, max(1, elemGrain/max(1, 2*width)), func(_, lo, hi int) {
		for t := lo; t < hi; t++ {
			off := int(sl[t]) * width
			for i, c := range b[:2] {
				src := [2][]float32{kv, vv}[i][t*width : (t+1)*width]
				switch c.DType() {
				case gpu.F32:
					copy(c.F32()[off:], src)
				case gpu.BF16:
					dst := c.U16()[off : off+width]
					for j, x := range src {
						dst[j] = gpu.F32ToBF16(x)
					}
				case gpu.F16:
					dst := c.U16()[off : off+width]
					for j, x := range src {
						dst[j] = gpu.F32ToF16(x)
					}
				}
			}
		}
	})
	return nil
}

// Argmax implements gpu.Argmaxer; NaNs are never chosen unless a row holds
// nothing else.
func (d *Device) Argmax(out, logits gpu.Buffer, n, width int) error {
	o, l, err := d.rowsArgs("argmax", out, logits, n, width)
	if err != nil {
		return err
	}
	d.pool.For(n, max(1, elemGrain/max(1, width)), func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			row := l[r*width : (r+1)*width]
			best, bv := 0, float32(math.Inf(-1))
			for j, v := range row {
				if v > bv {
					best, bv = j, v
				}
			}
			o[r] = int32(best)
		}
	})
	return nil
}

var _ gpu.Sampler = (*Device)(nil)

// Sample implements gpu.Sampler: gpu.SampleHost on a copy of each row,
// the rows spread over the pool's threads, or, with fewer rows than
// threads, each row's exponentials spread over them in pieces (the same
// tokens either way). A row that follows the draw before (SampleRow.Follows)
// takes its list from the draws kept with out, after the token out holds.
func (d *Device) Sample(out, logits gpu.Buffer, n, width int, rows []gpu.SampleRow) error {
	const op = "sample"
	if len(rows) != n {
		return fmt.Errorf("%s: %d draws for %d rows", op, len(rows), n)
	}
	o, l, err := d.rowsArgs(op, out, logits, n, width)
	if err != nil {
		return err
	}
	for r, sr := range rows {
		if err := sr.Validate(); err != nil {
			return fmt.Errorf("%s: row %d: %w", op, r, err)
		}
	}
	ob, err := host.Of(op, out)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(rows, func(r gpu.SampleRow) bool { return r.Follows }) {
		if len(ob.Drawn) != n {
			return fmt.Errorf("%s: rows follow a draw of %d rows into out, not %d", op, len(ob.Drawn), n)
		}
		if rows, err = gpu.FollowRows(ob.Drawn, o, rows); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	defer func() { ob.Drawn = slices.Clone(rows) }()
	type scratch struct {
		row []float32
		s   gpu.SampleScratch
	}
	draw := func(sc *scratch, r int) {
		if sc.row == nil {
			sc.row = make([]float32, width)
		}
		copy(sc.row, l[r*width:(r+1)*width])
		o[r] = gpu.SampleHost(sc.row, rows[r], &sc.s)
	}
	per := make([]scratch, d.pool.threads)
	if n < d.pool.threads {
		per[0].s.Parallel = func(pieces int, f func(i int)) {
			d.pool.For(pieces, 1, func(_, lo, hi int) {
				for i := lo; i < hi; i++ {
					f(i)
				}
			})
		}
		for r := range n {
			draw(&per[0], r)
		}
		return nil
	}
	d.pool.For(n, 1, func(tid, lo, hi int) {
		for r := lo; r < hi; r++ {
			draw(&per[tid], r)
		}
	})
	return nil
}

// rowsArgs checks the arguments of an operation choosing a token from each
// of n rows of width logits and returns out's and logits' elements.
func (d *Device) rowsArgs(op string, out, logits gpu.Buffer, n, width int) ([]int32, []float32, error) {
	b, err := d.args(op, out, logits)
	if err != nil {
		return nil, nil, err
	}
	if err := checkDims(op, n, width); err != nil {
		return nil, nil, err
	}
	if width == 0 && n > 0 {
		return nil, nil, fmt.Errorf("%s: zero width", op)
	}
	o, err := i32(op, "out", b[0], n)
	if err != nil {
		return nil, nil, err
	}
	l, err := f32(op, "logits", b[1], n*width)
	if err != nil {
		return nil, nil, err
	}
	return o, l, nil
}

var _ gpu.Summarizer = (*Device)(nil)

// Summarize implements gpu.Summarizer with gpu.Summarize, one row after
// another (each spreads its pieces over threads where it is long).
func (d *Device) Summarize(out, logits, ids gpu.Buffer, rows []int32, width, top int) error {
	const op = "summarize"
	n, err := gpu.SummaryRows(op, rows, width, top)
	if err != nil {
		return err
	}
	b, err := d.args(op, out, logits, ids)
	if err != nil {
		return err
	}
	w := gpu.SummaryWidth(top)
	o, err := f32(op, "out", b[0], len(rows)*w)
	if err != nil {
		return err
	}
	l, err := f32(op, "logits", b[1], n*width)
	if err != nil {
		return err
	}
	id, err := i32(op, "ids", b[2], n)
	if err != nil {
		return err
	}
	for j, r := range rows {
		gpu.Summarize(o[j*w:(j+1)*w], l[int(r)*width:(int(r)+1)*width], id[r], top)
	}
	return nil
}
