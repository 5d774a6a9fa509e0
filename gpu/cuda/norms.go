package cuda

import "github.com/troupe/troupe/gpu"

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
	return d.normLocked(op, mode, out, r, x, w, n, dim, eps)
}

// normLocked is norm inside an operation.
func (d *Device) normLocked(op string, mode int, out, r, x, w gpu.Buffer, n, dim int, eps float32) error {
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
