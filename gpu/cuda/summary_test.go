//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/troupe/troupe/gpu"
)

// summaryRows builds n rows of width logits of many kinds (random normal,
// ties, few distinct values, -Inf and NaN sprinkled, all -Inf, nearly all
// NaN, all NaN, +Inf, and two laid out for summary_rows' candidates) and
// a token for each: the argmax, a random id, -1, or width (outside the
// row).
func summaryRows(r *rand.Rand, n, width int) ([]float32, []int32) {
	v := make([]float32, n*width)
	ids := make([]int32, n)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	// warp is the warp of summary_rows' block that holds logit j of a row
	// (its piece's float4s go to the 1,024 threads in turn).
	size := (width + 7) / 8
	warp := func(j int) int { return (j % size / 4 % 1024) / 32 }
	for i := range n {
		row := v[i*width : (i+1)*width]
		switch i % 11 {
		case 0: // random normal
			for j := range row {
				row[j] = float32(r.NormFloat64() * 3)
			}
		case 1: // many ties
			for j := range row {
				row[j] = float32(r.IntN(64)) / 4
			}
		case 2: // few distinct values: more ties at the top than the candidates hold
			for j := range row {
				row[j] = float32(r.IntN(8)) / 4
			}
		case 3: // -Inf and NaN sprinkled, the largest tied
			for j := range row {
				row[j] = float32(r.NormFloat64())
				switch r.IntN(16) {
				case 0:
					row[j] = nan
				case 1:
					row[j] = -inf
				}
			}
			for range 3 {
				row[r.IntN(width)] = 9
			}
		case 4: // all -Inf
			for j := range row {
				row[j] = -inf
			}
		case 5: // NaNs and -Inf with fewer than 20 values above -Inf
			for j := range row {
				row[j] = nan
				if r.IntN(8) == 0 {
					row[j] = -inf
				}
			}
			for range min(3, width) {
				row[r.IntN(width)] = float32(r.NormFloat64())
			}
		case 6: // all NaN
			for j := range row {
				row[j] = nan
			}
		case 7: // +Inf
			for j := range row {
				row[j] = float32(r.NormFloat64())
			}
			row[r.IntN(width)] = inf
		case 8: // large logits, a dominant one, negative zeros
			for j := range row {
				row[j] = float32(r.NormFloat64()*2 - 1000)
				if r.IntN(50) == 0 {
					row[j] = float32(math.Copysign(0, -1))
				}
			}
			row[r.IntN(width)] = 30
		case 9: // the first 4 warps' logits above the others': more than a block compacts pass the top-th warp's largest
			for j := range row {
				row[j] = float32(r.NormFloat64())
				if warp(j) < 4 {
					row[j] += 100
				}
			}
		case 10: // the first 2 warps' above a mass of ties: fewer than a block compacts pass them
			for j := range row {
				row[j] = 1.5
				if warp(j) < 2 {
					row[j] = float32(2 + r.NormFloat64())
				}
			}
		}
		switch (i / 11) % 4 {
		case 0:
			id, _, _, _ := gpu.ArgmaxLogProbs(row, 0)
			ids[i] = id
		case 1:
			ids[i] = int32(r.IntN(width))
		case 2:
			ids[i] = -1
		case 3:
			ids[i] = int32(width)
		}
	}
	return v, ids
}

// f32Ulps is how many float32 values lie between a and b (0 where equal,
// NaNs equal).
func f32Ulps(a, b float32) int64 {
	if a == b || a != a && b != b {
		return 0
	}
	if a != a || b != b {
		return math.MaxInt64
	}
	ord := func(f float32) int64 {
		x := int64(int32(math.Float32bits(f)))
		if x < 0 {
			x = math.MinInt32 - x
		}
		return x
	}
	d := ord(a) - ord(b)
	if d < 0 {
		d = -d
	}
	return d
}

// lpClose reports whether a device log-probability g is the host's w:
// equal (NaNs equal) or within 2 float32 ulps, or, near 0, where float32
// resolves finer than the float64 log-sum-exp l - lp holds, within a few
// of its float64 ulps and the host's rounding in adding a piece's terms
// one by one: 2e-12 + 1e-15·|l|, l the token's logit. (A greedy token of
// a row whose other logits lie 30 below it, 250 of them a piece: the
// host's sums round up by 0.4 ulp at every term, 2e-14 in all, where the
// device's per-lane sums do not, and the log-probability near -1.9e-10
// differs in its fifth digit.) It returns the ulps, or -1 where the
// absolute bound took it.
func lpClose(g, w, l float32) (bool, int64) {
	if u := f32Ulps(g, w); u <= 2 {
		return true, u
	}
	if g != g || w != w {
		return false, 0
	}
	return math.Abs(float64(g)-float64(w)) <= 2e-12+1e-15*math.Abs(float64(l)), -1
}

