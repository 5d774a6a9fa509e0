package cpu

import "github.com/troupe/troupe/gpu"

// Tuning of MatMul.
const (
	// gemmMinRows is the smallest n that uses the blocked GEMM; below it
	// each input row streams the weights once (GEMV).
	gemmMinRows = 4
	// gemvGrain is the least number of weight elements worth handing to
	// another thread in a GEMV.
	gemvGrain = 32 << 10
	// panelBytes bounds the F32 weight panel a GEMM thread keeps in its
	// L2 cache while all input rows stream past it.
	panelBytes = 96 << 10
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
		for i := range n {
			d.gemv(out[i*m:(i+1)*m], x[i*k:(i+1)*k], w, k, m)
		}
		return
	}
	d.gemm(out, x, w, n, k, m)
}

// gemv computes out[m] = w[m,k] · x[k], splitting the rows in groups of
// four (the kernels' unit) across the pool.
func (d *Device) gemv(out, x []float32, w mat, k, m int) {
	quads := (m + 3) / 4
	grain := max(1, gemvGrain/(4*k))
	d.pool.For(quads, grain, func(_, lo, hi int) {
		r0, r1 := 4*lo, min(4*hi, m)
		w.gemv(d.k, out[r0:r1], x, k, r0)
	})
}

// gemm computes out[n,m] = x[n,k] · w[m,k]ᵀ by blocks of weight rows: each
// thread widens a panel of rows to F32 once (padding k to a multiple of 8
// with zeros), then runs the 4x3 kernel over every input row against it.
func (d *Device) gemm(out, x []float32, w mat, n, k, m int) {
	kp := (k + 7) &^ 7
	// Rows per panel: a multiple of 3 that fits panelBytes, chosen so
	// that the panels split evenly over the threads.
	rmax := max(3, panelBytes/(4*kp)/3*3)
	t := d.pool.threads
	per := (m + t*rmax - 1) / (t * rmax) // panels per thread
	r := ((m+t*per-1)/(t*per) + 2) / 3 * 3
	panels := (m + r - 1) / r
	d.pool.For(panels, 1, func(tid, lo, hi int) {
		s := d.scratch[tid].get(r*kp + 4*kp + 12)
		wp, xp, tmp := s[:r*kp], s[r*kp:r*kp+4*kp], s[r*kp+4*kp:]
		for p := lo; p < hi; p++ {
			j0 := p * r
			rows := min(r, m-j0)
			pan, ps := wp, kp
			if w.dt == gpu.F32 && kp == k && rows%3 == 0 {
				pan, ps = w.f[j0*k:(j0+rows)*k], k
			} else {
				for j := range rows {
					dst := wp[j*kp : (j+1)*kp]
					w.row(d.k, dst[:k], (j0+j)*k)
					clear(dst[k:])
				}
				// Rows past m in the last group of three feed only
				// discarded outputs, but must hold numbers.
				clear(wp[rows*kp : (rows+2)/3*3*kp])
			}
			d.gemmPanel(out, x, n, k, m, kp, j0, rows, pan, ps, xp, tmp)
		}
	})
}

// gemmPanel multiplies all n input rows by the panel of weight rows
// [j0, j0+rows) held in pan (row stride ps, depth kp). For each block of
// four input rows one kernel call sweeps every whole triple of the panel,
// so the Go loop runs once per block rather than once per 4x3 tile.
func (d *Device) gemmPanel(out, x []float32, n, k, m, kp, j0, rows int, pan []float32, ps int, xp, tmp []float32) {
	for i := 0; i < n; i += 4 {
		ni := min(4, n-i)
		xt, xs := x[i*k:], k
		if ni < 4 || kp != k {
			for r := range 4 {
				dst := xp[r*kp : (r+1)*kp]
				if r < ni {
					copy(dst, x[(i+r)*k:(i+r+1)*k])
					clear(dst[k:])
				} else {
					clear(dst)
				}
			}
			xt, xs = xp, kp
		}
		j := 0
		if ni == 4 && rows >= 3 {
			// Whole triples in one call; the x rows stay in L1.
			j = rows / 3 * 3
			d.k.gemm4x3(out[i*m+j0:], m, xt, xs, pan, ps, kp, rows/3)
		}
		for ; j < rows; j += 3 {
			nj := min(3, rows-j)
			d.k.gemm4x3(tmp, 3, xt, xs, pan[j*ps:], ps, kp, 1)
			for a := range ni {
				copy(out[(i+a)*m+j0+j:(i+a)*m+j0+j+nj], tmp[3*a:3*a+nj])
			}
		}
	}
}
