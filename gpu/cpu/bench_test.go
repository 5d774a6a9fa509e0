package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
)

// The demo model: OLMo 2 with hidden 384, 6 heads of 64, SwiGLU 1024,
// vocabulary 8192, 8 layers, bf16 weights.
const (
	demoDim    = 384
	demoHeads  = 6
	demoHD     = 64
	demoInter  = 1024
	demoVocab  = 8192
	demoLayers = 8
)

func bfWeights(b testing.TB, d *Device, rng *rand.Rand, n int) gpu.Buffer {
	return weights16(b, d, rng, gpu.BF16, n)
}

// weights16 is n random weights of the 16-bit type dt.
func weights16(b testing.TB, d *Device, rng *rand.Rand, dt gpu.DType, n int) gpu.Buffer {
	b.Helper()
	w, err := d.Weights(dt, gpu.U16Bytes(randU16(rng, n, dt)))
	if err != nil {
		b.Fatal(err)
	}
	return w
}

func f32Buf(b testing.TB, d *Device, v []float32) gpu.Buffer {
	b.Helper()
	buf, err := d.Alloc(gpu.F32, len(v))
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Write(buf, 0, gpu.F32Bytes(v)); err != nil {
		b.Fatal(err)
	}
	return buf
}

func benchThreads() []int { return []int{1, 0} }

func threadsName(d *Device) string { return fmt.Sprintf("threads=%d", d.Threads()) }

