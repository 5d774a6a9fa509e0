package generate

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models/grammar"
	"github.com/troupe/troupe/models/sample"
)

// letters detokenizes id i as the i-th string of a table.
type letters struct{ table []string }

func (l *letters) Next(id int32) string { return l.table[id] }
func (l *letters) Flush() string        { return "" }

// onehot returns logits that make id the greedy choice.
func onehot(n int, id int32) []float32 {
	v := make([]float32, n)
	v[id] = 10
	return v
}

func run(t *testing.T, p Params, table []string, ids []int32, eos []int32) (string, string, int) {
	t.Helper()
	s := New(p, nil, eos, &letters{table})
	var out strings.Builder
	for _, id := range ids {
		st := s.Next(onehot(len(table), id))
		if st.ID != id {
			t.Fatalf("greedy picked %d, want %d", st.ID, id)
		}
		out.WriteString(st.Text)
		if st.Reason != "" {
			if !s.Done() {
				t.Fatal("finished step but not done")
			}
			return out.String(), st.Reason, s.Generated()
		}
	}
	return out.String(), "", s.Generated()
}

func TestStopsAndLimits(t *testing.T) {
	table := []string{"<eos>", "ab", "c", "d", "e", " END", "E", "ND"}
	for _, c := range []struct {
		name      string
		p         Params
		ids       []int32
		want, why string
		generated int
	}{
		{"length", Params{MaxTokens: 3}, []int32{1, 2, 3, 4}, "abcd", Length, 3},
		{"eos", Params{MaxTokens: 9}, []int32{1, 0, 2}, "ab", Stop, 2},
		{"ignore eos", Params{MaxTokens: 3, IgnoreEOS: true}, []int32{1, 0, 2}, "ab<eos>c", Length, 3},
		{"stop in one token", Params{MaxTokens: 9, Stop: []string{" END"}}, []int32{1, 5, 2}, "ab", Stop, 2},
		{"stop across tokens", Params{MaxTokens: 9, Stop: []string{"END"}}, []int32{1, 6, 7, 2}, "ab", Stop, 3},
		{"partial stop released", Params{MaxTokens: 3, Stop: []string{"EX"}}, []int32{1, 6, 2}, "abEc", Length, 3},
		{"earliest stop wins", Params{MaxTokens: 9, Stop: []string{"d", "c"}}, []int32{1, 2, 3}, "ab", Stop, 2},
		{"stop at the limit", Params{MaxTokens: 2, Stop: []string{"c"}}, []int32{1, 2}, "ab", Stop, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, why, n := run(t, c.p, table, c.ids, []int32{0})
			if got != c.want || why != c.why || n != c.generated {
				t.Errorf("got %q (%s, %d tokens), want %q (%s, %d)", got, why, n, c.want, c.why, c.generated)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Params{{}, {MaxTokens: 1, Stop: []string{""}}, {MaxTokens: 1, TopLogprobs: 21}} {
		if p.Validate() == nil {
			t.Errorf("%+v: got no error", p)
		}
	}
	if err := (Params{MaxTokens: 5, Stop: []string{"x"}}).Validate(); err != nil {
		t.Error(err)
	}
}

// TestGreedy says when a device-side argmax may choose the next token: a
// greedy draw of the raw logits, whose log-probabilities, when asked for,
// come from its row (RowStep).
func TestGreedy(t *testing.T) {
	for _, c := range []struct {
		name string
		p    Params
		want bool
	}{
		{"greedy", Params{MaxTokens: 4}, true},
		{"penalty 1", Params{MaxTokens: 4, Params: sample.Params{RepetitionPenalty: 1}}, true},
		{"temperature", Params{MaxTokens: 4, Params: sample.Params{Temperature: 0.7}}, false},
		{"penalty", Params{MaxTokens: 4, Params: sample.Params{RepetitionPenalty: 1.2}}, false},
		{"presence", Params{MaxTokens: 4, Params: sample.Params{PresencePenalty: 0.5}}, false},
		{"frequency", Params{MaxTokens: 4, Params: sample.Params{FrequencyPenalty: -0.5}}, false},
		{"bias", Params{MaxTokens: 4, Params: sample.Params{LogitBias: map[int32]float32{3: 1}}}, false},
		{"logprobs", Params{MaxTokens: 4, Logprobs: true}, true},
		{"top logprobs", Params{MaxTokens: 4, TopLogprobs: 2}, true},
	} {
		s := New(c.p, nil, nil, nil)
		if got := s.Greedy(); got != c.want {
			t.Errorf("%s: Greedy() = %v, want %v", c.name, got, c.want)
		}
		if got, want := s.Logprobs(), c.p.Logprobs || c.p.TopLogprobs > 0; got != want {
			t.Errorf("%s: Logprobs() = %v, want %v", c.name, got, want)
		}
	}
}

// TestAdjustmentsFollowTheSequence: the draw's changes at every step equal
// a float64 oracle's: the repetition penalty on each distinct token of the
// prompt and the output once, the presence and frequency penalties by the
// output's counts (the prompt's do not count), then the bias; and the host
// draw (Next) uses them as the device's (Row) would; and each step's list
// is the one before after its token, as a device that keeps the lists
// updates them for a draw that follows (gpu.FollowRows, NextRow).
func TestAdjustmentsFollowTheSequence(t *testing.T) {
	const vocab = 12
	table := make([]string, vocab)
	for i := range table {
		table[i] = string(rune('a' + i))
	}
	prompt := []int32{1, 1, 4, 9, 1}
	out := []int32{4, 7, 4, 4, 2, 7}
	for _, p := range []sample.Params{
		{RepetitionPenalty: 1.3},
		{PresencePenalty: 0.7, FrequencyPenalty: 0.4},
		{FrequencyPenalty: -0.6, LogitBias: map[int32]float32{2: 3, 9: -100, 5: 0.25}},
		{RepetitionPenalty: 0.8, PresencePenalty: -1.5, FrequencyPenalty: 2, LogitBias: map[int32]float32{4: 1.5, 11: -2}},
	} {
		s := New(Params{MaxTokens: 64, Params: p}, prompt, nil, &letters{table})
		var followed gpu.SampleRow
		for step := 0; step <= len(out); step++ {
			raw := make([]float32, vocab)
			for i := range raw {
				raw[i] = float32(i%5) - 1.7 + float32(step)*0.1
			}
			want := oracle(p, raw, prompt, out[:step])
			got := append([]float32(nil), raw...)
			row := s.Row()
			if step > 0 && !row.Equal(followed) {
				t.Fatalf("%+v, step %d: the draw %+v, following the step before %+v", p, step, row, followed)
			}
			gpu.AdjustLogits(got, row.Penalties, row.Adjust)
			for i := range want {
				if d := math.Abs(float64(got[i]) - want[i]); d > 1e-5*max(1, math.Abs(want[i])) {
					t.Fatalf("%+v, step %d: logit %d = %v, oracle %v", p, step, i, got[i], want[i])
				}
			}
			if step == len(out) {
				break
			}
			next := s.NextRow()
			if !next.Follows || next.Adjust != nil {
				t.Fatalf("%+v, step %d: the next draw %+v does not follow this one", p, step, next)
			}
			s.Accept(out[step])
			f, err := gpu.FollowRows([]gpu.SampleRow{row}, out[step:step+1], []gpu.SampleRow{next})
			if err != nil {
				t.Fatal(err)
			}
			followed = f[0]
		}
	}
}

// oracle is the adjusted logits in float64.
func oracle(p sample.Params, raw []float32, prompt, out []int32) []float64 {
	seen, count := map[int32]bool{}, map[int32]int{}
	for _, id := range prompt {
		seen[id] = true
	}
	for _, id := range out {
		seen[id] = true
		count[id]++
	}
	l := make([]float64, len(raw))
	for i, x := range raw {
		v := float64(x)
		if rp := float64(p.RepetitionPenalty); rp > 0 && rp != 1 && seen[int32(i)] {
			if v > 0 {
				v /= rp
			} else {
				v *= rp
			}
		}
		if c := count[int32(i)]; c > 0 {
			v -= float64(p.PresencePenalty) + float64(c)*float64(p.FrequencyPenalty)
		}
		l[i] = v + float64(p.LogitBias[int32(i)])
	}
	return l
}

// TestNextDrawsAdjusted: the host draw (Next) applies the same changes, so
// a bias can force the token and a presence penalty steer away from one.
func TestNextDrawsAdjusted(t *testing.T) {
	table := []string{"a", "b", "c", "d"}
	s := New(Params{MaxTokens: 8, Params: sample.Params{PresencePenalty: 2}}, []int32{2, 2}, nil, &letters{table})
	l := []float32{0, 0, 5, 4}
	if st := s.Next(l); st.ID != 2 {
		t.Errorf("the prompt's tokens are not penalised: got %d, want 2", st.ID)
	}
	if st := s.Next([]float32{0, 0, 5, 4}); st.ID != 3 {
		t.Errorf("presence penalty 2 after token 2: got %d, want 3", st.ID)
	}
	s = New(Params{MaxTokens: 8, Params: sample.Params{LogitBias: map[int32]float32{0: 100}}}, nil, nil, &letters{table})
	if st := s.Next([]float32{-50, 0, 5, 4}); st.ID != 0 {
		t.Errorf("logit_bias 100: got %d, want 0", st.ID)
	}
}

// JSON mode keeps the output one JSON object whatever the logits favour,
// and stops when it closes, before the token limit and the end token.
func TestJSONMode(t *testing.T) {
	var table []string
	for c := range 256 {
		table = append(table, string([]byte{byte(c)}))
	}
	table = append(table, "\x00Sure!", `{"`, `ok`, `": `, `true`, `}`, `}}`, "<eos>")
	vocab := make([][]byte, len(table))
	for id, s := range table[:len(table)-1] {
		vocab[id] = []byte(s)
	}
	eos := int32(len(table) - 1)
	v, err := grammar.NewVocab(vocab)
	if err != nil {
		t.Fatal(err)
	}
	if New(Params{MaxTokens: 5, Grammar: v.JSON()}, []int32{1}, nil, &letters{table}).Greedy() {
		t.Fatal("a grammar's greedy draw taken for the raw logits' argmax")
	}
	var sc gpu.SampleScratch
	for _, where := range []string{"host", "device"} {
		for _, temp := range []float32{0, 0.8} {
			seed := int64(7)
			p := Params{Params: sample.Params{Temperature: temp, Seed: &seed, LogitBias: map[int32]float32{256: 1, 257: 1}},
				MaxTokens: 50, Grammar: v.JSON()}
			g := New(p, []int32{1}, []int32{eos}, &letters{table})
			if g.Greedy() || !g.Constrained() {
				t.Fatal("a JSON-mode draw must be masked")
			}
			var out strings.Builder
			var last Step
			// The logits favour a control character and the end token over
			// the object's next piece, and at the end a closer too many.
			want := []int32{257, 258, 259, 260, 261}
			for i := 0; !g.Done() && i < len(want); i++ {
				logits := make([]float32, len(table))
				logits[256], logits[eos], logits[want[i]] = 30, 29, 20
				if i == len(want)-1 {
					logits[262] = 28 // "}}" closes one object too many
				}
				if where == "host" {
					last = g.Next(logits)
				} else {
					// As a device draws: the row carries the bans, merged
					// with the bias (one entry a token).
					if !g.Drawable() {
						t.Fatalf("step %d: a few hundred bans do not travel with the draw", i)
					}
					row := g.Row()
					seen := map[int32]bool{}
					for _, a := range row.Adjust {
						if seen[a.ID] || (a.ID == 257) != !math.IsInf(float64(a.Bias), -1) && i == 0 {
							t.Fatalf("step %d: adjustment %+v (repeated %v)", i, a, seen[a.ID])
						}
						seen[a.ID] = true
					}
					if !seen[eos] {
						t.Fatalf("step %d: the end token, which has no bytes, is not banned", i)
					}
					last = g.Accept(gpu.SampleHost(logits, row, &sc))
				}
				out.WriteString(last.Text)
			}
			if last.Reason != Stop || out.String() != `{"ok": true}` || g.Generated() != 5 || !g.Done() {
				t.Fatalf("%s, temperature %v: %q after %d tokens (%s), want {\"ok\": true} and stop", where, temp, out.String(), g.Generated(), last.Reason)
			}
		}
	}
}

// A schema whose documents nest deeper than the grammar goes ends the
// generation where no token can continue, with the text so far.
func TestGrammarStuck(t *testing.T) {
	var table []string
	for c := range 256 {
		table = append(table, string([]byte{byte(c)}))
	}
	vocab := make([][]byte, len(table)+1) // and an end token, without bytes
	for id, s := range table {
		vocab[id] = []byte(s)
	}
	table = append(table, "")
	eos := int32(len(table) - 1)
	schema := strings.Repeat(`{"type":"object","properties":{"a":`, 130) + "{}" + strings.Repeat(`},"required":["a"]}`, 130)
	s, err := grammar.CompileSchema([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	v, err := grammar.NewVocab(vocab)
	if err != nil {
		t.Fatal(err)
	}
	g := New(Params{MaxTokens: 2000, Grammar: v.Schema(s)}, []int32{1}, []int32{eos}, &letters{table})
	var out strings.Builder
	var last Step
	for !g.Done() {
		logits := make([]float32, len(vocab))
		for _, c := range `{"a:` {
			logits[c] = 1 // no blanks
		}
		last = g.Next(logits)
		out.WriteString(last.Text)
	}
	// 128 objects open, the last one's value cannot: the blanks the grammar
	// allows, then the end.
	if want := strings.Repeat(`{"a":`, 127) + `{"a"` + strings.Repeat("\t", 20); last.Reason != Stop || last.ID != eos || out.String() != want {
		t.Fatalf("%q (%s, token %d), want %q and stop", out.String(), last.Reason, last.ID, want)
	}
}

// A token chosen where the logits are and accepted with its raw row
// (RowStep, AcceptStep) reports what Next reports from that row: the same token, text
// and log-probabilities, under penalties, bias and a grammar's mask.
func TestRowStepMatchesNext(t *testing.T) {
	var table []string
	for c := range 256 {
		table = append(table, string([]byte{byte(c)}))
	}
	table = append(table, "<eos>")
	eos := int32(len(table) - 1)
	vocab := make([][]byte, len(table))
	for id, s := range table[:len(table)-1] {
		vocab[id] = []byte(s)
	}
	v, err := grammar.NewVocab(vocab)
	if err != nil {
		t.Fatal(err)
	}
	seed := int64(3)
	cases := map[string]Params{
		"greedy, logprobs": {Logprobs: true, TopLogprobs: 3},
		"drawn, penalties and bias": {Logprobs: true, TopLogprobs: 5, Params: sample.Params{Temperature: 0.8, TopK: 40, Seed: &seed,
			PresencePenalty: 1.5, FrequencyPenalty: 0.5, RepetitionPenalty: 1.3, LogitBias: map[int32]float32{'a': 4, 'b': -100}}},
		"greedy, a grammar": {TopLogprobs: 2, Grammar: v.JSON()},
		"drawn, a grammar":  {Logprobs: true, Grammar: v.JSON(), Params: sample.Params{Temperature: 1.1, Seed: &seed}},
	}
	for name, p := range cases {
		p.MaxTokens = 40
		host, dev := New(p, []int32{'x', 'y'}, []int32{eos}, &letters{table}), New(p, []int32{'x', 'y'}, []int32{eos}, &letters{table})
		if !dev.Logprobs() || !dev.Drawable() || dev.Greedy() != (p.Temperature == 0 && p.Grammar == nil) {
			t.Fatalf("%s: logprobs %v, drawable %v, greedy %v", name, dev.Logprobs(), dev.Drawable(), dev.Greedy())
		}
		rng := rand.New(rand.NewPCG(1, uint64(len(name))))
		var sc gpu.SampleScratch
		steps := 0
		for !host.Done() {
			logits := make([]float32, len(table))
			for i := range logits {
				logits[i] = float32(rng.NormFloat64() * 3)
			}
			want := host.Next(slices.Clone(logits))
			if !dev.Drawable() {
				t.Fatalf("%s: step %d not drawable", name, steps)
			}
			// As a device chooses: the draw's row, the logits left as they are.
			id := gpu.SampleHost(slices.Clone(logits), dev.Row(), &sc)
			got := dev.AcceptStep(dev.RowStep(id, logits))
			if got.ID != want.ID || got.Text != want.Text || got.Reason != want.Reason || got.Logprob != want.Logprob ||
				!slices.Equal(got.TopIDs, want.TopIDs) || !slices.Equal(got.TopLPs, want.TopLPs) {
				t.Fatalf("%s: step %d: RowStep %+v, Next %+v", name, steps, got, want)
			}
			steps++
		}
		if steps < 2 || !dev.Done() {
			t.Fatalf("%s: %d steps, done %v", name, steps, dev.Done())
		}
	}
}
