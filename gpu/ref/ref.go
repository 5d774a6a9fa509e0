package ref

import (
	"fmt"
	"math"
	"sort"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/host"
)

// Device is the float64 reference device.
type Device struct{ host.Memory }

var _ gpu.Device = (*Device)(nil)

// New returns a reference device.
func New() *Device { return &Device{} }

// Name implements gpu.Device.
func (*Device) Name() string { return "ref (float64)" }

// Close implements gpu.Device.
func (*Device) Close() error { return nil }

func bufs(op string, bs ...gpu.Buffer) ([]*host.Buffer, error) {
	out := make([]*host.Buffer, len(bs))
	for i, b := range bs {
		hb, err := host.Of(op, b)
		if err != nil {
			return nil, err
		}
		out[i] = hb
	}
	return out, nil
}

func checkF32(op string, names []string, bs []*host.Buffer, lens []int) error {
	for i, b := range bs {
		if err := gpu.CheckLen(op, names[i], b, lens[i]); err != nil {
			return err
		}
	}
	return nil
}

// Embed implements gpu.Ops.
func (*Device) Embed(out, table, ids gpu.Buffer, n, dim int) error {
	b, err := bufs("embed", out, table, ids)
	if err != nil {
		return err
	}
	if err := checkF32("embed", []string{"out", "ids"}, []*host.Buffer{b[0], b[2]}, []int{n * dim, n}); err != nil {
		return err
	}
	rows := b[1].Len() / dim
	o, id := b[0].F32(), b[2].I32()
	for t := 0; t < n; t++ {
		r := int(id[t])
		if r < 0 || r >= rows {
			return fmt.Errorf("embed: id %d outside [0,%d)", r, rows)
		}
		for j := 0; j < dim; j++ {
			o[t*dim+j] = float32(b[1].Float(r*dim + j))
		}
	}
	return nil
}

// MatMul implements gpu.Ops.
func (*Device) MatMul(out, x, w gpu.Buffer, n, k, m int) error {
	b, err := bufs("matmul", out, x, w)
	if err != nil {
		return err
	}
	if err := checkF32("matmul", []string{"out", "x", "w"}, b, []int{n * m, n * k, m * k}); err != nil {
		return err
	}
	o, xf := b[0].F32(), b[1].F32()
	// x and each row of w are widened once; every sum runs in the same
	// order as the plain triple loop.
	xv := make([]float64, n*k)
	for i, v := range xf[:n*k] {
		xv[i] = float64(v)
	}
	wr := make([]float64, k)
	for j := 0; j < m; j++ {
		for l := range wr {
			wr[l] = b[2].Float(j*k + l)
		}
		for i := 0; i < n; i++ {
			var s float64
			for l, w := range wr {
				s += xv[i*k+l] * w
			}
			o[i*m+j] = float32(s)
		}
	}
	return nil
}

// RMSNorm implements gpu.Ops.
func (*Device) RMSNorm(out, x, w gpu.Buffer, n, dim int, eps float32) error {
	b, err := bufs("rmsnorm", out, x, w)
	if err != nil {
		return err
	}
	if err := checkF32("rmsnorm", []string{"out", "x", "w"}, b, []int{n * dim, n * dim, dim}); err != nil {
		return err
	}
	o, xv := b[0].F32(), b[1].F32()
	for r := 0; r < n; r++ {
		var ss float64
		for j := 0; j < dim; j++ {
			v := float64(xv[r*dim+j])
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(dim)+float64(eps))
		for j := 0; j < dim; j++ {
			o[r*dim+j] = float32(float64(xv[r*dim+j]) * inv * b[2].Float(j))
		}
	}
	return nil
}

// Add implements gpu.Ops.
func (*Device) Add(out, a, c gpu.Buffer, n int) error {
	b, err := bufs("add", out, a, c)
	if err != nil {
		return err
	}
	if err := checkF32("add", []string{"out", "a", "b"}, b, []int{n, n, n}); err != nil {
		return err
	}
	o, av, cv := b[0].F32(), b[1].F32(), b[2].F32()
	for i := 0; i < n; i++ {
		o[i] = float32(float64(av[i]) + float64(cv[i]))
	}
	return nil
}

