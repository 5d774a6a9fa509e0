package generate

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models/grammar"
	"github.com/troupe/troupe/models/sample"
)

// Params are a request's generation settings.
type Params struct {
	sample.Params
	// MaxTokens limits the generated tokens (required, > 0).
	MaxTokens int
	// Stop ends generation when the text contains one of these strings;
	// the stop string itself is not emitted.
	Stop []string
	// IgnoreEOS keeps generating past end-of-sequence tokens.
	IgnoreEOS bool
	// Logprobs asks for each token's log-probability; TopLogprobs for the
	// most likely alternatives at each step as well. Both cost a pass over
	// the vocabulary per token.
	Logprobs    bool
	TopLogprobs int
	// PromptLogprobs asks for each prompt token's log-probability after
	// the first (what the model gave it, given the tokens before), with
	// TopLogprobs alternatives; the scheduler takes them from the prompt's
	// own logits rows.
	PromptLogprobs bool
	// Grammar, when set, constrains the output to its documents (JSON
	// mode, a JSON schema): each draw is masked to the tokens that keep
	// the text a prefix of one, and generation stops when the document is
	// whole. Its vocabulary should cover every row of the logits (nil for
	// the rows no token names), so that a draw that carries the bans
	// (Row) bans those rows too.
	Grammar *grammar.Grammar
}

// Validate checks the settings.
func (p Params) Validate() error {
	if p.MaxTokens <= 0 {
		return fmt.Errorf("max_tokens %d must be positive", p.MaxTokens)
	}
	for _, s := range p.Stop {
		if s == "" {
			return fmt.Errorf("empty stop sequence")
		}
	}
	if p.TopLogprobs < 0 || p.TopLogprobs > 20 {
		return fmt.Errorf("top_logprobs %d outside [0, 20]", p.TopLogprobs)
	}
	return p.Params.Validate()
}

// Detokenizer turns ids into text incrementally, emitting only complete
// characters.
type Detokenizer interface {
	Next(id int32) string
	Flush() string
}

// Finish reasons.
const (
	Length = "length"
	Stop   = "stop"
)

// Step is one generated token.
type Step struct {
	ID      int32
	Logprob float32
	TopIDs  []int32
	TopLPs  []float32
	// Text is the text this token completes (possibly empty while a
	// multi-byte character or a possible stop string is pending).
	Text string
	// Reason is set on the last step: Length or Stop.
	Reason string
}

// State is one sequence's generation.
type State struct {
	p       Params
	eos     map[int32]bool
	dec     Detokenizer
	sampler *sample.Sampler
	// adj is what the next draw's penalties and bias know of the tokens
	// (when the params set any), a token at most once, kept as the
	// sequence grows; adjAt is each token's entry.
	adj   []gpu.LogitAdjust
	adjAt map[int32]int
	held  string       // text withheld because it may begin a stop string
	doc   *grammar.Seq // the output's place in Params.Grammar
	// The grammar's bans for the draw after token banAt-1 (banned), and
	// the scratch of a draw among few allowed tokens (Next).
	ban     []int32
	banOK   bool
	banAt   int
	allowed []int32
	compact []float32
	n       int
	done    bool
}

// New starts a generation after prompt.
func New(p Params, prompt []int32, eos []int32, dec Detokenizer) *State {
	s := &State{p: p, eos: map[int32]bool{}, dec: dec, sampler: sample.New(p.Params)}
	if p.Grammar != nil {
		s.doc = p.Grammar.Start()
	}
	for _, id := range eos {
		s.eos[id] = true
	}
	if p.Adjusts() {
		s.adjAt = map[int32]int{}
		for id, b := range p.LogitBias {
			s.entry(id).Bias = b
		}
		if p.Penalties().Repeats() {
			for _, id := range prompt {
				s.entry(id).Seen = true
			}
		}
	}
	return s
}

// entry is token id's entry, added (unseen, no bias) if new.
func (s *State) entry(id int32) *gpu.LogitAdjust {
	i, ok := s.adjAt[id]
	if !ok {
		i = len(s.adj)
		s.adjAt[id] = i
		s.adj = append(s.adj, gpu.LogitAdjust{ID: id})
	}
	return &s.adj[i]
}

// saw counts a token the output gained, where the penalties read the
// output (gpu.SampleRow.Saw, which the devices follow).
func (s *State) saw(id int32) {
	if s.p.Penalties().Active() {
		s.entry(id).Saw()
	}
}

// Done reports whether the generation has finished.
func (s *State) Done() bool { return s.done }

