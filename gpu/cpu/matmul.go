package cpu

import "github.com/troupe/troupe/gpu"

// Tuning of MatMul.
const (
	// gemmMinRows is the smallest n that uses the blocked GEMM; below it
	// the rows of x take the GEMV over tiles of the weights, two at a time
	// (gemv). The GEMM widens every weight to f32 in its panels, which costs
	// more than it saves for a few rows: on a 2-core Zen 4 with bf16
	// weights, Qwen3-0.6B's decode steps were faster by the GEMV up to 16
	// rows (4 rows 2.1×, 16 rows 1.1×), level at 24, slower at 32
	// (docs/benchmarks.md).
	gemmMinRows = 17
	// gemvGrain is the least number of weight elements worth handing to
	// another thread in a GEMV.
	gemvGrain = 32 << 10
	// gemvTileBytes bounds the weights a GEMV thread takes for every input
	// row in turn, so that rows after the first read them from its L2.
	gemvTileBytes = 64 << 10
	// panelBytes bounds the F32 weight panel a GEMM thread keeps in its
	// L2 cache while all input rows stream past it.
	panelBytes = 192 << 10
	// gemmMaxDepth bounds the depth of one GEMM kernel call.
	gemmMaxDepth = 256
)

// MatMul implements gpu.Ops: out[n,m] = x[n,k] · w[m,k]ᵀ.
func (d *Device) MatMul(out, x, w gpu.Buffer, n, k, m int) error {
	const op = "matmul"
	b, err := d.args(op, out, x, w)
	if err != nil {
		return err
	}
	if err := checkDims(op, n, k, m); err != nil {
		return err
	}
	o, err := f32(op, "out", b[0], n*m)
	if err != nil {
		return err
	}
	xv, err := f32(op, "x", b[1], n*k)
	if err != nil {
		return err
	}
	wv, err := matOf(op, "w", b[2], m*k)
	if err != nil {
		return err
	}
	d.matmul(o[:n*m], xv[:n*k], wv, n, k, m)
	return nil
}

// matmul computes out[n,m] = x[n,k] · w[m,k]ᵀ on the pool.
func (d *Device) matmul(out, x []float32, w mat, n, k, m int) {
	if n == 0 || m == 0 {
		return
	}
	if k == 0 {
		clear(out[:n*m])
		return
	}
	if n < gemmMinRows {
		d.gemv(out, x, w, n, k, m)
		return
	}
	d.gemm(out, x, w, n, k, m)
}

// gemv computes out[i,:] = w · x[i,:] for n rows of x, splitting w's rows
// in groups of four (the kernels' unit) across the pool. Each thread takes
// its rows a tile at a time (gemvTileBytes) and runs the rows of x over
// the tile two at a time (gemv2), so the weights come from memory once,
// not once a row; a row's result is the same whatever the tile or n.
func (d *Device) gemv(out, x []float32, w mat, n, k, m int) {
	quads := (m + 3) / 4
	grain := max(1, gemvGrain/(4*k))
	tile := quads
	if n > 1 {
		tile = max(1, gemvTileBytes/(4*k*w.dt.Size()))
	}
	d.pool.For(quads, grain, func(_, lo, hi int) {
		for q := lo; q < hi; q += tile {
			r0, r1 := 4*q, min(4*min(q+tile, hi), m)
			i := 0
			for ; i+1 < n; i += 2 {
				w.gemv2(d.k, out[i*m+r0:i*m+r1], out[(i+1)*m+r0:(i+1)*m+r1], x[i*k:(i+1)*k], x[(i+1)*k:(i+2)*k], k, r0)
			}
			if i < n {
				w.gemv(d.k, out[i*m+r0:i*m+r1], x[i*k:(i+1)*k], k, r0)
			}
		}
	})
}

