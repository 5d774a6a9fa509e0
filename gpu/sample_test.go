package gpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
)

// TestSampleHostFilters checks SampleHost's filtered draws against a plain
// implementation of the definition (a full sort of the row, then top-k,
// min-p and top-p over the sorted probabilities) on rows with many ties,
// a NaN and -Inf, for k from 1 to 40 and for top-p and min-p over the
// whole row (where SampleHost sums a bucket of logits at a time, here a
// run of ties each, up to all of the row for a top-p of 0.999), several
// draws each; and that greedy and unfiltered draws keep to their
// definitions.
func TestSampleHostFilters(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 3000
	logits := make([]float32, n)
	var s SampleScratch
	for trial := range 40 {
		for i := range logits {
			logits[i] = float32(rng.IntN(25)) / 4 // ties
		}
		logits[5], logits[9] = float32(math.NaN()), float32(math.Inf(-1))
		k := trial + 1
		if trial%4 == 3 {
			k = 0 // top-p and min-p over the whole row
		}
		for d := range 7 {
			r := SampleRow{Temperature: 0.5 + float32(d)/4, TopK: int32(k), TopP: []float32{0, 0.5, 0.9, 1, 0.3, 0.999, 0}[d], MinP: []float32{0, 0.1, 0, 0.3, 0, 0, 0.001}[d], U: rng.Float64()}
			if r.Plain() {
				continue
			}
			got := SampleHost(append([]float32(nil), logits...), r, &s)
			if want := sampleByDefinition(logits, r); got != want {
				t.Fatalf("k %d, %+v: drew %d, by the definition %d", k, r, got, want)
			}
		}
	}
	logits[17] = 100
	if got := SampleHost(append([]float32(nil), logits...), SampleRow{}, &s); got != 17 {
		t.Errorf("greedy draw %d, want 17", got)
	}
	if got := SampleHost(append([]float32(nil), logits...), SampleRow{Temperature: 1, U: 0.5}, &s); got != 17 {
		t.Errorf("unfiltered draw %d where token 17 holds all but e^-90 of the mass", got)
	}
}

func sampleByDefinition(in []float32, r SampleRow) int32 {
	l, idx := sortByDefinition(in)
	tok, _, _ := drawByDefinition(l, idx, r)
	return tok
}

// sortByDefinition returns in as float64 (NaN as -Inf) and its indexes in
// sorted order: descending, ties to the lower index.
func sortByDefinition(in []float32) (l []float64, idx []int) {
	l = make([]float64, len(in))
	idx = make([]int, len(in))
	for i, v := range in {
		l[i], idx[i] = float64(v), i
		if v != v {
			l[i] = math.Inf(-1)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return l[idx[a]] > l[idx[b]] })
	return l, idx
}

