package cpu

import (
	"fmt"
	"math"

	"github.com/troupe/troupe/gpu"
)

// attnGrain is the least attention work (keys × head dim, summed over the
// query heads) worth spreading over the pool.
const attnGrain = 16 << 10

// Attention implements gpu.Ops: paged, grouped-query attention with an
// online softmax, one pass over the cache per (token, head), block by
// block. Work is split over (token, head) pairs.
func (d *Device) Attention(out, q, kc, vc gpu.Buffer, a gpu.AttnArgs) error {
	const op = "attention"
	b, err := d.args(op, out, q, kc, vc, a.Pos, a.Seq, a.BlockTable)
	if err != nil {
		return err
	}
	if a.N < 0 || a.Heads <= 0 || a.KVHeads <= 0 || a.Heads%a.KVHeads != 0 || a.HeadDim <= 0 || a.BlockSize <= 0 || a.MaxBlocks <= 0 {
		return fmt.Errorf("%s: invalid shape %+v", op, a)
	}
	qw, kw := a.Heads*a.HeadDim, a.KVHeads*a.HeadDim
	o, err := f32(op, "out", b[0], a.N*qw)
	if err != nil {
		return err
	}
	qv, err := f32(op, "q", b[1], a.N*qw)
	if err != nil {
		return err
	}
	kcm, err := matOf(op, "k cache", b[2], 0)
	if err != nil {
		return err
	}
	vcm, err := matOf(op, "v cache", b[3], 0)
	if err != nil {
		return err
	}
	pos, err := i32(op, "pos", b[4], a.N)
	if err != nil {
		return err
	}
	seq, err := i32(op, "seq", b[5], a.N)
	if err != nil {
		return err
	}
	bt, err := i32(op, "block table", b[6], 0)
	if err != nil {
		return err
	}
	slots := min(b[2].Len(), b[3].Len()) / kw
	work := 0
	for t := range a.N {
		p, s := int(pos[t]), int(seq[t])
		if p < 0 || p >= a.MaxBlocks*a.BlockSize || s < 0 || (s+1)*a.MaxBlocks > len(bt) {
			return fmt.Errorf("%s: token %d at position %d of sequence %d outside the block table", op, t, p, s)
		}
		for j := 0; j <= p/a.BlockSize; j++ {
			blk := int(bt[s*a.MaxBlocks+j])
			if blk < 0 || (blk+1)*a.BlockSize > slots {
				return fmt.Errorf("%s: block %d of sequence %d outside the cache", op, blk, s)
			}
		}
		work += (p + 1) * qw
	}
	units := a.N * a.Heads
	grain := units
	if work >= attnGrain {
		grain = 1
	}
	d.pool.For(units, grain, func(tid, lo, hi int) {
		run := max(a.BlockSize, attnRun)
		s := d.scratch[tid].get(run + 2*a.HeadDim + run*a.HeadDim)
		sc := attnScratch{
			scores: s[:run],
			acc:    s[run : run+a.HeadDim],
			q:      s[run+a.HeadDim : run+2*a.HeadDim],
			v:      s[run+2*a.HeadDim:],
		}
		for u := lo; u < hi; u++ {
			// Head-major order keeps one head's keys and values in the
			// cache while a thread works through the tokens.
			h, t := u/a.N, u%a.N
			d.attendOne(o[t*qw+h*a.HeadDim:][:a.HeadDim], qv[t*qw+h*a.HeadDim:][:a.HeadDim],
				kcm, vcm, bt[int(seq[t])*a.MaxBlocks:][:a.MaxBlocks], int(pos[t]), h/(a.Heads/a.KVHeads), kw, a, sc)
		}
	})
	return nil
}

// attnRun is the most positions attendOne scores at once when the blocks
// holding them are adjacent in the cache.
const attnRun = 64

type attnScratch struct {
	scores []float32 // [max(BlockSize, attnRun)]
	acc    []float32 // [HeadDim]
	q      []float32 // [HeadDim], the query times Scale
	v      []float32 // [len(scores)*HeadDim], values widened from F16
}

// attendOne computes one head of one token: out = softmax(q·Kᵀ·scale)·V over
// positions 0..p, a cache block at a time with a running max and sum.
func (d *Device) attendOne(out, q []float32, kc, vc mat, table []int32, p, kh, kw int, a gpu.AttnArgs, sc attnScratch) {
	hd, bs := a.HeadDim, a.BlockSize
	acc := sc.acc
	clear(acc)
	qs := sc.q
	for i, v := range q {
		qs[i] = v * a.Scale
	}
	mx := float32(math.Inf(-1))
	var sum float32
	for j := 0; j*bs <= p; {
		// A run of blocks adjacent in the cache is one strided matrix.
		nb := 1
		for (nb+1)*bs <= len(sc.scores) && (j+nb)*bs <= p && table[j+nb] == table[j]+int32(nb) {
			nb++
		}
		cnt := min(nb*bs, p+1-j*bs)
		base := int(table[j])*bs*kw + kh*hd
		j += nb
		scores := sc.scores[:cnt]
		kc.gemvStrided(d.k, scores, qs, base, kw, hd)
		bm := float32(math.Inf(-1))
		for _, s := range scores {
			bm = max(bm, s)
		}
		if bm > mx {
			if sum != 0 {
				c := expf(mx - bm)
				sum *= c
				for i := range acc {
					acc[i] *= c
				}
			}
			mx = bm
		}
		sum += d.k.expShift(scores, mx)
		switch vc.dt {
		case gpu.F32:
			d.k.accum(acc, vc.f[base:], kw, scores)
		case gpu.BF16:
			d.k.accumBF16(acc, vc.h[base:], kw, scores)
		default:
			for i := range cnt {
				vc.row(d.k, sc.v[i*hd:(i+1)*hd], base+i*kw)
			}
			d.k.accum(acc, sc.v, hd, scores)
		}
	}
	inv := 1 / sum
	for i, v := range acc {
		out[i] = v * inv
	}
}

// gemvStrided sets out[r] = x · w[off+r*stride:][:k] for r < len(out).
func (w mat) gemvStrided(k *kernels, out, x []float32, off, stride, kdim int) {
	switch w.dt {
	case gpu.F32:
		k.gemvF32(out, x, w.f[off:], stride, len(out), kdim)
	case gpu.BF16:
		k.gemvBF16(out, x, w.h[off:], stride, len(out), kdim)
	case gpu.F16:
		k.gemvF16(out, x, w.h[off:], stride, len(out), kdim)
	}
}
