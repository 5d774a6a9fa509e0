package cpu

import (
	"fmt"
	"math"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/host"
)

// MoE implements gpu.Ops: softmax routing, top-k experts per token, then
// for each expert the tokens routed to it go through its SwiGLU block as
// one batch (so the GEMM serves them all) and are added back weighted.
func (d *Device) MoE(out, x gpu.Buffer, a gpu.MoEArgs) error {
	const op = "moe"
	b, err := d.args(op, out, x, a.Router)
	if err != nil {
		return err
	}
	if a.N < 0 || a.Dim <= 0 || a.Inter <= 0 || a.Experts <= 0 || len(a.Gate) != a.Experts || len(a.Up) != a.Experts || len(a.Down) != a.Experts || a.TopK < 1 || a.TopK > a.Experts {
		return fmt.Errorf("%s: %d experts with %d/%d/%d weights, top %d, dim %d, inter %d", op, a.Experts, len(a.Gate), len(a.Up), len(a.Down), a.TopK, a.Dim, a.Inter)
	}
	o, err := f32(op, "out", b[0], a.N*a.Dim)
	if err != nil {
		return err
	}
	xv, err := f32(op, "x", b[1], a.N*a.Dim)
	if err != nil {
		return err
	}
	router, err := matOf(op, "router", b[2], a.Experts*a.Dim)
	if err != nil {
		return err
	}
	gate, up, down := make([]mat, a.Experts), make([]mat, a.Experts), make([]mat, a.Experts)
	for e := range a.Experts {
		for _, w := range []struct {
			name string
			buf  gpu.Buffer
			dst  *mat
			n    int
		}{
			{"gate", a.Gate[e], &gate[e], a.Inter * a.Dim},
			{"up", a.Up[e], &up[e], a.Inter * a.Dim},
			{"down", a.Down[e], &down[e], a.Dim * a.Inter},
		} {
			hb, err := host.Of(op, w.buf)
			if err != nil {
				return err
			}
			if *w.dst, err = matOf(op, fmt.Sprintf("%s[%d]", w.name, e), hb, w.n); err != nil {
				return err
			}
		}
	}
	n := a.N
	o = o[:n*a.Dim]
	clear(o)
	if n == 0 {
		return nil
	}
	logits := make([]float32, n*a.Experts)
	d.matmul(logits, xv[:n*a.Dim], router, n, a.Dim, a.Experts)

	// Route: per expert, the tokens it serves and their weights.
	tokens := make([][]int, a.Experts)
	weights := make([][]float32, a.Experts)
	prob := make([]float64, a.Experts)
	taken := make([]bool, a.Experts)
	top := make([]int, a.TopK)
	for t := range n {
		row := logits[t*a.Experts : (t+1)*a.Experts]
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, float64(v))
		}
		var sum float64
		for e, v := range row {
			prob[e] = math.Exp(float64(v) - mx)
			sum += prob[e]
		}
		clear(taken)
		norm := 0.0
		for i := range top {
			best := -1
			for e := range prob {
				if !taken[e] && (best < 0 || prob[e] > prob[best]) {
					best = e
				}
			}
			taken[best], top[i] = true, best
			norm += prob[best] / sum
		}
		if !a.NormTopK {
			norm = 1
		}
		for _, e := range top {
			tokens[e] = append(tokens[e], t)
			weights[e] = append(weights[e], float32(prob[e]/sum/norm))
		}
	}

	for e := range a.Experts {
		cnt := len(tokens[e])
		if cnt == 0 {
			continue
		}
		xe := make([]float32, cnt*a.Dim)
		for i, t := range tokens[e] {
			copy(xe[i*a.Dim:(i+1)*a.Dim], xv[t*a.Dim:(t+1)*a.Dim])
		}
		g := make([]float32, cnt*a.Inter)
		u := make([]float32, cnt*a.Inter)
		d.matmul(g, xe, gate[e], cnt, a.Dim, a.Inter)
		d.matmul(u, xe, up[e], cnt, a.Dim, a.Inter)
		d.k.siluMul(g, g, u)
		y := xe
		d.matmul(y, g, down[e], cnt, a.Inter, a.Dim)
		for i, t := range tokens[e] {
			w := weights[e][i]
			dst := o[t*a.Dim : (t+1)*a.Dim]
			for j, v := range y[i*a.Dim : (i+1)*a.Dim] {
				dst[j] += w * v
			}
		}
	}
	return nil
}
