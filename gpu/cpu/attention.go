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
// online softmax. With three or more tokens, consecutive tokens of one
// sequence are taken together in tiles and work is split over (KV head,
// tile) pairs (attendTiles): a tile whose (token, query head) lanes fill at
// least half a unit goes through the cache in blocks (attendFlash),
// a smaller one head by head. Fewer tokens (decode) take one pass per
// (token, head) pair (attendOne).
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
	if a.N >= attnTileMin {
		d.attendTiles(o, qv, kcm, vcm, pos, seq, bt, kw, work, a)
		return nil
	}
	units := a.N * a.Heads
	grain := units
	if work >= attnGrain {
		grain = 1
	}
	d.pool.For(units, grain, func(tid, lo, hi int) {
		run := max(a.BlockSize, attnRun)
		s := d.scratch[tid].get(run + 2*a.HeadDim)
		sc := attnScratch{
			scores: s[:run],
			acc:    s[run : run+a.HeadDim],
			q:      s[run+a.HeadDim : run+2*a.HeadDim],
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

// Tiling of attention over many tokens.
const (
	// attnTile is the most tokens of one sequence that attendTile takes
	// through each run of keys; a multiple of 6, so that a tile splits
	// into the triples that score keys and the pairs that sum values.
	attnTile = 24
	// attnTileMin is the fewest tokens in a call, and in a tile, worth
	// the tiled path; fewer (decode) take attendOne token by token.
	attnTileMin = 3
)

// tileScratch is one thread's workspace for attendTile.
type tileScratch struct {
	s   []float32 // [attnTile][run] scores, then probabilities
	kf  []float32 // [run][HeadDim] keys widened from BF16
	vf  []float32 // [run][HeadDim] values widened from BF16
	q   []float32 // [attnTile][HeadDim] queries times Scale
	acc []float32 // [attnTile][HeadDim] value sums
	mx  []float32 // [attnTile] running maxima
	sum []float32 // [attnTile] running sums of exponentials
}

// attendTiles runs attention over tiles of consecutive tokens of one
// sequence, one (KV head, tile) pair per unit of work. A tile holds as many
// tokens as make flashLanes lanes (a lane per token and query head of the
// KV head's group); one of flashMinLanes lanes or more goes through
// attendFlash, a smaller one (the end of a sequence, a few decode tokens)
// head by head through attendTile or attendOne. Units go out KV head by KV
// head, each head's tiles in the order first, last, second, second to last,
// ..., so that any run of units holds about as much causal work as any
// other of its length and the threads finish together.
func (d *Device) attendTiles(o, qv []float32, kc, vc mat, pos, seq, bt []int32, kw, work int, a gpu.AttnArgs) {
	group := a.Heads / a.KVHeads
	per := max(1, flashLanes/group)
	tiles := d.tiles[:0]
	for t := 0; t < a.N; {
		e := t + 1
		for e < a.N && e-t < per && seq[e] == seq[t] {
			e++
		}
		tiles = append(tiles, int32(t))
		t = e
	}
	tiles = append(tiles, int32(a.N))
	d.tiles = tiles
	d.widenKV(kc, vc, pos, seq, bt, kw, group, a)
	nt := len(tiles) - 1
	units := nt * a.KVHeads
	grain := units
	if work >= attnGrain {
		grain = 1
	}
	hd, qw := a.HeadDim, a.Heads*a.HeadDim
	d.pool.For(units, grain, func(tid, lo, hi int) {
		fl := flashScratchLen(hd)
		s := d.scratch[tid].get(fl + tileScratchLen(a))
		fs, ts := newFlashScratch(s[:fl], hd), newTileScratch(s[fl:], a)
		for u := lo; u < hi; u++ {
			kh, i := u/nt, u%nt
			if i%2 == 0 {
				i /= 2
			} else {
				i = nt - 1 - i/2
			}
			t0, t1 := int(tiles[i]), int(tiles[i+1])
			table := bt[int(seq[t0])*a.MaxBlocks:][:a.MaxBlocks]
			if lanes := (t1 - t0) * group; lanes >= flashMinLanes {
				kwide, vwide := d.spanRows(int(d.tileSpan[i]), kh, hd)
				for l0 := 0; l0 < lanes; l0 += flashLanes {
					d.attendFlash(o[t0*qw:], qv[t0*qw:], kc, vc, kwide, vwide, table, pos[t0:t1], kh, group, l0, min(l0+flashLanes, lanes), kw, a, &fs)
				}
				continue
			}
			for h := kh * group; h < (kh+1)*group; h++ {
				if t1-t0 >= attnTileMin && kc.dt == vc.dt {
					d.attendTile(o[t0*qw+h*hd:], qv[t0*qw+h*hd:], kc, vc, table, pos[t0:t1], kh, kw, a, ts)
					continue
				}
				one := attnScratch{scores: ts.s[:len(ts.s)/attnTile], acc: ts.acc[:hd], q: ts.q[:hd]}
				for t := t0; t < t1; t++ {
					d.attendOne(o[t*qw+h*hd:][:hd], qv[t*qw+h*hd:][:hd], kc, vc, table, int(pos[t]), kh, kw, a, one)
				}
			}
		}
	})
}

// tileScratchLen is how many floats a tileScratch for a takes.
func tileScratchLen(a gpu.AttnArgs) int {
	run := max(a.BlockSize, attnRun)
	return attnTile*(run+2*a.HeadDim+2) + 2*run*a.HeadDim
}

// newTileScratch carves a tileScratch for a out of buf, which holds
// tileScratchLen(a) floats.
func newTileScratch(s []float32, a gpu.AttnArgs) tileScratch {
	run, hd := max(a.BlockSize, attnRun), a.HeadDim
	sc := tileScratch{s: s[:attnTile*run]}
	s = s[attnTile*run:]
	sc.kf, sc.vf, s = s[:run*hd], s[run*hd:2*run*hd], s[2*run*hd:]
	sc.q, sc.acc, s = s[:attnTile*hd], s[attnTile*hd:2*attnTile*hd], s[2*attnTile*hd:]
	sc.mx, sc.sum = s[:attnTile], s[attnTile:2*attnTile]
	return sc
}

// attendTile computes one head of len(pos) tokens of one sequence: o and q
// start at the first token's head and step by Heads*HeadDim. Each run of
// adjacent cache blocks is scored for three tokens at a time and its values
// summed for two at a time, so that each key and value row is read (and
// widened) once per group rather than once per token; a token takes only
// the keys at or before its position, and runs past the last token's
// position are never read.
func (d *Device) attendTile(o, q []float32, kc, vc mat, table, pos []int32, kh, kw int, a gpu.AttnArgs, sc tileScratch) {
	hd, bs, qw := a.HeadDim, a.BlockSize, a.Heads*a.HeadDim
	n := len(pos)
	n3 := (n + 2) / 3 * 3
	run := len(sc.s) / attnTile
	pmax := 0
	for i := range n3 {
		qi := sc.q[i*hd : (i+1)*hd]
		if i >= n {
			clear(qi)
			continue
		}
		pmax = max(pmax, int(pos[i]))
		for c, v := range q[i*qw : i*qw+hd] {
			qi[c] = v * a.Scale
		}
	}
	acc, mx, sum := sc.acc[:n*hd], sc.mx[:n], sc.sum[:n]
	clear(acc)
	clear(sum)
	for i := range mx {
		mx[i] = float32(math.Inf(-1))
	}
	var cnts [attnTile]int
	for j := 0; j*bs <= pmax; {
		nb := 1
		for (nb+1)*bs <= run && (j+nb)*bs <= pmax && table[j+nb] == table[j]+int32(nb) {
			nb++
		}
		start := j * bs
		cnt := min(nb*bs, pmax+1-start)
		base := int(table[j])*bs*kw + kh*hd
		j += nb
		for i := range n3 {
			c := 0
			if i < n {
				c = min(max(int(pos[i])+1-start, 0), cnt)
			}
			cnts[i] = c
		}
		// BF16 rows feed the kernels directly for a tile of one or two
		// groups; for more, they are widened once for all of them.
		half := kc.dt == gpu.BF16 && n <= 6
		kf, vf, fb, fs := kc.f, vc.f, base, kw
		switch {
		case kc.dt == gpu.BF16 && !half:
			d.k.cvtBF16Rows(sc.kf, kc.h[base:], kw, cnt, hd)
			d.k.cvtBF16Rows(sc.vf, vc.h[base:], kw, cnt, hd)
			kf, vf, fb, fs = sc.kf, sc.vf, 0, hd
		case kc.dt == gpu.F16:
			kc.rows(d.k, sc.kf[:cnt*hd], base, kw, cnt, hd)
			vc.rows(d.k, sc.vf[:cnt*hd], base, kw, cnt, hd)
			kf, vf, fb, fs = sc.kf, sc.vf, 0, hd
		}
		for g := 0; g < n3; g += 3 {
			c := max(cnts[g], cnts[g+1], cnts[g+2])
			if c == 0 {
				continue
			}
			if half {
				d.k.dots3BF16(sc.s[g*run:], run, sc.q[g*hd:], hd, kc.h[base:], kw, c, hd)
			} else {
				d.k.dots3F32(sc.s[g*run:], run, sc.q[g*hd:], hd, kf[fb:], fs, c, hd)
			}
		}
		for i := range n {
			c := cnts[i]
			if c == 0 {
				continue
			}
			row := sc.s[i*run : i*run+c]
			bm := d.k.max(row)
			if bm > mx[i] {
				if sum[i] != 0 {
					f := expf(mx[i] - bm)
					sum[i] *= f
					for k := range acc[i*hd : (i+1)*hd] {
						acc[i*hd+k] *= f
					}
				}
				mx[i] = bm
			}
			sum[i] += d.k.expShift(row, mx[i])
		}
		for i := 0; i < n; i += 2 {
			c0, c1 := cnts[i], 0
			if i+1 < n {
				c1 = cnts[i+1]
			}
			cm := min(c0, c1)
			if cm > 0 {
				if half {
					d.k.accum2BF16(acc[i*hd:], hd, vc.h[base:], kw, sc.s[i*run:], run, cm, hd)
				} else {
					d.k.accum2F32(acc[i*hd:], hd, vf[fb:], fs, sc.s[i*run:], run, cm, hd)
				}
			}
			for r, c := range [2]int{c0, c1} {
				if c <= cm {
					continue
				}
				ar, pr := acc[(i+r)*hd:(i+r+1)*hd], sc.s[(i+r)*run+cm:(i+r)*run+c]
				if half {
					d.k.accumBF16(ar, vc.h[base+cm*kw:], kw, pr)
				} else {
					d.k.accum(ar, vf[fb+cm*fs:], fs, pr)
				}
			}
		}
	}
	for i := range n {
		inv := 1 / sum[i]
		for c, v := range acc[i*hd : (i+1)*hd] {
			o[i*qw+c] = v * inv
		}
	}
}

// attnRun is the most positions attendOne scores at once when the blocks
// holding them are adjacent in the cache.
const attnRun = 64

type attnScratch struct {
	scores []float32 // [max(BlockSize, attnRun)]
	acc    []float32 // [HeadDim]
	q      []float32 // [HeadDim], the query times Scale
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
		if bm := d.k.max(scores); bm > mx {
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
		case gpu.F16:
			d.k.accumF16(acc, vc.h[base:], kw, scores)
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