// checkSummaries compares got (len(rows) summaries of top) with
// gpu.Summarize's: ids, counts and unused places exact, log-probabilities
// as lpClose says.
func checkSummaries(t *testing.T, name string, got, v []float32, ids, rows []int32, width, top int) {
	t.Helper()
	w := gpu.SummaryWidth(top)
	want := make([]float32, w)
	worst, near, bad := int64(0), 0.0, 0
	for j, r := range rows {
		row := v[int(r)*width : (int(r)+1)*width]
		gpu.Summarize(want, row, ids[r], top)
		g := got[j*w : (j+1)*w]
		ok := g[1] == want[1]
		lp := func(i int, tok int32) {
			l := float32(0)
			if tok >= 0 && int(tok) < width {
				l = row[tok]
			}
			close, u := lpClose(g[i], want[i], l)
			ok = ok && close
			if close && u < 0 {
				near = max(near, math.Abs(float64(g[i])-float64(want[i])))
			}
			worst = max(worst, u)
		}
		lp(0, ids[r])
		for i := 2; i < w; i += 2 {
			if i/2-1 < int(want[1]) {
				lp(i+1, int32(math.Float32bits(want[i])))
			} else {
				ok = ok && math.Float32bits(g[i+1]) == math.Float32bits(want[i+1])
			}
			ok = ok && math.Float32bits(g[i]) == math.Float32bits(want[i])
		}
		if !ok {
			if bad++; bad <= 3 {
				t.Errorf("%s: row %d (summary %d), id %d: got %v, want %v", name, r, j, ids[r], readable(g), readable(want))
			}
		}
	}
	if bad > 3 {
		t.Errorf("%s: %d summaries differ", name, bad)
	}
	if worst > 0 || near > 0 {
		t.Logf("%s: log-probabilities at most %d ulps from the host's; near 0, %.3g apart", name, worst, near)
	}
}

// readable shows a summary with its ids as integers.
func readable(s []float32) string {
	out := fmt.Sprintf("[%v %v", s[0], s[1])
	for i := 2; i+1 < len(s); i += 2 {
		out += fmt.Sprintf(" (%d %v)", int32(math.Float32bits(s[i])), s[i+1])
	}
	return out + "]"
}

// TestCUDASummarize checks summary_rows against gpu.Summarize over rows of
// 100,352 logits and narrow ones (1, 7, 300), tops 0, 1, 5 and 20, row
// lists in order, reversed, with repeats and longer than a launch's 64
// rows, and once recorded in a graph.
func TestCUDASummarize(t *testing.T) {
	d := open(t)
	r := rand.New(rand.NewPCG(11, 12))
	for _, width := range []int{1, 7, 300, 100352} {
		const n = 80
		v, ids := summaryRows(r, n, width)
		logits := f32buf(t, d, v)
		idb := i32buf(t, d, ids)
		lists := map[string][]int32{"one": {int32(n - 1)}}
		for i := range n {
			lists["all"] = append(lists["all"], int32(i))
			if i%3 != 1 {
				lists["reversed"] = append(lists["reversed"], int32(n-1-i))
			}
		}
		for range 70 {
			lists["random"] = append(lists["random"], int32(r.IntN(n)))
		}
		out := alloc(t, d, gpu.F32, n*gpu.SummaryWidth(gpu.MaxSummaryTop))
		for _, top := range []int{0, 1, 5, 20} {
			if top > width {
				continue
			}
			for _, ln := range []string{"all", "reversed", "random", "one"} {
				rows := lists[ln]
				name := fmt.Sprintf("width %d, top %d, %s (%d rows)", width, top, ln, len(rows))
				if err := d.Summarize(out, logits, idb, rows, width, top); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				got := readF32(t, d, out)
				checkSummaries(t, name, got[:len(rows)*gpu.SummaryWidth(top)], v, ids, rows, width, top)
			}
		}
		// Recorded in a graph and replayed.
		if width == 100352 {
			rows := lists["random"]
			clear := make([]float32, out.Len())
			if err := d.Write(out, 0, gpu.F32Bytes(clear)); err != nil {
				t.Fatal(err)
			}
			g, err := d.Capture(func() error { return d.Summarize(out, logits, idb, rows, width, 5) })
			if err != nil {
				t.Fatal(err)
			}
			for range 2 { // replayed: the blocks' counters are left zero for the next
				if err := g.Launch(); err != nil {
					t.Fatal(err)
				}
			}
			got := readF32(t, d, out)
			if err := g.Close(); err != nil {
				t.Fatal(err)
			}
			checkSummaries(t, "graph", got[:len(rows)*gpu.SummaryWidth(5)], v, ids, rows, width, 5)
		}
		// Refused: top beyond 20 or the width, rows past the logits.
		for _, c := range []struct {
			rows       []int32
			top, width int
		}{{[]int32{0}, 21, width}, {[]int32{0}, width + 1, width}, {[]int32{n}, 1, width}, {[]int32{-1}, 1, width}} {
			if err := d.Summarize(out, logits, idb, c.rows, c.width, c.top); err == nil {
				t.Errorf("width %d: rows %v, top %d accepted", width, c.rows, c.top)
			}
		}
		d.Free(logits)
		d.Free(idb)
		d.Free(out)
	}
	if err := d.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkSummarize: summaries of 1 and 16 rows of 100,352 logits with
// their 5 most likely tokens, one launch.
func BenchmarkSummarize(b *testing.B) {
	d := open(b)
	r := rand.New(rand.NewPCG(8, 8))
	const n, width, top = 16, 100352, 5
	logits := f32buf(b, d, randF32(r, n*width, 3))
	ids := make([]int32, n)
	rows := make([]int32, n)
	for i := range n {
		ids[i], rows[i] = int32(r.IntN(width)), int32(i)
	}
	idb := i32buf(b, d, ids)
	out := alloc(b, d, gpu.F32, n*gpu.SummaryWidth(top))
	for _, rn := range []int{1, n} {
		b.Run(fmt.Sprintf("rows=%d", rn), func(b *testing.B) {
			graphRate(b, d, 8, 0, func() error {
				return repeat(8, func() error { return d.Summarize(out, logits, idb, rows[:rn], width, top) })
			})
		})
	}
}