// SiLUMul implements gpu.Ops.
func (*Device) SiLUMul(out, gate, up gpu.Buffer, n int) error {
	b, err := bufs("silumul", out, gate, up)
	if err != nil {
		return err
	}
	if err := checkF32("silumul", []string{"out", "gate", "up"}, b, []int{n, n, n}); err != nil {
		return err
	}
	o, g, u := b[0].F32(), b[1].F32(), b[2].F32()
	for i := 0; i < n; i++ {
		o[i] = float32(silu(float64(g[i])) * float64(u[i]))
	}
	return nil
}

func silu(x float64) float64 { return x / (1 + math.Exp(-x)) }

// RoPE implements gpu.Ops.
func (*Device) RoPE(x, pos, invFreq gpu.Buffer, n, heads, headDim int) error {
	b, err := bufs("rope", x, pos, invFreq)
	if err != nil {
		return err
	}
	half := headDim / 2
	if err := checkF32("rope", []string{"x", "pos", "invFreq"}, b, []int{n * heads * headDim, n, half}); err != nil {
		return err
	}
	xv, p, f := b[0].F32(), b[1].I32(), b[2].F32()
	for t := 0; t < n; t++ {
		for h := 0; h < heads; h++ {
			row := xv[(t*heads+h)*headDim:]
			for i := 0; i < half; i++ {
				ang := float64(p[t]) * float64(f[i])
				c, s := math.Cos(ang), math.Sin(ang)
				a, bb := float64(row[i]), float64(row[i+half])
				row[i] = float32(a*c - bb*s)
				row[i+half] = float32(bb*c + a*s)
			}
		}
	}
	return nil
}

// StoreKV implements gpu.Ops.
func (*Device) StoreKV(kc, vc, k, v, slots gpu.Buffer, n, width int) error {
	b, err := bufs("storekv", kc, vc, k, v, slots)
	if err != nil {
		return err
	}
	if err := checkF32("storekv", []string{"k", "v", "slots"}, b[2:], []int{n * width, n * width, n}); err != nil {
		return err
	}
	sl := b[4].I32()
	for t := 0; t < n; t++ {
		s := int(sl[t])
		if s < 0 || (s+1)*width > b[0].Len() || (s+1)*width > b[1].Len() {
			return fmt.Errorf("storekv: slot %d outside the cache", s)
		}
		for i, c := range b[:2] {
			src := b[2+i].F32()[t*width : (t+1)*width]
			switch c.DType() {
			case gpu.F32:
				copy(c.F32()[s*width:], src)
			case gpu.BF16:
				dst := c.U16()[s*width:]
				for j, x := range src {
					dst[j] = gpu.F32ToBF16(x)
				}
			case gpu.F16:
				dst := c.U16()[s*width:]
				for j, x := range src {
					dst[j] = gpu.F32ToF16(x)
				}
			default:
				return fmt.Errorf("storekv: cache dtype %s", c.DType())
			}
		}
	}
	return nil
}

// Attention implements gpu.Ops.
func (*Device) Attention(out, q, kc, vc gpu.Buffer, a gpu.AttnArgs) error {
	b, err := bufs("attention", out, q, kc, vc, a.Pos, a.Seq, a.BlockTable)
	if err != nil {
		return err
	}
	if a.KVHeads <= 0 || a.Heads%a.KVHeads != 0 || a.BlockSize <= 0 || a.MaxBlocks <= 0 {
		return fmt.Errorf("attention: invalid shape %+v", a)
	}
	qw := a.Heads * a.HeadDim
	kw := a.KVHeads * a.HeadDim
	if err := checkF32("attention", []string{"out", "q", "pos", "seq"}, []*host.Buffer{b[0], b[1], b[4], b[5]}, []int{a.N * qw, a.N * qw, a.N, a.N}); err != nil {
		return err
	}
	o, qv, pos, seq, bt := b[0].F32(), b[1].F32(), b[4].I32(), b[5].I32(), b[6].I32()
	group := a.Heads / a.KVHeads
	for t := 0; t < a.N; t++ {
		p, s := int(pos[t]), int(seq[t])
		if p < 0 || p >= a.MaxBlocks*a.BlockSize || s < 0 || (s+1)*a.MaxBlocks > len(bt) {
			return fmt.Errorf("attention: token %d at position %d of sequence %d outside the block table", t, p, s)
		}
		slots := make([]int, p+1)
		for j := range slots {
			blk := int(bt[s*a.MaxBlocks+j/a.BlockSize])
			slots[j] = blk*a.BlockSize + j%a.BlockSize
			if blk < 0 || (slots[j]+1)*kw > b[2].Len() {
				return fmt.Errorf("attention: block %d outside the cache", blk)
			}
		}
		for h := 0; h < a.Heads; h++ {
			kh := h / group
			qr := qv[t*qw+h*a.HeadDim:]
			scores := make([]float64, p+1)
			mx := math.Inf(-1)
			for j, sl := range slots {
				var d float64
				for i := 0; i < a.HeadDim; i++ {
					d += float64(qr[i]) * b[2].Float(sl*kw+kh*a.HeadDim+i)
				}
				scores[j] = d * float64(a.Scale)
				mx = math.Max(mx, scores[j])
			}
			var sum float64
			for j := range scores {
				scores[j] = math.Exp(scores[j] - mx)
				sum += scores[j]
			}
			for i := 0; i < a.HeadDim; i++ {
				var acc float64
				for j, sl := range slots {
					acc += scores[j] * b[3].Float(sl*kw+kh*a.HeadDim+i)
				}
				o[t*qw+h*a.HeadDim+i] = float32(acc / sum)
			}
		}
	}
	return nil
}

