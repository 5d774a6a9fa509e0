package cpu

import (
	"math"

	"github.com/troupe/troupe/gpu"
)

// Blocked attention. A unit of work is up to flashLanes query lanes, each a
// (token, query head) pair of one sequence and one KV head. The lanes go
// through the cache together, flashChunk keys at a time: the chunk's keys
// and values are widened to F32 once (or read in place from an F32 cache
// whose blocks lie next to each other), scored against all lanes as a small
// matrix product, passed through an online softmax lane by lane, and summed
// into the lanes' outputs as a second matrix product.
const (
	// flashLanes is the most query lanes in a unit; the kernels hold
	// them in three vectors of eight.
	flashLanes = 24
	// flashGroup and flashDims shape the value-sum tiles: flashGroup lanes
	// by flashDims dimensions, twelve vectors.
	flashGroup = 6
	flashDims  = 16
	// flashChunk is the most keys scored at once.
	flashChunk = 64
	// flashMinLanes is the fewest lanes worth a blocked pass; a tile with
	// fewer takes its heads one at a time (attendTile, attendOne).
	flashMinLanes = 12
)

// flashAt returns the index of lane i, dimension d in a unit's value sums:
// tiles of flashGroup lanes by flashDims dimensions, lane group-major.
func flashAt(i, d, hd int) int {
	tiles := (hd + flashDims - 1) / flashDims
	return ((i/flashGroup)*tiles+d/flashDims)*flashGroup*flashDims + (i%flashGroup)*flashDims + d%flashDims
}

// flashScratch is one thread's workspace for attendFlash.
type flashScratch struct {
	qt      []float32         // [HeadDim][flashLanes] queries
	s       []float32         // [flashChunk][flashLanes] scores, then probabilities
	o       []float32         // value sums, laid out as flashAt says
	k, v    []float32         // [flashChunk][HeadDim] widened keys and values
	m, l, f []float32         // [flashLanes] running maxima and sums, step factors
	pos     [flashLanes]int32 // the lanes' positions
}

// flashScratchLen is how many floats a flashScratch for hd takes.
func flashScratchLen(hd int) int {
	hp := (hd + flashDims - 1) / flashDims * flashDims
	return flashLanes*(hd+flashChunk+hp+3) + 2*flashChunk*hd
}

// newFlashScratch carves a flashScratch for hd out of buf, which holds
// flashScratchLen(hd) floats.
func newFlashScratch(buf []float32, hd int) flashScratch {
	hp := (hd + flashDims - 1) / flashDims * flashDims
	take := func(n int) []float32 {
		s := buf[:n:n]
		buf = buf[n:]
		return s
	}
	return flashScratch{
		qt: take(flashLanes * hd),
		s:  take(flashChunk * flashLanes),
		o:  take(flashLanes * hp),
		k:  take(flashChunk * hd),
		v:  take(flashChunk * hd),
		m:  take(flashLanes),
		l:  take(flashLanes),
		f:  take(flashLanes),
	}
}

// attendFlash computes lanes [l0, l1) of a tile of tokens of one sequence
// for KV head kh: lane j is token j/group (pos[j/group]) and query head
// kh*group + j%group. o and q start at the tile's first token. Chunks run
// up to the last lane's position; keys past a lane's position are masked.
// kwide and vwide, where not nil, hold the sequence's keys and values for
// kh already widened (widenKV).
func (d *Device) attendFlash(o, q []float32, kc, vc mat, kwide, vwide []float32, table, pos []int32, kh, group, l0, l1, kw int, a gpu.AttnArgs, sc *flashScratch) {
	hd := a.HeadDim
	n := l1 - l0
	lo, hi := sc.loadQueries(d.k, q, pos, kh, group, l0, l1, a)
	for i := range flashLanes {
		sc.m[i] = float32(math.Inf(-1))
	}
	clear(sc.l)
	clear(sc.o)
	for c0 := 0; c0 <= hi; c0 += flashChunk {
		nk := min(flashChunk, hi+1-c0)
		kr, ks := d.flashRows(kc, kwide, sc.k, table, c0, nk, kh, kw, a)
		d.k.flashScores(sc.s, kr, ks, nk, sc.qt, hd, a.Scale)
		if c0+nk-1 > lo {
			flashMask(sc.s, sc.pos[:n], c0, nk, lo)
		}
		d.k.flashSoftmax(sc.s, nk, sc.m, sc.l, sc.f)
		vr, vs := d.flashRows(vc, vwide, sc.v, table, c0, nk, kh, kw, a)
		d.k.flashPV(sc.o, sc.s, nk, vr, vs, sc.f, hd)
	}
	sc.store(o, kh, group, l0, l1, a)
}

