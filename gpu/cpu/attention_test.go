package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/gpu/ref"
)

// TestAttentionRuns covers long contexts whose blocks lie next to each
// other in the cache (scored as one run), with a break in the middle, for
// prefill and decode tokens, against the float64 reference.
func TestAttentionRuns(t *testing.T) {
	const (
		heads, kvHeads, hd, bs = 4, 2, 64, 8
		ctx                    = 203
	)
	rng := rand.New(rand.NewPCG(9, 10))
	maxBlocks := (ctx + bs - 1) / bs
	// Blocks 0..k-1 in order, then a jump, then in order again.
	table := make([]int32, maxBlocks)
	for i := range table {
		table[i] = int32(i)
		if i >= maxBlocks/2 {
			table[i] = int32(i + 3)
		}
	}
	nblocks := maxBlocks + 3
	kw := kvHeads * hd
	var slots []int32
	for p := range ctx {
		slots = append(slots, table[p/bs]*bs+int32(p%bs))
	}
	k, v := randF32(rng, ctx*kw), randF32(rng, ctx*kw)
	// np-1 prefill tokens at the end, then a decode of the full context:
	// one token at a time, tiles of one or two groups, several tiles.
	for _, np := range []int{2, 5, 8, 40} {
		var pos, seq []int32
		for p := ctx - np; p < ctx-1; p++ {
			pos, seq = append(pos, int32(p)), append(seq, 0)
		}
		pos, seq = append(pos, ctx-1), append(seq, 0)
		n := len(pos)
		q := randF32(rng, n*heads*hd)
		for _, kern := range lanes() {
			for _, cache := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
				t.Run(fmt.Sprintf("n=%d/%s/%s", n, kern.name, cache), func(t *testing.T) {
					d := open(t, kern, 2)
					r := ref.New()
					var outs [2][]float32
					for i, dev := range []gpu.Device{d, r} {
						buf := func(dt gpu.DType, raw []byte, n int) gpu.Buffer { return devBuf(t, dev, dt, raw, n) }
						kc, vc := buf(cache, nil, nblocks*bs*kw), buf(cache, nil, nblocks*bs*kw)
						kb, vb := buf(gpu.F32, gpu.F32Bytes(k), len(k)), buf(gpu.F32, gpu.F32Bytes(v), len(v))
						if err := dev.StoreKV(kc, vc, kb, vb, buf(gpu.I32, gpu.I32Bytes(slots), ctx), ctx, kw); err != nil {
							t.Fatal(err)
						}
						out := buf(gpu.F32, nil, n*heads*hd)
						a := gpu.AttnArgs{N: n, Heads: heads, KVHeads: kvHeads, HeadDim: hd, BlockSize: bs, MaxBlocks: maxBlocks,
							Scale: float32(1 / math.Sqrt(hd)), Pos: buf(gpu.I32, gpu.I32Bytes(pos), n), Seq: buf(gpu.I32, gpu.I32Bytes(seq), n),
							BlockTable: buf(gpu.I32, gpu.I32Bytes(table), maxBlocks)}
						if err := dev.Attention(out, buf(gpu.F32, gpu.F32Bytes(q), len(q)), kc, vc, a); err != nil {
							t.Fatal(err)
						}
						outs[i] = make([]float32, n*heads*hd)
						if err := dev.Read(gpu.F32Bytes(outs[i]), out, 0); err != nil {
							t.Fatal(err)
						}
					}
					if e := gputest.RelL2(outs[0], outs[1]); e > 1e-5 {
						t.Errorf("relative L2 error %.3g, want <= 1e-5", e)
					}
				})
			}
		}
	}
}

// devBuf allocates n elements of dt on dev, filled with raw unless nil.
func devBuf(t testing.TB, dev gpu.Device, dt gpu.DType, raw []byte, n int) gpu.Buffer {
	t.Helper()
	b, err := dev.Alloc(dt, n)
	if err != nil {
		t.Fatal(err)
	}
	if raw != nil {
		if err := dev.Write(b, 0, raw); err != nil {
			t.Fatal(err)
		}
	}
	return b
}
