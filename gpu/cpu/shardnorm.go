package cpu

import (
	"fmt"
	"math"

	"github.com/troupe/troupe/gpu"
)

var _ gpu.ShardNormer = (*Device)(nil)

// SumSquares2 implements gpu.ShardNormer: out[i] = Σ a[i, :]² and
// out[n+i] = Σ b[i, :]², accumulated in f32 in column order.
func (d *Device) SumSquares2(out, a, b gpu.Buffer, n, wa, wb int) error {
	const op = "sumsquares"
	bs, err := d.args(op, out, a, b)
	if err != nil {
		return err
	}
	if err := checkDims(op, n, wa, wb); err != nil {
		return err
	}
	o, err := f32(op, "out", bs[0], 2*n)
	if err != nil {
		return err
	}
	av, err := f32(op, "a", bs[1], n*wa)
	if err != nil {
		return err
	}
	bv, err := f32(op, "b", bs[2], n*wb)
	if err != nil {
		return err
	}
	sum := func(x []float32) float32 {
		var s float32
		for _, v := range x {
			s += v * v
		}
		return s
	}
	for i := range n {
		o[i] = sum(av[i*wa : (i+1)*wa])
		o[n+i] = sum(bv[i*wb : (i+1)*wb])
	}
	return nil
}

// RMSNormShard implements gpu.ShardNormer: each row of x is scaled in
// place by w / sqrt(ss[ssOff+i] / total + eps).
func (d *Device) RMSNormShard(x, ss gpu.Buffer, ssOff int, w gpu.Buffer, n, dim, total int, eps float32) error {
	const op = "rmsnorm shard"
	bs, err := d.args(op, x, ss, w)
	if err != nil {
		return err
	}
	if err := checkDims(op, n, dim, ssOff); err != nil {
		return err
	}
	if total <= 0 {
		return fmt.Errorf("%s: total width %d, want > 0", op, total)
	}
	xv, err := f32(op, "x", bs[0], n*dim)
	if err != nil {
		return err
	}
	sv, err := f32(op, "ss", bs[1], ssOff+n)
	if err != nil {
		return err
	}
	wm, err := matOf(op, "w", bs[2], dim)
	if err != nil {
		return err
	}
	if n == 0 || dim == 0 {
		return nil
	}
	wf := wm.floats(d.k, dim)
	for i := range n {
		inv := float32(1 / math.Sqrt(float64(sv[ssOff+i])/float64(total)+float64(eps)))
		xr := xv[i*dim : (i+1)*dim]
		for j, v := range xr {
			xr[j] = v * inv * wf[j]
		}
	}
	return nil
}