// BenchmarkMemRead measures the read bandwidth of this machine: a
// vectorized sum over 1 GiB, split over the threads.
func BenchmarkMemRead(b *testing.B) {
	for _, threads := range benchThreads() {
		d := open(b, fastKernels(), threads)
		b.Run(threadsName(d), func(b *testing.B) {
			buf := make([]float32, 1<<28)
			for i := range buf {
				buf[i] = 1
			}
			var sums [maxThreads]float32
			b.SetBytes(int64(len(buf)) * 4)
			b.ReportAllocs()
			const chunk = 1 << 16
			for b.Loop() {
				d.pool.For(len(buf)/chunk, 1, func(tid, lo, hi int) {
					sums[tid] += d.k.sum(buf[lo*chunk : hi*chunk])
				})
			}
			b.ReportMetric(float64(len(buf))*4*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}

// BenchmarkGEMV times MatMul with n=1 over bf16 weights: the demo model's
// decode shapes, which sit in the caches, and 8192x4096 (64 MiB), which
// does not. GB/s counts the weight bytes.
func BenchmarkGEMV(b *testing.B) {
	shapes := [][2]int{{384, 384}, {384, 1024}, {1024, 384}, {384, 8192}, {4096, 8192}}
	for _, threads := range benchThreads() {
		d := open(b, fastKernels(), threads)
		for _, s := range shapes {
			k, m := s[0], s[1]
			b.Run(fmt.Sprintf("%s/k=%d/m=%d", threadsName(d), k, m), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 1))
				w := bfWeights(b, d, rng, m*k)
				x := f32Buf(b, d, randF32(rng, k))
				out, _ := d.Alloc(gpu.F32, m)
				b.SetBytes(int64(m * k * 2))
				b.ReportAllocs()
				for b.Loop() {
					if err := d.MatMul(out, x, w, 1, k, m); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(m*k*2)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}

// BenchmarkFewRows times the products of a decode step of a few
// sequences: n rows of x against 64 MiB of 16-bit weights (128 MiB of
// f32), beyond the caches, so each call streams them from memory.
func BenchmarkFewRows(b *testing.B) {
	const k, m = 4096, 8192
	for _, threads := range benchThreads() {
		d := open(b, fastKernels(), threads)
		for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
			for _, n := range []int{1, 4, 8, 16} {
				b.Run(fmt.Sprintf("%s/%s/n=%d", threadsName(d), dt, n), func(b *testing.B) {
					rng := rand.New(rand.NewPCG(1, 1))
					var w gpu.Buffer
					if dt == gpu.F32 {
						w = f32Buf(b, d, randF32(rng, m*k))
					} else {
						w = weights16(b, d, rng, dt, m*k)
					}
					x := f32Buf(b, d, randF32(rng, n*k))
					out, _ := d.Alloc(gpu.F32, n*m)
					for b.Loop() {
						if err := d.MatMul(out, x, w, n, k, m); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(m*k*dt.Size())*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// BenchmarkGEMVChain times batch-1 GEMVs over a chain of distinct small
// matrices (k=384, m=1024, 768 KiB each, 96 MiB in all), as a decode step
// streams its layers: each matrix is read once per pass, from memory, and
// every call starts new streams.
func BenchmarkGEMVChain(b *testing.B) {
	const k, m, n = 384, 1024, 128
	for _, threads := range benchThreads() {
		d := open(b, fastKernels(), threads)
		b.Run(threadsName(d), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 1))
			ws := make([]gpu.Buffer, n)
			for i := range ws {
				ws[i] = bfWeights(b, d, rng, m*k)
			}
			x := f32Buf(b, d, randF32(rng, k))
			out, _ := d.Alloc(gpu.F32, m)
			b.SetBytes(int64(n * m * k * 2))
			for b.Loop() {
				for _, w := range ws {
					if err := d.MatMul(out, x, w, 1, k, m); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(n*m*k*2)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}

// asmLanes are the kernel sets the products' benchmarks compare: the
// assembly ones this processor runs, or the portable one.
func asmLanes() []*kernels {
	if ks := asmKernels(); len(ks) > 0 {
		return ks
	}
	return []*kernels{genericKernels}
}

// BenchmarkGEMM times MatMul at the demo model's prefill shapes (n=512).
func BenchmarkGEMM(b *testing.B) {
	const n = 512
	shapes := [][2]int{{384, 384}, {384, 1024}, {1024, 384}, {384, 8192}}
	for _, threads := range benchThreads() {
		for _, lane := range asmLanes() {
			d := open(b, lane, threads)
			for _, dt := range []gpu.DType{gpu.BF16, gpu.F32} {
				for _, s := range shapes {
					k, m := s[0], s[1]
					b.Run(fmt.Sprintf("%s/%s/%s/n=%d/k=%d/m=%d", lane.name, threadsName(d), dt, n, k, m), func(b *testing.B) {
						rng := rand.New(rand.NewPCG(1, 1))
						var w gpu.Buffer
						if dt == gpu.BF16 {
							w = bfWeights(b, d, rng, m*k)
						} else {
							w = f32Buf(b, d, randF32(rng, m*k))
						}
						x := f32Buf(b, d, randF32(rng, n*k))
						out, _ := d.Alloc(gpu.F32, n*m)
						b.ReportAllocs()
						for b.Loop() {
							if err := d.MatMul(out, x, w, n, k, m); err != nil {
								b.Fatal(err)
							}
						}
						b.ReportMetric(2*float64(n*k*m)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
					})
				}
			}
		}
	}
}

// BenchmarkDispatch times a parallel-for whose ranges do nothing.
func BenchmarkDispatch(b *testing.B) {
	d := open(b, fastKernels(), 0)
	var sink [maxThreads]int
	b.ReportAllocs()
	for b.Loop() {
		d.pool.For(d.Threads(), 1, func(tid, lo, hi int) { sink[tid] += hi - lo })
	}
}

// demoModel holds the buffers of a forward pass through the demo model's
// operations (random weights), n tokens at a time, the last at position
// ctx-1 of one sequence.
type demoModel struct {
	d                                    *Device
	n                                    int
	embed, finalNorm                     gpu.Buffer
	attnNorm, qn, kn, mlpNorm            []gpu.Buffer
	wq, wk, wv, wo, gate, up, down       []gpu.Buffer
	kc, vc                               []gpu.Buffer
	ids, pos, seq, slots, table, invFreq gpu.Buffer
	x, h, q, k, v, att, o, g, u, logits  gpu.Buffer
	next                                 gpu.Buffer
	blockSize, maxBlocks                 int
}

func newDemoModel(b testing.TB, d *Device, n, ctx int, cache gpu.DType) *demoModel {
	rng := rand.New(rand.NewPCG(7, 8))
	m := &demoModel{d: d, n: n, blockSize: 16}
	m.maxBlocks = (ctx + m.blockSize - 1) / m.blockSize
	m.embed = bfWeights(b, d, rng, demoVocab*demoDim)
	ones := func() gpu.Buffer {
		v := make([]uint16, demoDim)
		for i := range v {
			v[i] = gpu.F32ToBF16(1 + 0.1*float32(rng.NormFloat64()))
		}
		w, _ := d.Weights(gpu.BF16, gpu.U16Bytes(v))
		return w
	}
	m.finalNorm = ones()
	for range demoLayers {
		m.attnNorm = append(m.attnNorm, ones())
		m.qn = append(m.qn, ones())
		m.kn = append(m.kn, ones())
		m.mlpNorm = append(m.mlpNorm, ones())
		m.wq = append(m.wq, bfWeights(b, d, rng, demoDim*demoDim))
		m.wk = append(m.wk, bfWeights(b, d, rng, demoDim*demoDim))
		m.wv = append(m.wv, bfWeights(b, d, rng, demoDim*demoDim))
		m.wo = append(m.wo, bfWeights(b, d, rng, demoDim*demoDim))
		m.gate = append(m.gate, bfWeights(b, d, rng, demoInter*demoDim))
		m.up = append(m.up, bfWeights(b, d, rng, demoInter*demoDim))
		m.down = append(m.down, bfWeights(b, d, rng, demoDim*demoInter))
		kc, _ := d.Alloc(cache, m.maxBlocks*m.blockSize*demoDim)
		vc, _ := d.Alloc(cache, m.maxBlocks*m.blockSize*demoDim)
		m.kc, m.vc = append(m.kc, kc), append(m.vc, vc)
	}
	ids, pos, seq, slots := make([]int32, n), make([]int32, n), make([]int32, n), make([]int32, n)
	for t := range n {
		ids[t] = int32(rng.IntN(demoVocab))
		pos[t] = int32(ctx - n + t)
		slots[t] = pos[t]
	}
	table := make([]int32, m.maxBlocks)
	for i := range table {
		table[i] = int32(i)
	}
	i32Buf := func(v []int32) gpu.Buffer {
		buf, _ := d.Alloc(gpu.I32, len(v))
		if err := d.Write(buf, 0, gpu.I32Bytes(v)); err != nil {
			b.Fatal(err)
		}
		return buf
	}
	m.ids, m.pos, m.seq, m.slots, m.table = i32Buf(ids), i32Buf(pos), i32Buf(seq), i32Buf(slots), i32Buf(table)
	m.invFreq = f32Buf(b, d, gputest.InvFreq(demoHD, 500000))
	alloc := func(w int) gpu.Buffer { buf, _ := d.Alloc(gpu.F32, n*w); return buf }
	m.x, m.h, m.q, m.k, m.v, m.att, m.o = alloc(demoDim), alloc(demoDim), alloc(demoDim), alloc(demoDim), alloc(demoDim), alloc(demoDim), alloc(demoDim)
	m.g, m.u = alloc(demoInter), alloc(demoInter)
	m.logits, _ = d.Alloc(gpu.F32, demoVocab)
	m.next, _ = d.Alloc(gpu.I32, 1)
	return m
}

// forward runs the ops of one step; logits only for the last token.
func (m *demoModel) forward() error {
	d, n := m.d, m.n
	const eps = 1e-6
	ops := []func() error{func() error { return d.Embed(m.x, m.embed, m.ids, n, demoDim) }}
	for l := range demoLayers {
		ops = append(ops,
			func() error { return d.MatMul(m.q, m.x, m.wq[l], n, demoDim, demoDim) },
			func() error { return d.MatMul(m.k, m.x, m.wk[l], n, demoDim, demoDim) },
			func() error { return d.MatMul(m.v, m.x, m.wv[l], n, demoDim, demoDim) },
			func() error { return d.RMSNorm(m.q, m.q, m.qn[l], n, demoDim, eps) },
			func() error { return d.RMSNorm(m.k, m.k, m.kn[l], n, demoDim, eps) },
			func() error { return d.RoPE(m.q, m.pos, m.invFreq, n, demoHeads, demoHD) },
			func() error { return d.RoPE(m.k, m.pos, m.invFreq, n, demoHeads, demoHD) },
			func() error { return d.StoreKV(m.kc[l], m.vc[l], m.k, m.v, m.slots, n, demoDim) },
			func() error {
				return d.Attention(m.att, m.q, m.kc[l], m.vc[l], gpu.AttnArgs{
					N: n, Heads: demoHeads, KVHeads: demoHeads, HeadDim: demoHD, BlockSize: m.blockSize,
					MaxBlocks: m.maxBlocks, Scale: float32(1 / math.Sqrt(demoHD)), Pos: m.pos, Seq: m.seq, BlockTable: m.table})
			},
			func() error { return d.MatMul(m.o, m.att, m.wo[l], n, demoDim, demoDim) },
			func() error { return d.RMSNorm(m.o, m.o, m.attnNorm[l], n, demoDim, eps) },
			func() error { return d.Add(m.x, m.x, m.o, n*demoDim) },
			func() error { return d.MatMul(m.g, m.x, m.gate[l], n, demoDim, demoInter) },
			func() error { return d.MatMul(m.u, m.x, m.up[l], n, demoDim, demoInter) },
			func() error { return d.SiLUMul(m.g, m.g, m.u, n*demoInter) },
			func() error { return d.MatMul(m.o, m.g, m.down[l], n, demoInter, demoDim) },
			func() error { return d.RMSNorm(m.o, m.o, m.mlpNorm[l], n, demoDim, eps) },
			func() error { return d.Add(m.x, m.x, m.o, n*demoDim) },
		)
	}
	ops = append(ops,
		func() error { return d.RMSNorm(m.h, m.x, m.finalNorm, n, demoDim, eps) },
		func() error {
			last, _ := d.Alloc(gpu.F32, demoDim)
			row := make([]float32, demoDim)
			if err := d.Read(gpu.F32Bytes(row), m.h, (n-1)*demoDim); err != nil {
				return err
			}
			if err := d.Write(last, 0, gpu.F32Bytes(row)); err != nil {
				return err
			}
			return d.MatMul(m.logits, last, m.embed, 1, demoDim, demoVocab)
		},
		func() error { return d.Argmax(m.next, m.logits, 1, demoVocab) },
	)
	for _, op := range ops {
		if err := op(); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkDemoDecode runs the ops of one decode step of the demo model at
// position 255 (about 66 operations); tok/s is the rate the operations
// alone allow.
func BenchmarkDemoDecode(b *testing.B) {
	for _, threads := range benchThreads() {
		for _, lane := range asmLanes() {
			d := open(b, lane, threads)
			for _, cache := range []gpu.DType{gpu.BF16, gpu.F32} {
				b.Run(fmt.Sprintf("%s/%s/cache=%s", lane.name, threadsName(d), cache), func(b *testing.B) {
					m := newDemoModel(b, d, 1, 256, cache)
					b.ReportAllocs()
					for b.Loop() {
						if err := m.forward(); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
				})
			}
		}
	}
}

// BenchmarkDemoPrefill runs the ops of a 512-token prefill of the demo
// model (logits for the last token only).
func BenchmarkDemoPrefill(b *testing.B) {
	const n = 512
	for _, threads := range benchThreads() {
		for _, lane := range asmLanes() {
			d := open(b, lane, threads)
			b.Run(fmt.Sprintf("%s/%s/cache=bf16", lane.name, threadsName(d)), func(b *testing.B) {
				m := newDemoModel(b, d, n, n, gpu.BF16)
				b.ReportAllocs()
				for b.Loop() {
					if err := m.forward(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(n*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}

// BenchmarkAttention times the attention of the demo model's shapes with a
// bf16 cache: a 512-token prefill and one decode token at position 511.
func BenchmarkAttention(b *testing.B) {
	for _, threads := range benchThreads() {
		d := open(b, fastKernels(), threads)
		for _, n := range []int{512, 1} {
			b.Run(fmt.Sprintf("%s/n=%d", threadsName(d), n), func(b *testing.B) {
				m := newDemoModel(b, d, n, 512, gpu.BF16)
				if err := m.forward(); err != nil { // fill the caches
					b.Fatal(err)
				}
				args := gpu.AttnArgs{N: n, Heads: demoHeads, KVHeads: demoHeads, HeadDim: demoHD, BlockSize: m.blockSize,
					MaxBlocks: m.maxBlocks, Scale: float32(1 / math.Sqrt(demoHD)), Pos: m.pos, Seq: m.seq, BlockTable: m.table}
				b.ReportAllocs()
				for b.Loop() {
					if err := d.Attention(m.att, m.q, m.kc[0], m.vc[0], args); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
