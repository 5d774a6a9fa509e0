package gputest

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/troupe/troupe/gpu"
)

// sample checks gpu.Sampler against gpu.SampleHost (float64): greedy,
// unfiltered and filtered draws (top-k up to gpu.MaxSampleTopK, with top-p
// and min-p among the kept tokens; top-p and min-p over whole rows, some
// peaked so that a few tokens settle them, some keeping most of the row)
// over rows with ties, a NaN and -Inf among the logits. Every row is
// settled on the device (no -1). The device sums in another order than
// the host, so where moving u by 1e-9 changes the host's choice either
// neighbour is accepted (sameDraw). Whole (sampleWhole) then checks
// whole-row draws over rows of many shapes.
func (h *harness) sample(t *testing.T) {
	s, ok := h.dev.(gpu.Sampler)
	if !ok {
		t.Skip("the device does not draw tokens itself")
	}
	widths := []int{1000}
	if h.o.Large {
		widths = append(widths, 100352)
	}
	type kind struct {
		gpu.SampleRow
		peaked bool // 40 tokens 12 above the rest
	}
	kinds := []kind{
		{}, {SampleRow: gpu.SampleRow{Temperature: 1}}, {SampleRow: gpu.SampleRow{Temperature: 0.7}},
		{SampleRow: gpu.SampleRow{Temperature: 1.3, TopK: 50}}, {SampleRow: gpu.SampleRow{Temperature: 1, TopK: 1024, TopP: 0.9}},
		{SampleRow: gpu.SampleRow{Temperature: 0.8, TopK: 200, MinP: 0.05, TopP: 0.95}},
		{SampleRow: gpu.SampleRow{Temperature: 1, TopK: 1}}, {SampleRow: gpu.SampleRow{Temperature: 2, TopK: 7}},
		{SampleRow: gpu.SampleRow{Temperature: 1, TopK: 3000}}, // all of a narrow row, sorted
		{SampleRow: gpu.SampleRow{Temperature: 1, TopP: 0.9}, peaked: true},
		{SampleRow: gpu.SampleRow{Temperature: 0.9, MinP: 0.02}, peaked: true},
		{SampleRow: gpu.SampleRow{Temperature: 1, TopP: 0.9}}, // most of the row
		{SampleRow: gpu.SampleRow{Temperature: 1.1, TopK: 2_000_000, TopP: 0.5}},
	}
	for _, width := range widths {
		var rows []gpu.SampleRow
		var peaked []bool
		for i := range 52 {
			r := kinds[i%len(kinds)]
			if !r.OnDevice(width) {
				continue
			}
			if r.Temperature != 0 {
				r.U = h.rng.Float64()
				if i%13 == 5 {
					r.U = 0.999999999
				}
			}
			if i%4 == 3 {
				// Penalties and biases on some tokens (gpu.LogitAdjust);
				// on half of these rows one token raised to the top.
				r.Penalties = gpu.Penalties{Repetition: []float32{1.3, 0, 0.8, 1}[i%16/4], Presence: float32(i%5)/4 - 0.5, Frequency: float32(i%3) / 3}
				for j := range 1 + i%9 {
					id := int32((j*104729 + i*31) % width)
					r.Adjust = append(r.Adjust, gpu.LogitAdjust{ID: id, Seen: j%2 == 0, Count: int32(j % 4), Bias: float32(j%5) - 2})
				}
				if i%8 == 3 {
					r.Adjust = append(r.Adjust, gpu.LogitAdjust{ID: int32(width - 1), Bias: 9})
				}
				r.Adjust = append(r.Adjust, gpu.LogitAdjust{ID: int32(width + 5), Seen: true, Count: 2, Bias: 1}) // outside: skipped
			}
			if i%8 == 1 {
				r.Penalties = gpu.Penalties{Presence: 0.5, Frequency: 0.25} // no list until a draw follows
			}
			if i%6 == 2 {
				// Tokens a grammar bans (a bias of -Inf), most of a
				// narrow row, thousands of a wide one, the raised ones of
				// a peaked row among them.
				banned := map[int32]bool{}
				ban := func(id int32) {
					if !banned[id] {
						banned[id] = true
						r.Adjust = append(r.Adjust, gpu.LogitAdjust{ID: id, Bias: float32(math.Inf(-1))})
					}
				}
				for j := range min(width*9/10, 5000) {
					ban(int32((j*7 + i) % width))
				}
				for j := range 20 {
					ban(int32((j*7919 + 17) % width))
				}
			}
			rows, peaked = append(rows, r.SampleRow), append(peaked, r.peaked)
		}
		n := len(rows)
		v := h.randF32(n*width, 3)
		for r := range n {
			row := v[r*width : (r+1)*width]
			row[7], row[width/2] = row[3], row[3] // ties
			row[11] = float32(math.NaN())
			row[13] = float32(math.Inf(-1))
			if peaked[r] {
				for j := range 40 {
					row[(j*7919+17)%width] += 12
				}
			}
		}
		logits, out := h.f32(v), h.alloc(gpu.I32, n)
		var sc gpu.SampleScratch
		host := func(r int, row gpu.SampleRow) int32 {
			l := append([]float32(nil), v[r*width:(r+1)*width]...)
			return gpu.SampleHost(l, row, &sc)
		}
		// draw samples rows, whose lists are resolved's, and checks the
		// tokens against the host's and that the logits read as they were.
		draw := func(what string, rows, resolved []gpu.SampleRow) []int32 {
			t.Helper()
			if err := s.Sample(out.d, logits.d, n, width, rows); err != nil {
				t.Fatalf("width %d, %s: %v", width, what, err)
			}
			got := make([]int32, n)
			if err := h.dev.Read(gpu.I32Bytes(got), out.d, 0); err != nil {
				t.Fatal(err)
			}
			// The logits read as they were: adjustments are for the draw.
			after := make([]float32, n*width)
			if err := h.dev.Read(gpu.F32Bytes(after), logits.d, 0); err != nil {
				t.Fatal(err)
			}
			for i := range after {
				if math.Float32bits(after[i]) != math.Float32bits(v[i]) {
					t.Fatalf("width %d, %s: logit %d of row %d changed by the draw: %v, was %v", width, what, i%width, i/width, after[i], v[i])
				}
			}
			for r, row := range resolved {
				if got[r] == -1 {
					t.Errorf("width %d, %s, row %d %+v: left to the host", width, what, r, row)
					continue
				}
				if ok, want := sameDraw(got[r], func(u float64) int32 {
					x := row
					x.U = u
					return host(r, x)
				}, row.U); !ok {
					t.Errorf("width %d, %s, row %d %+v: drew %d, the host %d", width, what, r, row, got[r], want)
				}
			}
			return got
		}
		// Rows that follow before any draw into a buffer are refused.
		follow := slices.Clone(rows)
		follow[3].Adjust, follow[3].Follows = nil, true
		if err := s.Sample(out.d, logits.d, n, width, follow); err == nil {
			t.Errorf("width %d: a row that follows no draw was taken", width)
		}
		got := draw("fresh lists", rows, rows)
		// Twice more, the adjusted rows following the draw before: their
		// lists are the last ones after the tokens drawn (gpu.FollowRows),
		// kept and updated where the device keeps them.
		resolved := rows
		for k := range 2 {
			follow = slices.Clone(rows)
			for r := range follow {
				follow[r].U = h.rng.Float64()
				if follow[r].Temperature == 0 {
					follow[r].U = 0
				}
				if (len(rows[r].Adjust) > 0 || rows[r].Penalties.Active()) && got[r] >= 0 {
					follow[r].Adjust, follow[r].Follows = nil, true
				}
			}
			next, err := gpu.FollowRows(resolved, got, follow)
			if err != nil {
				t.Fatal(err)
			}
			got, resolved = draw(fmt.Sprintf("following %d", k+1), follow, next), next
		}
		t.Logf("width %d: %d rows", width, n)
		// Refused: a draw outside [0, 1), and rows that do not match n.
		bad := append([]gpu.SampleRow(nil), rows...)
		bad[0].U = 1
		if err := s.Sample(out.d, logits.d, n, width, bad); err == nil {
			t.Errorf("width %d: a draw of 1 was taken", width)
		}
		bad = append([]gpu.SampleRow(nil), rows...)
		bad[1].Penalties.Repetition = -1
		if err := s.Sample(out.d, logits.d, n, width, bad); err == nil {
			t.Errorf("width %d: a negative repetition penalty was taken", width)
		}
		if err := s.Sample(out.d, logits.d, n, width, rows[1:]); err == nil {
			t.Errorf("width %d: %d draws for %d rows were taken", width, n-1, n)
		}
		h.free(logits, out)
	}
	t.Run("Whole", h.sampleWhole)
}

