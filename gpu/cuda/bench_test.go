//go:build cuda

package cuda

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
)

// graphRate records body (which issues per launches) into a graph, replays
// it over the benchmark loop and reports device time per launch and, when
// bytes > 0, bandwidth. It returns the seconds per launch.
func graphRate(b *testing.B, d *Device, per int, bytes float64, body func() error) float64 {
	g, err := d.Capture(body)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	if err := g.Launch(); err != nil { // warm up
		b.Fatal(err)
	}
	el, err := d.Elapsed(func() error {
		for b.Loop() {
			if err := g.Launch(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	sec := el.Seconds() / float64(b.N*per)
	b.ReportMetric(sec*1e6, "us/kernel")
	if bytes > 0 {
		b.ReportMetric(bytes/sec/1e9, "GB/s")
	}
	return sec
}

// rotatingRate times per launches of launch with graphRate, each on the
// next of the weight copies ws.
func rotatingRate(b *testing.B, d *Device, ws []gpu.Buffer, per int, bytes float64, launch func(w *Buffer) error) {
	graphRate(b, d, per, bytes, func() error {
		for i := range per {
			if err := launch(ws[i%len(ws)].(*Buffer)); err != nil {
				return err
			}
		}
		return nil
	})
}

// repeat calls f n times, stopping at the first error.
func repeat(n int, f func() error) error {
	for range n {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// rotating uploads copies of raw as separate weight buffers so that
// together they exceed the L2 several times over.
func rotating(b *testing.B, d *Device, dt gpu.DType, raw []byte) []gpu.Buffer {
	copies := max(2, int(math.Ceil(float64(4*d.info.L2Bytes)/float64(len(raw)))))
	ws := make([]gpu.Buffer, copies)
	for i := range ws {
		ws[i] = weights(b, d, dt, raw)
	}
	return ws
}

// OLMo-2-1B decode shapes (m x k): q/k/v/o, gate/up, down, lm head.
var sweep = flag.Bool("cuda.sweep", false, "benchmark every split of the batch-1 GEMV, not only the one MatMul picks")

var gemvShapes = [][2]int{{2048, 2048}, {8192, 2048}, {2048, 8192}, {100352, 2048}}

func BenchmarkGEMV(b *testing.B) {
	d := open(b)
	r := rand.New(rand.NewPCG(1, 1))
	for _, s := range gemvShapes {
		m, k := s[0], s[1]
		raw := gputest.Encode(gpu.BF16, randF32(r, m*k, 0.05))
		ws := rotating(b, d, gpu.BF16, raw)
		x := f32buf(b, d, randF32(r, k, 1))
		out := alloc(b, d, gpu.F32, m)
		per := len(ws) * max(1, 32/len(ws))
		b.Run(fmt.Sprintf("%dx%d/auto", m, k), func(b *testing.B) {
			rotatingRate(b, d, ws, per, float64(len(raw)), func(w *Buffer) error { return d.MatMul(out, x, w, 1, k, m) })
		})
		// The same weights with their twins in the 12-bit code (Code),
		// rated at their bf16 bytes.
		coded := true
		for _, w := range ws {
			if ok, err := d.Code(w, m, k, raw); err != nil || !ok {
				coded = false
			}
		}
		if coded {
			b.Run(fmt.Sprintf("%dx%d/coded", m, k), func(b *testing.B) {
				rotatingRate(b, d, ws, per, float64(len(raw)), func(w *Buffer) error { return d.MatMul(out, x, w, 1, k, m) })
			})
		}
		// Every split of k the fast kernel offers, to tune gemvShape.
		units := k / 256
		if !*sweep {
			units = 0
		}
		for _, sp := range gemvSplits {
			nv, ks := sp.nv, sp.ks
			if per := ceilDiv(units, ks); units == 0 || per > nv || 2*per <= nv {
				continue
			}
			name := fmt.Sprintf("gemv_bf16_nv%d_ks%d", nv, ks)
			for _, mult := range []int{1, 2, 4} {
				rows := 8 / ks * 2
				grid := min(ceilDiv(m, rows), mult*d.info.SMs)
				b.Run(fmt.Sprintf("%dx%d/nv%d_ks%d_grid%d", m, k, nv, ks, grid), func(b *testing.B) {
					rotatingRate(b, d, ws, per, float64(len(raw)), func(w *Buffer) error {
						return d.launch(d.k(name), grid1(grid), grid1(256), 0, bufArg("out", out.(*Buffer), gpu.F32, m),
							bufArg("x", x.(*Buffer), gpu.F32, k), bufArg("w", w, gpu.BF16, m*k), i32Arg(k), i32Arg(m))
					})
				})
			}
		}
		b.Run(fmt.Sprintf("%dx%d/general", m, k), func(b *testing.B) {
			rotatingRate(b, d, ws, per, float64(len(raw)), func(w *Buffer) error {
				return d.launch(d.k("gemv_bf16"), grid1(ceilDiv(m, 8)), grid1(256), 0, bufArg("out", out.(*Buffer), gpu.F32, m),
					bufArg("x", x.(*Buffer), gpu.F32, k), bufArg("w", w, gpu.BF16, m*k), i32Arg(1), i32Arg(k), i32Arg(m))
			})
		})
		for _, w := range ws {
			d.Free(w)
		}
	}
}

// BenchmarkGEMVGrid sweeps the blocks per SM of the batch-1 GEMV, plain and
// forming silu(gate)*up from a packed gate|up (glu), on the OLMo-2 1B and
// 7B shapes (m x k; the 7B MLP also as one of two tensor-parallel ranks
// holds it).
func BenchmarkGEMVGrid(b *testing.B) {
	d := open(b)
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		m, k int
		kind string
	}{
		{16384, 2048, "glu"}, {22016, 4096, "glu"}, {11008, 4096, "glu"},
		{2048, 8192, "plain"}, {4096, 11008, "plain"}, {4096, 5504, "plain"}, {12288, 4096, "plain"}, {4096, 4096, "plain"},
		{22016, 4096, "plain"}, {6144, 2048, "plain"}, {16384, 2048, "plain"},
	} {
		m, k := c.m, c.k
		raw := gputest.Encode(gpu.BF16, randF32(r, m*k, 0.05))
		ws := rotating(b, d, gpu.BF16, raw)
		x := f32buf(b, d, randF32(r, k, 1))
		out := alloc(b, d, gpu.F32, m)
		per := len(ws) * max(1, 32/len(ws))
		nv, ks, ok := d.gemvShape(k, m)
		if !ok {
			b.Fatalf("no fast GEMV for k=%d", k)
		}
		name := fmt.Sprintf("gemv_bf16_nv%d_ks%d", nv, ks)
		if c.kind == "glu" {
			name = fmt.Sprintf("gemv_glu_bf16_nv%d_ks%d", nv, ks)
		}
		for _, perSM := range []int{0, 1, 2, 3, 4} {
			grid := d.gemvGrid(ks, m, d.k(name).occ)
			if perSM > 0 {
				grid = min(ceilDiv(m, 8/ks*2), perSM*d.info.SMs)
			}
			b.Run(fmt.Sprintf("%dx%d/%s/perSM%d_grid%d", m, k, c.kind, perSM, grid), func(b *testing.B) {
				rotatingRate(b, d, ws, per, float64(len(raw)), func(w *Buffer) error {
					return d.launch(d.k(name), grid1(grid), grid1(256), 0, bufArg("out", out.(*Buffer), gpu.F32, m),
						bufArg("x", x.(*Buffer), gpu.F32, k), bufArg("w", w, gpu.BF16, m*k), i32Arg(k), i32Arg(m))
				})
			})
		}
		for _, w := range ws {
			d.Free(w)
		}
	}
}

// BenchmarkReadBandwidth is the roofline the GEMVs are compared with: a
// read-only reduction over 4 GiB of f32.
func BenchmarkReadBandwidth(b *testing.B) {
	d := open(b)
	const n = 1 << 30
	x := alloc(b, d, gpu.F32, n).(*Buffer)
	sum := alloc(b, d, gpu.F32, 1).(*Buffer)
	// Fill with 1.0, not zeros.
	if err := d.do(func() error { return d.drv.cuMemsetD32Async.call(uintptr(x.ptr), 0x3f800000, n, d.stream) }); err != nil {
		b.Fatal(err)
	}
	run := func() error {
		return d.launch(d.k("reduce_sum_f32"), grid1(4*d.info.SMs), grid1(512), 0,
			bufArg("out", sum, gpu.F32, 1), bufArg("x", x, gpu.F32, n), devPtrArg(n/4))
	}
	if err := run(); err != nil {
		b.Fatal(err)
	}
	el, err := d.Elapsed(func() error {
		for b.Loop() {
			if err := run(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	sec := el.Seconds() / float64(b.N)
	b.ReportMetric(sec*1e6, "us/kernel")
	b.ReportMetric(4*n/sec/1e9, "GB/s")
}

// BenchmarkGraphLaunch replays a graph of 100 small kernels: the host cost
// of one Launch, and the device time per graph and per node.
func BenchmarkGraphLaunch(b *testing.B) {
	d := open(b)
	const nodes = 100
	x := f32buf(b, d, randF32(rand.New(rand.NewPCG(2, 2)), 2048, 1))
	y := alloc(b, d, gpu.F32, 2048)
	g, err := d.Capture(func() error {
		for i := 0; i < nodes/2; i++ {
			if err := d.Add(y, x, y, 2048); err != nil {
				return err
			}
			if err := d.SiLUMul(y, x, y, 2048); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	b.Run("host", func(b *testing.B) {
		for b.Loop() {
			if err := g.Launch(); err != nil {
				b.Fatal(err)
			}
			if err := d.Sync(b.Context()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("launch-only", func(b *testing.B) {
		for b.Loop() {
			if err := g.Launch(); err != nil {
				b.Fatal(err)
			}
		}
		if err := d.Sync(b.Context()); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("device", func(b *testing.B) {
		el, err := d.Elapsed(func() error {
			for b.Loop() {
				if err := g.Launch(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(el.Seconds()/float64(b.N)*1e6, "us/graph")
		b.ReportMetric(el.Seconds()/float64(b.N*nodes)*1e6, "us/node")
	})
}

// BenchmarkEager measures the host cost of issuing one operation outside a
// graph, and of a Sync round trip to the device's thread, with the default
// polling and with none.
func BenchmarkEager(b *testing.B) {
	for _, spin := range []time.Duration{0, 50 * time.Microsecond} {
		b.Run(fmt.Sprintf("spin=%v", spin), func(b *testing.B) { benchEager(b, spin) })
	}
}

func benchEager(b *testing.B, spin time.Duration) {
	d, err := Open(b.Context(), withKernels(Config{Spin: spin}))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	x := f32buf(b, d, make([]float32, 2048))
	y := alloc(b, d, gpu.F32, 2048)
	b.Run("add", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			if err := d.Add(y, x, y, 2048); err != nil {
				b.Fatal(err)
			}
		}
		if err := d.Sync(b.Context()); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds()/float64(b.N)*1e6, "us/op-with-drain")
	})
	b.Run("sync", func(b *testing.B) {
		for b.Loop() {
			if err := d.Sync(b.Context()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("write+read", func(b *testing.B) {
		id := make([]int32, 1)
		for b.Loop() {
			if err := d.Write(y, 0, gpu.I32Bytes(id)); err != nil {
				b.Fatal(err)
			}
			if err := d.Read(gpu.I32Bytes(id), y, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAttentionPrefill: a prompt against an OLMo-2-1B layer's cache
// (16 heads of 128, bf16), causal, one sequence.
func BenchmarkAttentionPrefill(b *testing.B) {
	d := open(b)
	r := rand.New(rand.NewPCG(7, 7))
	const heads, hd, bs = 16, 128, 16
	for _, n := range []int{512, 2048} {
		blocks := n / bs
		kw := heads * hd
		kc := weights(b, d, gpu.BF16, gputest.Encode(gpu.BF16, randF32(r, blocks*bs*kw, 1))).(*Buffer)
		vc := weights(b, d, gpu.BF16, gputest.Encode(gpu.BF16, randF32(r, blocks*bs*kw, 1))).(*Buffer)
		kc.readOnly, vc.readOnly = false, false
		table := make([]int32, blocks)
		for i := range table {
			table[i] = int32(i)
		}
		pos, seq := make([]int32, n), make([]int32, n)
		for i := range pos {
			pos[i] = int32(i)
		}
		a := gpu.AttnArgs{N: n, Heads: heads, KVHeads: heads, HeadDim: hd, BlockSize: bs, MaxBlocks: blocks, Runs: 1,
			Scale: float32(1 / math.Sqrt(hd)), Pos: i32buf(b, d, pos), Seq: i32buf(b, d, seq), BlockTable: i32buf(b, d, table)}
		q := f32buf(b, d, randF32(r, n*kw, 1))
		out := alloc(b, d, gpu.F32, n*kw)
		flops := 4 * float64(n) * float64(n+1) / 2 * heads * hd
		b.Run(fmt.Sprintf("n%d", n), func(b *testing.B) {
			sec := graphRate(b, d, 8, 0, func() error { return repeat(8, func() error { return d.Attention(out, q, kc, vc, a) }) })
			b.ReportMetric(flops/sec/1e12, "TFLOP/s")
		})
	}
}

// BenchmarkAttentionDecode: decode tokens against an OLMo-2-1B layer's
// cache (16 heads of 128, bf16): one token at two context lengths, and a
// batch of 64 sequences, each its own blocks.
func BenchmarkAttentionDecode(b *testing.B) {
	d := open(b)
	r := rand.New(rand.NewPCG(4, 4))
	const bs = 16
	// Query heads, KV heads and head dim of OLMo-2-1B (MHA), Llama-3.2-1B,
	// Qwen3-0.6B, Qwen3-30B-A3B and the 8B GQA shapes.
	for _, h := range [][3]int{{16, 16, 128}, {32, 8, 64}, {16, 8, 128}, {32, 4, 128}, {32, 8, 128}} {
		heads, kvHeads, hd := h[0], h[1], h[2]
		for _, c := range []struct{ n, ctx int }{{1, 512}, {1, 4096}, {4, 512}, {8, 512}, {16, 512}, {64, 512}, {64, 520}} {
			if heads == kvHeads && c.n > 1 && c.n < 64 {
				continue
			}
			blocks := (c.ctx + bs - 1) / bs
			kw := kvHeads * hd
			kc := weights(b, d, gpu.BF16, gputest.Encode(gpu.BF16, randF32(r, c.n*blocks*bs*kw, 1))).(*Buffer)
			vc := weights(b, d, gpu.BF16, gputest.Encode(gpu.BF16, randF32(r, c.n*blocks*bs*kw, 1))).(*Buffer)
			kc.readOnly, vc.readOnly = false, false
			table := make([]int32, c.n*blocks)
			for i := range table {
				table[i] = int32(i)
			}
			pos, seq := make([]int32, c.n), make([]int32, c.n)
			for i := range pos {
				pos[i], seq[i] = int32(c.ctx-1), int32(i)
			}
			a := gpu.AttnArgs{N: c.n, Heads: heads, KVHeads: kvHeads, HeadDim: hd, BlockSize: bs, MaxBlocks: blocks, Runs: c.n,
				Scale: float32(1 / math.Sqrt(float64(hd))), Pos: i32buf(b, d, pos), Seq: i32buf(b, d, seq), BlockTable: i32buf(b, d, table)}
			q := f32buf(b, d, randF32(r, c.n*heads*hd, 1))
			out := alloc(b, d, gpu.F32, c.n*heads*hd)
			bytes := float64(2 * c.n * c.ctx * kw * 2)
			// The kernel Attention picks, then each other: -1 picks, 0 is the
			// tensor-core kernel, g > 0 the CUDA-core one with g query heads a
			// block.
			for _, g := range []int{-1, 0, 1, 2} {
				if g > 0 && (heads/kvHeads)%g != 0 || g == 0 && heads == kvHeads {
					continue
				}
				name := "auto"
				if g >= 0 {
					name = fmt.Sprintf("g%d", g)
				}
				b.Run(fmt.Sprintf("h%d-kv%d-hd%d/n%d-ctx%d/%s", heads, kvHeads, hd, c.n, c.ctx, name), func(b *testing.B) {
					graphRate(b, d, 8, bytes, func() error { return repeat(8, func() error { return d.attention(out, q, kc, vc, a, g) }) })
				})
			}
			for _, buf := range []gpu.Buffer{kc, vc, q, out, a.Pos, a.Seq, a.BlockTable} {
				d.Free(buf)
			}
		}
	}
}

// BenchmarkGEMM: prompt and decode-batch products, the whole MatMul (x
// rounded, the product, the sum of split parts). One graph replays the
// product over rotating weight copies that exceed the L2, so the time per
// product leaves out the graph's launch.
func BenchmarkGEMM(b *testing.B) {
	d := open(b)
	r := rand.New(rand.NewPCG(5, 5))
	// Prompt shapes (512 and 2,048 tokens) and decode batches of 64, OLMo-2-1B
	// (o, q|k|v, gate|up, down, the LM head; 64 × 2048 × 8192 has q|k|v's
	// k and splits on more SMs).
	for _, s := range [][3]int{{512, 2048, 8192}, {512, 8192, 2048}, {2048, 2048, 2048}, {2048, 2048, 8192},
		{2048, 8192, 2048}, {64, 2048, 2048}, {64, 2048, 6144}, {64, 2048, 8192}, {64, 2048, 16384}, {64, 8192, 2048},
		{64, 2048, 100352}, {32, 2048, 16384}, {16, 2048, 16384},
		{8, 2048, 16384}, {4, 2048, 16384}, {2, 2048, 16384}, {4, 8192, 2048}, {2, 8192, 2048}} {
		n, k, m := s[0], s[1], s[2]
		ws := rotating(b, d, gpu.BF16, gputest.Encode(gpu.BF16, randF32(r, m*k, 0.05)))
		x := f32buf(b, d, randF32(r, n*k, 1))
		out := alloc(b, d, gpu.F32, n*m)
		b.Run(fmt.Sprintf("%dx%dx%d", n, k, m), func(b *testing.B) {
			sec := graphRate(b, d, len(ws), float64(m*k*2), func() error {
				for _, w := range ws {
					if err := d.MatMul(out, x, w, n, k, m); err != nil {
						return err
					}
				}
				return nil
			})
			b.ReportMetric(2*float64(n*k*m)/sec/1e12, "TFLOP/s")
		})
		for _, w := range ws {
			d.Free(w)
		}
		d.Free(x)
		d.Free(out)
	}
}

// BenchmarkDecodeStepOLMo2 replays, as one graph, the operations of an
// OLMo-2-1B decode step at batch 1 (16 layers of d 2048, 16 heads of 128,
// ffn 8192, vocab 100352; bf16 weights, 2.56 GB of them, all distinct;
// bf16 KV cache at 512 tokens of context) with separate q/k/v and gate/up
// products. It is the kernels' floor for a token, not the model's code.
func BenchmarkDecodeStepOLMo2(b *testing.B) {
	d := open(b)
	r := rand.New(rand.NewPCG(6, 6))
	const layers, dim, heads, hd, ffn, vocab, bs, ctx = 16, 2048, 16, 128, 8192, 100352, 16, 512
	sq, up, down, head := gputest.Encode(gpu.BF16, randF32(r, dim*dim, 0.02)), gputest.Encode(gpu.BF16, randF32(r, ffn*dim, 0.02)),
		gputest.Encode(gpu.BF16, randF32(r, dim*ffn, 0.02)), gputest.Encode(gpu.BF16, randF32(r, vocab*dim, 0.02))
	normW := weights(b, d, gpu.BF16, gputest.Encode(gpu.BF16, randF32(r, dim, 1)))
	type layer struct{ q, k, v, o, g, u, dn, kc, vc gpu.Buffer }
	ls := make([]layer, layers)
	blocks := ctx / bs
	for i := range ls {
		ls[i] = layer{q: weights(b, d, gpu.BF16, sq), k: weights(b, d, gpu.BF16, sq), v: weights(b, d, gpu.BF16, sq),
			o: weights(b, d, gpu.BF16, sq), g: weights(b, d, gpu.BF16, up), u: weights(b, d, gpu.BF16, up),
			dn: weights(b, d, gpu.BF16, down), kc: alloc(b, d, gpu.BF16, blocks*bs*dim), vc: alloc(b, d, gpu.BF16, blocks*bs*dim)}
	}
	lm := weights(b, d, gpu.BF16, head)
	table := make([]int32, blocks)
	for i := range table {
		table[i] = int32(i)
	}
	pos, seq, bt, slot := i32buf(b, d, []int32{ctx - 1}), i32buf(b, d, []int32{0}), i32buf(b, d, table), i32buf(b, d, []int32{ctx - 1})
	ids := i32buf(b, d, []int32{7})
	invFreq := f32buf(b, d, randF32(r, hd/2, 0.01))
	buf := func(n int) gpu.Buffer { return f32buf(b, d, randF32(r, n, 1)) }
	x, h, q, k, v, att, o, gb, ub, dn := buf(dim), buf(dim), buf(dim), buf(dim), buf(dim), buf(dim), buf(dim), buf(ffn), buf(ffn), buf(dim)
	logits, next := alloc(b, d, gpu.F32, vocab), alloc(b, d, gpu.I32, 1)
	a := gpu.AttnArgs{N: 1, Heads: heads, KVHeads: heads, HeadDim: hd, BlockSize: bs, MaxBlocks: blocks,
		Scale: float32(1 / math.Sqrt(hd)), Pos: pos, Seq: seq, BlockTable: bt}
	step := func() error {
		ops := []func() error{func() error { return d.Embed(x, lm, ids, 1, dim) }}
		for _, l := range ls {
			ops = append(ops,
				func() error { return d.MatMul(q, x, l.q, 1, dim, dim) },
				func() error { return d.MatMul(k, x, l.k, 1, dim, dim) },
				func() error { return d.MatMul(v, x, l.v, 1, dim, dim) },
				func() error { return d.RMSNorm(q, q, normW, 1, dim, 1e-6) },
				func() error { return d.RMSNorm(k, k, normW, 1, dim, 1e-6) },
				func() error { return d.RoPE(q, pos, invFreq, 1, heads, hd) },
				func() error { return d.RoPE(k, pos, invFreq, 1, heads, hd) },
				func() error { return d.StoreKV(l.kc, l.vc, k, v, slot, 1, dim) },
				func() error { return d.Attention(att, q, l.kc, l.vc, a) },
				func() error { return d.MatMul(o, att, l.o, 1, dim, dim) },
				func() error { return d.RMSNormAdd(x, o, normW, 1, dim, 1e-6) },
				func() error { return d.MatMul(gb, x, l.g, 1, dim, ffn) },
				func() error { return d.MatMul(ub, x, l.u, 1, dim, ffn) },
				func() error { return d.SiLUMul(gb, gb, ub, ffn) },
				func() error { return d.MatMul(dn, gb, l.dn, 1, ffn, dim) },
				func() error { return d.RMSNormAdd(x, dn, normW, 1, dim, 1e-6) },
			)
		}
		ops = append(ops,
			func() error { return d.RMSNorm(h, x, normW, 1, dim, 1e-6) },
			func() error { return d.MatMul(logits, h, lm, 1, dim, vocab) },
			func() error { return d.Argmax(next, logits, 1, vocab) })
		for _, op := range ops {
			if err := op(); err != nil {
				return err
			}
		}
		return nil
	}
	g, err := d.Capture(step)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	nodes := g.(*Graph).Nodes()
	if err := g.Launch(); err != nil {
		b.Fatal(err)
	}
	b.Run("device", func(b *testing.B) {
		el, err := d.Elapsed(func() error {
			for b.Loop() {
				if err := g.Launch(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		sec := el.Seconds() / float64(b.N)
		b.ReportMetric(sec*1e6, "us/token")
		b.ReportMetric(1/sec, "tok/s")
		b.ReportMetric(float64(nodes), "nodes")
	})
	// With the host in the loop: write the token's indices, launch, read the
	// argmax back.
	b.Run("host-loop", func(b *testing.B) {
		tok := make([]int32, 1)
		for b.Loop() {
			if err := d.Write(ids, 0, gpu.I32Bytes(tok)); err != nil {
				b.Fatal(err)
			}
			if err := g.Launch(); err != nil {
				b.Fatal(err)
			}
			if err := d.Read(gpu.I32Bytes(tok), next, 0); err != nil {
				b.Fatal(err)
			}
			tok[0] = tok[0] % 1000
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
	})
}

// BenchmarkSample: device-side draws from rows of 100,352 logits (one row
// and a decode batch of 64): greedy, unfiltered and top-k 50 at
// temperature 0.8 over normal logits of deviation 3, and whole-row draws:
// top-p 0.9 over the same rows (it keeps hundreds of tokens), over flat
// rows (deviation 1: it keeps about 51,000, min-p 0.05 about 3,000) and
// over peaked ones (40 tokens 12 above the rest).
func BenchmarkSample(b *testing.B) {
	d := open(b)
	r := rand.New(rand.NewPCG(6, 6))
	const width = 100352
	for _, n := range []int{1, 64} {
		normal := randF32(r, n*width, 3)
		peaked := slices.Clone(normal)
		for i := range n {
			for j := range 40 {
				peaked[i*width+(j*7919+17)%width] += 12
			}
		}
		logits, flat, peak := f32buf(b, d, normal), f32buf(b, d, randF32(r, n*width, 1)), f32buf(b, d, peaked)
		out := alloc(b, d, gpu.I32, n)
		for _, k := range []struct {
			name   string
			row    gpu.SampleRow
			logits gpu.Buffer
		}{{"greedy", gpu.SampleRow{}, logits}, {"plain", gpu.SampleRow{Temperature: 0.8}, logits},
			{"topk50", gpu.SampleRow{Temperature: 0.8, TopK: 50}, logits},
			{"topp0.9", gpu.SampleRow{Temperature: 0.8, TopP: 0.9}, logits},
			{"topp0.9-flat", gpu.SampleRow{Temperature: 0.8, TopP: 0.9}, flat},
			{"minp0.05-flat", gpu.SampleRow{Temperature: 0.8, MinP: 0.05}, flat},
			{"topp0.9-peaked", gpu.SampleRow{Temperature: 0.8, TopP: 0.9}, peak}} {
			rows := make([]gpu.SampleRow, n)
			for i := range rows {
				rows[i] = k.row
				rows[i].U = r.Float64()
			}
			b.Run(fmt.Sprintf("n%d/%s", n, k.name), func(b *testing.B) {
				graphRate(b, d, 8, 0, func() error { return repeat(8, func() error { return d.Sample(out, k.logits, n, width, rows) }) })
			})
		}
		d.Free(logits)
		d.Free(flat)
		d.Free(peak)
		d.Free(out)
	}
}