// drawByDefinition draws from the row l sorted as idx says: top-k, min-p
// and top-p over the sorted probabilities, then the walk with r.U. It
// returns the token, the kept tokens' probabilities and the point u of
// the walk (r.U times their sum).
func drawByDefinition(l []float64, idx []int, r SampleRow) (tok int32, kept []float64, u float64) {
	k := len(l)
	if r.TopK > 0 {
		k = min(int(r.TopK), k)
	}
	t := float64(r.Temperature)
	p := make([]float64, k)
	var sum float64
	for i := range k {
		p[i] = math.Exp(l[idx[i]]/t - l[idx[0]]/t)
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
	for r.MinP > 0 && k > 1 && p[k-1] < float64(r.MinP)*p[0] {
		k--
	}
	if r.TopP > 0 && r.TopP < 1 {
		acc := 0.0
		for i := range k {
			if acc += p[i]; acc >= float64(r.TopP) {
				k = i + 1
				break
			}
		}
	}
	total := 0.0
	for _, v := range p[:k] {
		total += v
	}
	u = r.U * total
	w := u
	for i, v := range p[:k] {
		if w -= v; w < 0 {
			return int32(idx[i]), p[:k], u
		}
	}
	return int32(idx[k-1]), p[:k], u
}

// TestSampleHostWhole checks top-p and min-p over whole rows of 100,352
// tokens that keep much of the row (where SampleHost sums a bucket of
// logits at a time) against the definition, a full sort of the row: a
// flat row (uniform in [-3, 3]), one of 48 values (runs of ties two
// thousand long) and a wide one (normal, standard deviation 12, so that
// many tokens lie past the buckets' depth, some kept by a min-p of
// 1e-20), each with NaN, -Inf and a tie for the largest logit among them,
// at two temperatures, eight filters and draws from 0 to the largest
// below 1. A draw may take another token than the definition only where
// the walk's point lies within 1e-12 of that token's stretch of it (a
// draw of 1-1e-16 among tokens 1e-20 likely), and only one in twenty
// may. Rows without a finite largest logit (all -Inf or NaN, or +Inf
// among them) take the definition's token too.
func TestSampleHostWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const n = 100352
	rows := []struct {
		name string
		draw func() float32
	}{
		{"flat", func() float32 { return float32(rng.Float64()*6 - 3) }},
		{"ties", func() float32 { return float32(rng.IntN(48))/8 - 3 }},
		{"wide", func() float32 { return float32(rng.NormFloat64() * 12) }},
	}
	filters := []SampleRow{{TopP: 0.9}, {TopP: 0.5}, {TopP: 0.99}, {TopP: math.Nextafter32(1, 0)},
		{MinP: 0.05}, {MinP: 0.3}, {MinP: 0.02, TopP: 0.95}, {MinP: 1e-20}}
	var s SampleScratch
	draws, near := 0, 0 // near: draws of another token within rounding
	for _, row := range rows {
		logits := make([]float32, n)
		for i := range logits {
			logits[i] = row.draw()
		}
		for i := 100; i < n; i += 997 {
			logits[i] = float32(math.Inf(-1))
		}
		logits[5] = float32(math.NaN())
		logits[n-3] = slices.Max(logits[6:]) // a tie for the largest
		l, idx := sortByDefinition(logits)
		most := 0 // the most tokens a draw kept
		for _, temp := range []float32{0.6, 1.7} {
			for _, f := range filters {
				for _, u := range []float64{0, rng.Float64(), 0.999999999, math.Nextafter(1, 0)} {
					r := f
					r.Temperature, r.U = temp, u
					got := SampleHost(slices.Clone(logits), r, &s)
					want, kept, at := drawByDefinition(l, idx, r)
					draws++
					most = max(most, len(kept))
					if got == want {
						continue
					}
					// Another kept token only where the walk's point lies
					// within 1e-12 of its stretch of the sorted walk.
					pos := slices.Index(idx[:len(kept)], int(got))
					var before float64
					for _, p := range kept[:max(pos, 0)] {
						before += p
					}
					if pos < 0 || at < before-1e-12 || at > before+kept[pos]+1e-12 {
						t.Fatalf("%s row, %+v: drew %d, by the definition %d (of %d kept)", row.name, r, got, want, len(kept))
					}
					near++
					t.Logf("%s row, %+v: drew %d, by the definition %d, within %.1g of the walk's point", row.name, r, got, want, max(before-at, at-before-kept[pos]))
				}
			}
		}
		if most < n/4 {
			t.Errorf("%s row: the filters kept at most %d tokens, not most of the row", row.name, most)
		}
	}
	if near > draws/20 {
		t.Errorf("%d draws of %d came within rounding of the definition's token but not to it", near, draws)
	}
	inf := float32(math.Inf(1))
	dead := make([]float32, 1000) // every logit -Inf or NaN
	for i := range dead {
		dead[i] = -inf
	}
	dead[3] = float32(math.NaN())
	hot := make([]float32, 1000) // +Inf among finite logits
	for i := range hot {
		hot[i] = float32(rng.NormFloat64())
	}
	hot[3], hot[9], hot[600] = float32(math.NaN()), -inf, inf
	for _, logits := range [][]float32{dead, hot} {
		for _, f := range filters {
			r := f
			r.Temperature, r.U = 1, 0.5
			if got, want := SampleHost(slices.Clone(logits), r, &s), sampleByDefinition(logits, r); got != want {
				t.Errorf("logits %v…, %+v: drew %d, by the definition %d", logits[:4], r, got, want)
			}
		}
	}
}

// TestSampleHostParallel: unfiltered and whole-row top-p draws take the
// same tokens with their pieces spread over goroutines as one by one.
func TestSampleHostParallel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	logits := make([]float32, 100352)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	var one, many SampleScratch
	many.Parallel = func(n int, f func(i int)) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f(i)
			}()
		}
		wg.Wait()
	}
	for d := range 40 {
		r := SampleRow{Temperature: 0.6 + float32(d%4)/5, U: rng.Float64()}
		if d%2 == 1 {
			r.TopP = 0.9
		}
		a := SampleHost(append([]float32(nil), logits...), r, &one)
		b := SampleHost(append([]float32(nil), logits...), r, &many)
		if a != b {
			t.Fatalf("%+v: %d one piece after another, %d in parallel", r, a, b)
		}
	}
}