// sameDraw reports whether got, a device's draw at u, is the host's
// (host(u), returned as want) or, since the device sums in another order,
// the host's at u moved by 1e-9 either way.
func sameDraw(got int32, host func(u float64) int32, u float64) (ok bool, want int32) {
	if want = host(u); got == want {
		return true, want
	}
	return got == host(max(0, u-1e-9)) || got == host(min(math.Nextafter(1, 0), u+1e-9)), want
}

// sampleWhole checks whole-row draws (top-p and min-p over the whole row,
// or a top-k of the whole row: gpu.SampleRow.Whole), which a device
// settles itself, against gpu.SampleHost: rows of several shapes, each
// under top-p and min-p at temperatures 0.6 to 1.5 (top-p 0.9 and 0.95,
// min-p 0.01 and 0.05, both, top-p 1 or 0 with min-p, neither), draws at
// random, 0 and 0.999999999:
//   - flat: normal, deviation 3, the filters keeping most of the row;
//   - uniform: in [-2, 2], flatter still;
//   - peaked: 40 tokens 12 above the rest;
//   - ties: 48 values, runs of ties;
//   - wide: normal, deviation 12, most tokens past the buckets' depth
//     (gpu's sampleDepth), some kept by a min-p of 1e-20;
//   - full: a fifth of the row (20,070 tokens of 100,352) tied at the
//     largest logit, a bucket of more tokens than a device sorts at once;
//   - near: as many distinct ones within 0.003 of the largest;
//   - dead: every logit -Inf or NaN; hot: +Inf among them.
//
// Each row also has a tie, a NaN and -Inf among its logits.
func (h *harness) sampleWhole(t *testing.T) {
	s, ok := h.dev.(gpu.Sampler)
	if !ok {
		t.Skip("the device does not draw tokens itself")
	}
	widths := []int{37, 1000}
	if h.o.Large {
		widths = append(widths, 100352)
	}
	shapes := []string{"flat", "uniform", "peaked", "ties", "wide", "full", "near", "dead", "hot"}
	inf := float32(math.Inf(1))
	for _, width := range widths {
		filters := []gpu.SampleRow{
			{Temperature: 0.8, TopP: 0.9}, {Temperature: 1.5, TopP: 0.95}, {Temperature: 1, MinP: 0.01}, {Temperature: 1.2, MinP: 0.05},
			{Temperature: 0.9, TopP: 0.9, MinP: 0.05}, {Temperature: 1.1, TopP: 0.95, MinP: 0.01},
			{Temperature: 1, TopP: 1, MinP: 0.05},             // top-p 1: min-p alone
			{Temperature: 1.3, TopK: int32(width), TopP: 0.5}, // a top-k of the whole row
			{Temperature: 1, TopK: int32(2 * width), TopP: 1}, // no filter, drawn in sorted order
			{Temperature: 0.6, MinP: 1e-20},                   // into the last bucket
			{Temperature: 1, TopP: 0.05},                      // a small head
		}
		var rows []gpu.SampleRow
		var names []string
		var v []float32
		for _, shape := range shapes {
			for j, f := range filters {
				row := make([]float32, width)
				for i := range row {
					switch shape {
					case "uniform":
						row[i] = float32(h.rng.Float64()*4 - 2)
					case "ties":
						row[i] = float32(h.rng.IntN(48))/8 - 3
					case "wide":
						row[i] = float32(h.rng.NormFloat64() * 12)
					case "dead":
						row[i] = -inf
					default:
						row[i] = float32(h.rng.NormFloat64() * 3)
					}
				}
				switch shape {
				case "peaked":
					for k := range 40 {
						row[(k*7919+17)%width] += 12
					}
				case "full", "near":
					top := slices.Max(row) + 1
					for _, i := range h.rng.Perm(width)[:width/5] {
						row[i] = top
						if shape == "near" {
							row[i] += float32(h.rng.Float64() * 0.003)
						}
					}
				}
				row[7%width], row[width/2] = row[3], row[3] // a tie
				row[11%width] = float32(math.NaN())
				row[13%width] = -inf
				if shape == "hot" {
					row[width/3] = inf
				}
				r := f
				r.U = h.rng.Float64()
				switch j % 4 {
				case 1:
					r.U = 0.999999999
				case 3:
					if shape == "flat" || shape == "full" {
						r.U = 0
					}
				}
				if !r.Whole(width) {
					t.Fatalf("%+v: not a whole-row draw", r)
				}
				rows, names, v = append(rows, r), append(names, shape), append(v, row...)
			}
		}
		n := len(rows)
		logits, out := h.f32(v), h.alloc(gpu.I32, n)
		if err := s.Sample(out.d, logits.d, n, width, rows); err != nil {
			t.Fatalf("width %d: %v", width, err)
		}
		got := make([]int32, n)
		if err := h.dev.Read(gpu.I32Bytes(got), out.d, 0); err != nil {
			t.Fatal(err)
		}
		var sc gpu.SampleScratch
		for r, row := range rows {
			if got[r] == -1 {
				t.Errorf("width %d, %s row %d %+v: left to the host", width, names[r], r, row)
				continue
			}
			if ok, want := sameDraw(got[r], func(u float64) int32 {
				x := row
				x.U = u
				return gpu.SampleHost(slices.Clone(v[r*width:(r+1)*width]), x, &sc)
			}, row.U); !ok {
				t.Errorf("width %d, %s row %d %+v: drew %d, the host %d", width, names[r], r, row, got[r], want)
			}
		}
		t.Logf("width %d: %d whole-row draws", width, n)
		h.free(logits, out)
	}
}