// gemm computes out[n,m] = x[n,k] · w[m,k]ᵀ by panels of weight rows:
// each thread packs a panel (packPanel), then runs the 6x16 kernel over
// every block of six input rows against it (gemmPanel).
func (d *Device) gemm(out, x []float32, w mat, n, k, m int) {
	// Rows per panel: a multiple of 16 that fits panelBytes, chosen so
	// that the panels split evenly over the threads.
	rmax := max(16, panelBytes/(4*k)/16*16)
	t := d.pool.threads
	per := (m + t*rmax - 1) / (t * rmax) // panels per thread
	r := ((m+t*per-1)/(t*per) + 15) / 16 * 16
	panels := (m + r - 1) / r
	kc := gemmDepth(k)
	d.pool.For(panels, 1, func(tid, lo, hi int) {
		s := d.scratch[tid].get(r*k + 16*k + 6*k + 6*16)
		wp, rows, xp, tmp := s[:r*k], s[r*k:(r+16)*k], s[(r+16)*k:(r+22)*k], s[(r+22)*k:]
		for p := lo; p < hi; p++ {
			j0 := p * r
			cnt := min(r, m-j0)
			d.packPanel(wp, rows, w, j0, cnt, k, kc)
			d.gemmPanel(out, x, n, k, m, j0, cnt, kc, wp, xp, tmp)
		}
	})
}

// gemmDepth returns how much of the depth k one kernel call takes: k split
// into near-equal parts of at most gemmMaxDepth, rounded up to a multiple
// of 8, so that six input rows of it stay in the L1 cache beside the
// weight strip streaming past.
func gemmDepth(k int) int {
	parts := (k + gemmMaxDepth - 1) / gemmMaxDepth
	return ((k+parts-1)/parts + 7) &^ 7
}

// packPanel packs weight rows [j0, j0+cnt) of w for gemm6x16: for each
// depth block of kc columns, strips of 16 rows laid out k-major, so that
// block b's strip s starts at b*kc*r16 + s*16*kcb (r16: cnt rounded up to
// 16; kcb: the block's depth). Rows that are not F32 are widened through
// rows (16 rows of k); rows past the last in the final strip are zero.
func (d *Device) packPanel(wp, rows []float32, w mat, j0, cnt, k, kc int) {
	r16 := (cnt + 15) / 16 * 16
	for s := 0; s*16 < cnt; s++ {
		j, nr := j0+16*s, min(16, cnt-16*s)
		src := rows
		if w.dt == gpu.F32 && nr == 16 {
			src = w.f[j*k:]
		} else {
			w.rows(d.k, rows[:nr*k], j*k, k, nr, k)
			clear(rows[nr*k : 16*k])
		}
		for kb := 0; kb < k; kb += kc {
			kcb := min(kc, k-kb)
			d.k.packT(wp[kb*r16+s*16*kcb:], 16, src[kb:], k, 16, kcb)
		}
	}
}

// gemmPanel multiplies all n input rows by the packed panel of weight rows
// [j0, j0+cnt). For each block of six input rows and each depth block, one
// kernel call sweeps every whole strip, writing (then adding to) out
// directly; a final partial strip, and a final block of fewer than six
// rows (padded with zero rows in xp), go through tmp.
func (d *Device) gemmPanel(out, x []float32, n, k, m, j0, cnt, kc int, wp, xp, tmp []float32) {
	strips, whole, r16 := (cnt+15)/16, cnt/16, (cnt+15)/16*16
	for i := 0; i < n; i += 6 {
		ni := min(6, n-i)
		xt := x[i*k:]
		if ni < 6 {
			copy(xp, x[i*k:(i+ni)*k])
			clear(xp[ni*k : 6*k])
			xt = xp
		}
		if ni == 6 && whole > 0 {
			for kb := 0; kb < k; kb += kc {
				kcb := min(kc, k-kb)
				d.k.gemm6x16(out[i*m+j0:], m, xt[kb:], k, wp[kb*r16:], kcb, whole, kb > 0)
			}
		}
		s := whole
		if ni < 6 {
			s = 0
		}
		for ; s < strips; s++ {
			for kb := 0; kb < k; kb += kc {
				kcb := min(kc, k-kb)
				d.k.gemm6x16(tmp, 16, xt[kb:], k, wp[kb*r16+s*16*kcb:], kcb, 1, kb > 0)
			}
			nj := min(16, cnt-16*s)
			for a := range ni {
				o := (i+a)*m + j0 + 16*s
				copy(out[o:o+nj], tmp[16*a:16*a+nj])
			}
		}
	}
}