// loadQueries fills sc.qt and sc.pos with lanes [l0, l1) and returns the
// least and the greatest of their positions: the lanes' query rows are
// copied into sc.o (free until the first chunk) and transposed from there.
// Lanes past l1 score zero and are never masked; their outputs are dropped.
func (sc *flashScratch) loadQueries(k *kernels, q []float32, pos []int32, kh, group, l0, l1 int, a gpu.AttnArgs) (lo, hi int) {
	hd, qw := a.HeadDim, a.Heads*a.HeadDim
	rows := sc.o[:flashLanes*hd]
	clear(rows[(l1-l0)*hd:])
	lo, hi = math.MaxInt32, -1
	for i := range flashLanes {
		sc.pos[i] = math.MaxInt32
		if i >= l1-l0 {
			continue
		}
		t, h := (l0+i)/group, kh*group+(l0+i)%group
		p := int(pos[t])
		sc.pos[i] = int32(p)
		lo, hi = min(lo, p), max(hi, p)
		copy(rows[i*hd:(i+1)*hd], q[t*qw+h*hd:])
	}
	k.packT(sc.qt, flashLanes, rows, hd, flashLanes, hd)
	return lo, hi
}

// store writes lanes [l0, l1) of the value sums, divided by their softmax
// sums, into o (which starts at the tile's first token).
func (sc *flashScratch) store(o []float32, kh, group, l0, l1 int, a gpu.AttnArgs) {
	hd, qw := a.HeadDim, a.Heads*a.HeadDim
	for i := range l1 - l0 {
		t, h := (l0+i)/group, kh*group+(l0+i)%group
		inv := 1 / sc.l[i]
		for c := 0; c < hd; c += flashDims {
			src := sc.o[flashAt(i, c, hd):][:min(flashDims, hd-c)]
			dst := o[t*qw+h*hd+c:][:len(src)]
			for j, v := range src {
				dst[j] = v * inv
			}
		}
	}
}

// flashMask sets the scores of keys past each lane's position to -Inf in
// a chunk of nk keys from position c0; lo is the least lane position.
func flashMask(s []float32, pos []int32, c0, nk, lo int) {
	inf := float32(math.Inf(-1))
	for j := max(0, lo+1-c0); j < nk; j++ {
		kp := int32(c0 + j)
		row := s[j*flashLanes : j*flashLanes+len(pos)]
		for i, p := range pos {
			if kp > p {
				row[i] = inf
			}
		}
	}
}

// flashRows returns KV head kh's rows for the nk positions from c0 of a
// sequence (block table table) and their stride: from wide, the sequence's
// rows already widened for this head, where there is one; from the cache
// itself when it is F32 and the positions' blocks lie next to each other;
// else widened into buf.
func (d *Device) flashRows(m mat, wide, buf []float32, table []int32, c0, nk, kh, kw int, a gpu.AttnArgs) ([]float32, int) {
	hd, bs := a.HeadDim, a.BlockSize
	if wide != nil {
		return wide[c0*hd:], hd
	}
	if m.dt == gpu.F32 && adjacent(table, c0/bs, (c0+nk-1)/bs) {
		return m.f[(int(table[c0/bs])*bs+c0%bs)*kw+kh*hd:], kw
	}
	d.gather(m, buf[:nk*hd], table, c0, kh, kw, a)
	return buf, hd
}

// gather widens KV head kh's rows for the len(dst)/HeadDim positions from
// c0 of a sequence into dst, block by block.
func (d *Device) gather(m mat, dst []float32, table []int32, c0, kh, kw int, a gpu.AttnArgs) {
	hd, bs := a.HeadDim, a.BlockSize
	nk := len(dst) / hd
	for j := 0; j < nk; {
		p := c0 + j
		cnt := min(bs-p%bs, nk-j)
		m.rows(d.k, dst[j*hd:(j+cnt)*hd], (int(table[p/bs])*bs+p%bs)*kw+kh*hd, kw, cnt, hd)
		j += cnt
	}
}

// flashWideMax bounds, in floats, the keys and values widened ahead of a
// blocked pass (Device.wideMax); longer contexts widen each chunk where it
// is used.
const flashWideMax = 1 << 22

// kvSpan is one sequence's keys and values widened ahead of a blocked pass:
// positions 0..n-1, for every KV head.
type kvSpan struct {
	seq  int32
	n    int
	k, v int // offsets in Device.wide of [KVHeads][n][HeadDim]; -1 if not widened
}