// MoE implements gpu.Ops.
func (d *Device) MoE(out, x gpu.Buffer, a gpu.MoEArgs) error {
	b, err := bufs("moe", out, x, a.Router)
	if err != nil {
		return err
	}
	if len(a.Gate) != a.Experts || len(a.Up) != a.Experts || len(a.Down) != a.Experts || a.TopK < 1 || a.TopK > a.Experts {
		return fmt.Errorf("moe: %d experts with %d/%d/%d weights, top %d", a.Experts, len(a.Gate), len(a.Up), len(a.Down), a.TopK)
	}
	if err := checkF32("moe", []string{"out", "x", "router"}, b, []int{a.N * a.Dim, a.N * a.Dim, a.Experts * a.Dim}); err != nil {
		return err
	}
	ws := make([]*host.Buffer, 0, 3*a.Experts)
	for e := 0; e < a.Experts; e++ {
		g, err := bufs("moe", a.Gate[e], a.Up[e], a.Down[e])
		if err != nil {
			return err
		}
		if err := checkF32("moe", []string{"gate", "up", "down"}, g, []int{a.Inter * a.Dim, a.Inter * a.Dim, a.Dim * a.Inter}); err != nil {
			return err
		}
		ws = append(ws, g...)
	}
	o, xv := b[0].F32(), b[1].F32()
	for t := 0; t < a.N; t++ {
		xr := xv[t*a.Dim : (t+1)*a.Dim]
		logits := make([]float64, a.Experts)
		mx := math.Inf(-1)
		for e := range logits {
			for i, v := range xr {
				logits[e] += float64(v) * b[2].Float(e*a.Dim+i)
			}
			mx = math.Max(mx, logits[e])
		}
		var sum float64
		for e := range logits {
			logits[e] = math.Exp(logits[e] - mx)
			sum += logits[e]
		}
		order := make([]int, a.Experts)
		for e := range order {
			order[e] = e
			logits[e] /= sum
		}
		sort.SliceStable(order, func(i, j int) bool { return logits[order[i]] > logits[order[j]] })
		top := order[:a.TopK]
		var norm float64 = 1
		if a.NormTopK {
			norm = 0
			for _, e := range top {
				norm += logits[e]
			}
		}
		acc := make([]float64, a.Dim)
		h := make([]float64, a.Inter)
		for _, e := range top {
			g, u, dn := ws[3*e], ws[3*e+1], ws[3*e+2]
			for r := 0; r < a.Inter; r++ {
				var gs, us float64
				for i, v := range xr {
					gs += float64(v) * g.Float(r*a.Dim+i)
					us += float64(v) * u.Float(r*a.Dim+i)
				}
				h[r] = silu(gs) * us
			}
			wgt := logits[e] / norm
			for r := 0; r < a.Dim; r++ {
				var s float64
				for i, v := range h {
					s += v * dn.Float(r*a.Inter+i)
				}
				acc[r] += wgt * s
			}
		}
		for i, v := range acc {
			o[t*a.Dim+i] = float32(v)
		}
	}
	return nil
}