// FuzzSampleRowAdjust builds draws with penalties and lists from arbitrary
// bytes: a row Validate takes draws a token of the row from logits that
// its list changes (ids outside the row skipped), the list's entries read
// as Penalties.Adjust says, and a row that follows it resolves
// (FollowRows) with the token counted, all without panicking.
func FuzzSampleRowAdjust(f *testing.F) {
	f.Add([]byte{3, 1, 0, 2, 9, 1, 200, 7, 0, 5})
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{255, 255, 255, 255, 255, 255, 128, 1, 2})
	f.Fuzz(func(t *testing.T, raw []byte) {
		at := func(i int) byte {
			if i < len(raw) {
				return raw[i]
			}
			return 0
		}
		r := SampleRow{Temperature: float32(at(0)%4) / 2, TopK: int32(at(1) % 8), U: float64(at(2)) / 256,
			Penalties: Penalties{Repetition: float32(at(3)%5) / 2, Presence: float32(int8(at(4))) / 32, Frequency: float32(int8(at(5))) / 32}}
		for i := 6; i+2 < len(raw) && len(r.Adjust) < 64; i += 3 {
			id := int32(int8(raw[i])) // negative and past the row too
			if slices.ContainsFunc(r.Adjust, func(a LogitAdjust) bool { return a.ID == id }) {
				continue
			}
			r.Adjust = append(r.Adjust, LogitAdjust{ID: id, Seen: raw[i+1]&1 == 1, Count: int32(raw[i+1] >> 1), Bias: float32(int8(raw[i+2])) / 4})
		}
		if r.Validate() != nil {
			return
		}
		logits := make([]float32, 40)
		for i := range logits {
			logits[i] = float32(i%7) - 3
		}
		want := slices.Clone(logits)
		for _, a := range r.Adjust {
			if a.ID >= 0 && int(a.ID) < len(want) {
				want[a.ID] = r.Penalties.Adjust(want[a.ID], a)
			}
		}
		got := slices.Clone(logits)
		AdjustLogits(got, r.Penalties, r.Adjust)
		if !slices.Equal(got, want) {
			t.Fatalf("adjusted %v, want %v", got, want)
		}
		var sc SampleScratch
		id := SampleHost(slices.Clone(logits), r, &sc)
		if id < 0 || int(id) >= len(logits) {
			t.Fatalf("drew %d of %d", id, len(logits))
		}
		next := r
		next.Adjust, next.Follows = nil, true
		res, err := FollowRows([]SampleRow{r}, []int32{id}, []SampleRow{next})
		if err != nil {
			t.Fatal(err)
		}
		if r.Penalties.Active() {
			i := slices.IndexFunc(res[0].Adjust, func(a LogitAdjust) bool { return a.ID == id })
			if i < 0 || !res[0].Adjust[i].Seen || res[0].Adjust[i].Count < 1 {
				t.Fatalf("token %d drawn, the list that follows %+v", id, res[0].Adjust)
			}
		} else if !slices.Equal(res[0].Adjust, r.Adjust) {
			t.Fatalf("a list without penalties changed: %+v to %+v", r.Adjust, res[0].Adjust)
		}
	})
}

// TestArgmaxHost checks the lane-wise argmax against the plain loop over
// rows of many lengths, with ties, NaNs, infinities and rows of nothing
// but -Inf or NaN.
func TestArgmaxHost(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	values := []float32{float32(math.NaN()), float32(math.Inf(-1)), float32(math.Inf(1)), -1, 0, 2, 2, 3}
	for n := range 70 {
		for range 200 {
			row := make([]float32, n)
			for i := range row {
				row[i] = values[r.IntN(len(values))]
				if r.IntN(3) == 0 {
					row[i] = float32(math.NaN())
				}
			}
			if n > 0 && r.IntN(4) == 0 {
				for i := range row {
					row[i] = []float32{float32(math.Inf(-1)), float32(math.NaN())}[r.IntN(2)]
				}
			}
			want := slices.Clone(row)
			for i, l := range want {
				if l != l {
					want[i] = float32(math.Inf(-1))
				}
			}
			best := 0
			for i, l := range want {
				if l > want[best] {
					best = i
				}
			}
			in := slices.Clone(row)
			if got := argmaxHost(in); got != best || !slices.Equal(in, want) {
				t.Fatalf("%v: argmax %d, want %d; row after %v, want %v", row, got, best, in, want)
			}
		}
	}
}

// TestCopyRows copies as copy does, small copies and large ones in pieces
// alike, up to the shorter of the two.
func TestCopyRows(t *testing.T) {
	for _, n := range []int{0, 5, 1 << 18, 1<<18 + 1, 3<<18 + 77} {
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(i)
		}
		for _, m := range []int{n, n + 9, n / 2} {
			dst, want := make([]float32, m), make([]float32, m)
			CopyRows(dst, src)
			copy(want, src)
			if !slices.Equal(dst, want) {
				t.Fatalf("%d into %d: differs from copy", n, m)
			}
		}
	}
}