// Generated is the number of tokens produced so far.
func (s *State) Generated() int { return s.n }

// Greedy reports whether the next token is the most likely one of the raw
// logits (no penalty or bias, no grammar): then a device-side argmax may
// choose it (Accept, or RowStep and AcceptStep where Logprobs).
func (s *State) Greedy() bool {
	return s.sampler.Greedy() && !s.p.Adjusts() && s.doc == nil
}

// Drawable reports whether the next token may be drawn where the logits
// are (Row, then Accept, or RowStep and AcceptStep where Logprobs): under a grammar,
// few enough tokens banned for the draw to carry them (maxBanned).
func (s *State) Drawable() bool {
	_, ok := s.banned()
	return ok
}

// Logprobs reports whether the steps report log-probabilities: a token
// chosen where the logits are then comes with its logits row (RowStep).
func (s *State) Logprobs() bool { return s.p.Logprobs || s.p.TopLogprobs > 0 }

// Constrained reports whether a grammar masks the draws: then a draw
// depends on the token before it, and no step is drawn ahead (NextRow).
func (s *State) Constrained() bool { return s.doc != nil }

// maxBanned is the most tokens a grammar may ban for a draw made where
// the logits are; more (outside a JSON string, say, where a few hundred
// tokens may come) and the draw is the host's, over the allowed tokens.
const maxBanned = 8192

// maxCompact is the most tokens a host's draw under a grammar takes apart
// from the row, to draw among them alone.
const maxCompact = 8192

// banned is the tokens the grammar bans from the next draw, and whether
// they are few enough to travel with it (true without a grammar).
func (s *State) banned() ([]int32, bool) {
	if s.doc == nil {
		return nil, true
	}
	if s.banAt != s.n+1 {
		s.ban, s.banOK = s.doc.Banned(maxBanned)
		s.banOK = s.banOK && !s.doc.Stuck() // the host ends a stuck document (Next)
		s.banAt = s.n + 1
	}
	return s.ban, s.banOK
}

// Row is the next token's draw, to be made where the logits are, taking
// the uniform number Next would take, with the penalties and bias that
// the sequence so far gives: the repetition penalty on each distinct
// token of the prompt and the output, the presence and frequency
// penalties by the output's counts, and the bias added after them.
func (s *State) Row() gpu.SampleRow {
	r := s.sampler.Row()
	r.Adjust = slices.Clone(s.adj)
	ban, _ := s.banned()
	inf := float32(math.Inf(-1))
	for _, id := range ban {
		if i, ok := s.adjAt[id]; ok {
			r.Adjust[i].Bias = inf
		} else {
			r.Adjust = append(r.Adjust, gpu.LogitAdjust{ID: id, Bias: inf})
		}
	}
	return r
}

// NextRow is the draw Row makes next, without making it
// (sample.Sampler.NextRow): after a step's Row, the next step's. Its list
// of penalties and bias, which the next token changes, is left to follow
// the step's own (gpu.SampleRow.Follows).
func (s *State) NextRow() gpu.SampleRow {
	r := s.sampler.NextRow()
	r.Follows = s.p.Adjusts()
	return r
}

// Next samples a token from logits (which it may modify) and returns it.
func (s *State) Next(logits []float32) Step {
	if s.doc != nil && s.doc.Stuck() {
		// No token continues the document (it would nest deeper than the
		// grammar goes): end it here, as an end token would.
		s.n++
		s.done = true
		return Step{ID: s.endToken(), Text: s.held + s.dec.Flush(), Reason: Stop}
	}
	var id int32
	logprobs := s.Logprobs()
	if s.doc != nil && s.doc.Mask(logits) <= maxCompact {
		// Few tokens may come: draw among them alone, the adjustments
		// made first on the whole row.
		gpu.AdjustLogits(logits, s.p.Penalties(), s.adj)
		s.allowed = s.doc.AllowedIDs(s.allowed[:0])
		s.compact = s.compact[:0]
		for _, a := range s.allowed {
			s.compact = append(s.compact, logits[a])
		}
		id = s.allowed[s.sampler.Sample(s.compact, nil)]
	} else if logprobs && s.sampler.Greedy() && !s.p.Adjusts() {
		// The greedy choice is the most likely token, which the
		// log-probabilities find in the same read of the row.
		var st Step
		st.ID, st.Logprob, st.TopIDs, st.TopLPs = gpu.ArgmaxLogProbs(logits, s.p.TopLogprobs)
		return s.accept(st)
	} else {
		id = s.sampler.Sample(logits, s.adj)
	}
	st := Step{ID: id}
	if logprobs {
		st.Logprob, st.TopIDs, st.TopLPs = gpu.LogProbs(logits, int(id), s.p.TopLogprobs)
	}
	return s.accept(st)
}