// widenKV widens, once per call, the F16 and BF16 keys and values that the
// blocked tiles (those of flashMinLanes lanes or more) read, so that the
// tiles of one sequence share them; it sets d.spans and, per tile,
// d.tileSpan (-1 for none). F32 caches are read in place.
func (d *Device) widenKV(kc, vc mat, pos, seq, bt []int32, kw, group int, a gpu.AttnArgs) {
	tiles := d.tiles
	nt := len(tiles) - 1
	d.spans, d.tileSpan = d.spans[:0], d.tileSpan[:0]
	for i := range nt {
		t0, t1 := int(tiles[i]), int(tiles[i+1])
		d.tileSpan = append(d.tileSpan, -1)
		if (t1-t0)*group < flashMinLanes || (kc.dt == gpu.F32 && vc.dt == gpu.F32) {
			continue
		}
		hi := 0
		for _, p := range pos[t0:t1] {
			hi = max(hi, int(p))
		}
		d.tileSpan[i] = int32(d.span(seq[t0], hi+1))
	}
	total := 0
	for i := range d.spans {
		sp := &d.spans[i]
		sp.k, sp.v = -1, -1
		if kc.dt != gpu.F32 {
			sp.k, total = total, total+sp.n*kw
		}
		if vc.dt != gpu.F32 {
			sp.v, total = total, total+sp.n*kw
		}
	}
	if total == 0 {
		return
	}
	if total > d.wideMax {
		d.spans = d.spans[:0]
		for i := range d.tileSpan {
			d.tileSpan[i] = -1
		}
		return
	}
	if len(d.wide) < total {
		d.wide = make([]float32, total)
	}
	d.widenSpans(kc, vc, bt, kw, a)
}

// span returns the index of seq's span in d.spans, added if new, grown to
// at least n positions.
func (d *Device) span(seq int32, n int) int {
	for i := range d.spans {
		if d.spans[i].seq == seq {
			d.spans[i].n = max(d.spans[i].n, n)
			return i
		}
	}
	d.spans = append(d.spans, kvSpan{seq: seq, n: n})
	return len(d.spans) - 1
}

// widenSpans fills d.wide for d.spans, a (span, KV head, chunk) per unit
// of work.
func (d *Device) widenSpans(kc, vc mat, bt []int32, kw int, a gpu.AttnArgs) {
	hd := a.HeadDim
	units := 0
	for _, sp := range d.spans {
		units += a.KVHeads * ((sp.n + flashChunk - 1) / flashChunk)
	}
	d.pool.For(units, 1, func(_, lo, hi int) {
		for u := lo; u < hi; u++ {
			si, r := 0, u
			for ; ; si++ {
				c := a.KVHeads * ((d.spans[si].n + flashChunk - 1) / flashChunk)
				if r < c {
					break
				}
				r -= c
			}
			sp := d.spans[si]
			chunks := (sp.n + flashChunk - 1) / flashChunk
			kh, c0 := r/chunks, r%chunks*flashChunk
			nk := min(flashChunk, sp.n-c0)
			table := bt[int(sp.seq)*a.MaxBlocks:][:a.MaxBlocks]
			if sp.k >= 0 {
				d.gather(kc, d.wide[sp.k+(kh*sp.n+c0)*hd:][:nk*hd], table, c0, kh, kw, a)
			}
			if sp.v >= 0 {
				d.gather(vc, d.wide[sp.v+(kh*sp.n+c0)*hd:][:nk*hd], table, c0, kh, kw, a)
			}
		}
	})
}

// spanRows returns the widened keys and values of KV head kh in span i
// (nil where not widened or i < 0).
func (d *Device) spanRows(i, kh, hd int) (k, v []float32) {
	if i < 0 {
		return nil, nil
	}
	sp := d.spans[i]
	if sp.k >= 0 {
		k = d.wide[sp.k+kh*sp.n*hd:][:sp.n*hd]
	}
	if sp.v >= 0 {
		v = d.wide[sp.v+kh*sp.n*hd:][:sp.n*hd]
	}
	return k, v
}

// adjacent reports whether blocks first..last of a block table lie next to
// each other in the cache.
func adjacent(table []int32, first, last int) bool {
	for b := first + 1; b <= last; b++ {
		if table[b] != table[first]+int32(b-first) {
			return false
		}
	}
	return true
}

// rows widens rows rows of n elements of w, starting at off and stride
// apart, into dst[r*n:][:n].
func (w mat) rows(k *kernels, dst []float32, off, stride, rows, n int) {
	switch w.dt {
	case gpu.F32:
		for r := range rows {
			copy(dst[r*n:(r+1)*n], w.f[off+r*stride:])
		}
	case gpu.BF16:
		k.cvtBF16Rows(dst, w.h[off:], stride, rows, n)
	case gpu.F16:
		for r := range rows {
			k.cvtF16(dst[r*n:(r+1)*n], w.h[off+r*stride:off+r*stride+n])
		}
	}
}