// sampleFollow checks a long run of draws into one buffer of tokens, as a
// server's decode batch makes them: each row follows the draw before
// (gpu.SampleRow.Follows) for a while, then starts a new list of its own
// (a new sequence in its slot), each row on a period of its own. Every
// draw is checked against gpu.SampleHost over the lists gpu.FollowRows
// resolves, so the lists a device keeps across the run, however it packs
// them, are the host's.
func (h *harness) sampleFollow(t *testing.T) {
	s, ok := h.dev.(gpu.Sampler)
	if !ok {
		t.Skip("the device does not draw tokens itself")
	}
	const width, steps = 512, 240
	base := []gpu.SampleRow{
		{Temperature: 1, TopK: 40, Penalties: gpu.Penalties{Repetition: 1.2, Presence: 0.3, Frequency: 0.2}},
		{Penalties: gpu.Penalties{Presence: 0.5}}, // greedy
		{Temperature: 0.9, Penalties: gpu.Penalties{Frequency: 0.4}},
		{Temperature: 1, TopK: 100}, // a bias alone
		{Temperature: 1, Penalties: gpu.Penalties{Repetition: 1.5}},
		{}, // greedy, a bias alone
	}
	n := len(base)
	out := h.alloc(gpu.I32, n)
	defer h.free(out)
	var sc gpu.SampleScratch
	var resolved []gpu.SampleRow
	var got []int32
	for k := range steps {
		v := h.randF32(n*width, 1)
		logits := h.f32(v)
		rows := slices.Clone(base)
		for r := range rows {
			if rows[r].Temperature != 0 {
				rows[r].U = h.rng.Float64()
			}
			if k > 0 && (k+r)%(5+r) != 0 {
				rows[r].Follows = true
				continue
			}
			for j := range 5 + (k*7+r)%30 {
				rows[r].Adjust = append(rows[r].Adjust, gpu.LogitAdjust{
					ID: int32((j*131 + k*17 + r) % width), Seen: j%3 == 0, Count: int32(j % 4), Bias: float32(j%5) - 2})
			}
		}
		next, err := gpu.FollowRows(resolved, got, rows)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Sample(out.d, logits.d, n, width, rows); err != nil {
			t.Fatalf("step %d: %v", k, err)
		}
		got = make([]int32, n)
		if err := h.dev.Read(gpu.I32Bytes(got), out.d, 0); err != nil {
			t.Fatal(err)
		}
		host := func(r int, row gpu.SampleRow) int32 {
			return gpu.SampleHost(slices.Clone(v[r*width:(r+1)*width]), row, &sc)
		}
		for r, row := range next {
			if got[r] == host(r, row) {
				continue
			}
			if ok, want := sameDraw(got[r], func(u float64) int32 {
				x := row
				x.U = u
				return host(r, x)
			}, row.U); !ok {
				t.Fatalf("step %d, row %d %+v: drew %d, the host %d", k, r, row, got[r], want)
			}
		}
		resolved = next
		h.free(logits)
	}
	lists := 0
	for _, r := range resolved {
		lists += len(r.Adjust)
	}
	t.Logf("%d draws of %d rows, %d entries in the last lists", steps, n, lists)
}
