package generate

import (
	"strings"
	"testing"

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
// greedy draw with nothing else read from the logits.
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
		{"logprobs", Params{MaxTokens: 4, Logprobs: true}, false},
		{"top logprobs", Params{MaxTokens: 4, TopLogprobs: 2}, false},
	} {
		if got := New(c.p, nil, nil, nil).Greedy(); got != c.want {
			t.Errorf("%s: Greedy() = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestPenaltiesFollowTheSequence: the repetition penalty reaches each
// distinct token of the prompt and the output once; the frequency and
// presence penalties the output's tokens by their counts, not the prompt's.
func TestPenaltiesFollowTheSequence(t *testing.T) {
	table := []string{"a", "b", "c", "d"}
	s := New(Params{MaxTokens: 8, Params: sample.Params{RepetitionPenalty: 2}}, []int32{1, 1, 1}, nil, &letters{table})
	l := []float32{0, 8, 0, 0}
	if st := s.Next(l); st.ID != 1 || l[1] != 4 {
		t.Errorf("repetition penalty: token %d, logit %v; want 1 and 8/2 (once for three in the prompt)", st.ID, l[1])
	}
	s = New(Params{MaxTokens: 8, Params: sample.Params{PresencePenalty: 1, FrequencyPenalty: 0.5}}, []int32{2, 2}, nil, &letters{table})
	for range 2 {
		s.Accept(3, 0)
	}
	l = []float32{0, 0, 5, 5}
	if st := s.Next(l); st.ID != 2 || l[2] != 5 || l[3] != 5-1-2*0.5 {
		t.Errorf("presence and frequency penalties: token %d, logits %v; want 2, the prompt's token untouched, 3 at 5-1-2·0.5", st.ID, l)
	}
}