// endToken is the least end token, or 0 without one: the id of a step
// that ends a document the grammar cannot continue.
func (s *State) endToken() int32 {
	id := int32(-1)
	for e := range s.eos {
		if id < 0 || e < id {
			id = e
		}
	}
	return max(id, 0)
}

// Accept records a token chosen elsewhere (by a device-side argmax, say).
func (s *State) Accept(id int32) Step {
	return s.accept(Step{ID: id})
}

// RowStep is the step of token id, chosen elsewhere from logits (the raw
// row, which it modifies), with the log-probabilities Next would report
// from that row: under the grammar's mask, the penalties and the bias.
// It only reads the state, so that several sequences' may be taken at
// once; AcceptStep records it.
func (s *State) RowStep(id int32, logits []float32) Step {
	if s.doc != nil {
		s.doc.Mask(logits)
	}
	gpu.AdjustLogits(logits, s.p.Penalties(), s.adj)
	st := Step{ID: id}
	st.Logprob, st.TopIDs, st.TopLPs = gpu.LogProbs(logits, int(id), s.p.TopLogprobs)
	return st
}

// Summarizable reports whether RowStep would take the log-probabilities
// from the raw row as it is (no grammar's mask, no penalty or bias
// changes it) and report at most gpu.MaxSummaryTop likely tokens: then an
// engine may summarize the row itself (gpu.Summarize) and SummaryStep
// takes the step from that.
func (s *State) Summarizable() bool {
	return s.doc == nil && len(s.adj) == 0 && s.p.TopLogprobs <= gpu.MaxSummaryTop
}

// SummaryStep is RowStep from a summary of the raw row (gpu.Summarize,
// of at least the sequence's TopLogprobs likely tokens), for a sequence
// that is Summarizable.
func (s *State) SummaryStep(id int32, summary []float32) (Step, error) {
	st := Step{ID: id}
	var err error
	st.Logprob, st.TopIDs, st.TopLPs, err = gpu.ReadSummary(summary, s.p.TopLogprobs)
	if err == nil && len(st.TopIDs) < s.p.TopLogprobs && len(summary) < gpu.SummaryWidth(s.p.TopLogprobs) {
		err = fmt.Errorf("a summary of %d values for %d likely tokens", len(summary), s.p.TopLogprobs)
	}
	return st, err
}

// AcceptStep records a token chosen elsewhere with its log-probabilities
// (RowStep).
func (s *State) AcceptStep(st Step) Step { return s.accept(st) }

func (s *State) accept(st Step) Step {
	s.n++
	s.saw(st.ID)
	if s.eos[st.ID] && !s.p.IgnoreEOS {
		st.Text = s.held + s.dec.Flush()
		st.Reason = Stop
		s.done = true
		return s.cutStop(st)
	}
	text := s.held + s.dec.Next(st.ID)
	if s.doc != nil && (s.doc.Accept(st.ID) != nil || s.doc.Done()) {
		// The object closed (or, chosen elsewhere, the token broke it).
		st.Text = text + s.dec.Flush()
		st.Reason = Stop
		s.done = true
		return s.cutStop(st)
	}
	if s.n >= s.p.MaxTokens {
		st.Text = text + s.dec.Flush()
		st.Reason = Length
		s.done = true
		return s.cutStop(st)
	}
	st.Text, s.held = s.split(text)
	if cut := s.cutStop(st); cut.Reason != "" {
		return cut
	}
	return st
}

// cutStop ends the step at the first stop string in its text and withheld text.
func (s *State) cutStop(st Step) Step {
	full := st.Text + s.held
	first := -1
	for _, stop := range s.p.Stop {
		if i := strings.Index(full, stop); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		st.Text, st.Reason, s.held, s.done = full[:first], Stop, "", true
	}
	return st
}

// split divides text into what can be emitted and the longest suffix that
// is a proper prefix of some stop string.
func (s *State) split(text string) (emit, hold string) {
	keep := 0
	for _, stop := range s.p.Stop {
		for k := min(len(stop)-1, len(text)); k > keep; k-- {
			if strings.HasSuffix(text, stop[:k]) {
				keep = k
				break
			}
		}
	}
	return text[:len(text)-keep], text[len(text)-keep:]
}
