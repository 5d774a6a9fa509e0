package cuda

import (
	"fmt"

	"github.com/troupe/troupe/gpu"
)

var _ gpu.ShardNormer = (*Device)(nil)

// SumSquares2 implements gpu.ShardNormer.
func (d *Device) SumSquares2(out, a, b gpu.Buffer, n, wa, wb int) error {
	const op = "sumsquares"
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	if err := positive(op, n, wa, wb); err != nil {
		return err
	}
	bs, err := d.bufs2(op, []string{"out", "a", "b"}, out, a, b)
	if err != nil {
		return err
	}
	k := d.k("sumsq2_f32")
	if k == nil {
		return fmt.Errorf("%s: the shardnorm kernels are not loaded: rebuild with kernels/build.sh", op)
	}
	return d.launch(k, grid1(2*n), grid1(blockFor(max(wa, wb))), 0,
		bufArg("out", bs[0], gpu.F32, 2*n), bufArg("a", bs[1], gpu.F32, n*wa), bufArg("b", bs[2], gpu.F32, n*wb),
		i32Arg(n), i32Arg(wa), i32Arg(wb))
}

// RMSNormShard implements gpu.ShardNormer.
func (d *Device) RMSNormShard(x, ss gpu.Buffer, ssOff int, w gpu.Buffer, n, dim, total int, eps float32) error {
	const op = "rmsnorm shard"
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	if err := positive(op, n, dim, total); err != nil {
		return err
	}
	if ssOff < 0 {
		return fmt.Errorf("%s: negative offset %d", op, ssOff)
	}
	bs, err := d.bufs2(op, []string{"x", "ss", "w"}, x, ss, w)
	if err != nil {
		return err
	}
	if bs[2].dt.Size() == 0 || !bs[2].dt.IsFloat() {
		return fmt.Errorf("%s: w holds %s", op, bs[2].dt)
	}
	k := d.k("rmsnorm_shard_" + suffix(bs[2].dt))
	if k == nil {
		return fmt.Errorf("%s: the shardnorm kernels are not loaded: rebuild with kernels/build.sh", op)
	}
	return d.launch(k, grid1(n), grid1(blockFor(dim)), 0,
		bufArg("x", bs[0], gpu.F32, n*dim), arg{kind: argBuf, name: "ss", buf: bs[1], off: ssOff, n: n, dt: gpu.F32},
		bufArg("w", bs[2], bs[2].dt, dim), i32Arg(n), i32Arg(dim), f32Arg(1/float32(total)), f32Arg(eps))
}
