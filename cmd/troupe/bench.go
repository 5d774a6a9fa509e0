package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/sample"
)

// benchResult is what bench prints.
type benchResult struct {
	Model   string `json:"model"`
	Device  string `json:"device"`
	KVCache string `json:"kv_cache"`
	// CodedWeights counts the matrices also held in the 12-bit code, and
	// Coding names the coding that chose them (--code-weights, auto
	// resolved).
	CodedWeights  int     `json:"coded_weights,omitempty"`
	Coding        string  `json:"code_weights,omitempty"`
	Batch         int     `json:"batch"`
	Prompt        int     `json:"prompt_tokens"`
	Gen           int     `json:"gen_tokens"`
	PrefillSecs   float64 `json:"prefill_seconds"`
	PrefillTokS   float64 `json:"prefill_tokens_per_second"`
	DecodeSecs    float64 `json:"decode_seconds"`
	DecodeTokS    float64 `json:"decode_tokens_per_second"`
	DecodeMSPerTk float64 `json:"decode_ms_per_token"`
	// Sampling describes the draws when they are not greedy.
	Sampling *benchSampling `json:"sampling,omitempty"`
	// Logprobs is --logprobs: the log-probabilities of each step's
	// tokens and of this many most likely tokens, summarized on the device
	// and read back with the tokens, or with RawRows (--raw-rows) taken on
	// the host from the whole rows read back.
	Logprobs int  `json:"logprobs,omitempty"`
	RawRows  bool `json:"raw_rows,omitempty"`
}

// benchSampling is bench's drawing flags.
type benchSampling struct {
	Temperature float32 `json:"temperature"`
	TopK        int     `json:"top_k,omitempty"`
	TopP        float32 `json:"top_p,omitempty"`
	MinP        float32 `json:"min_p,omitempty"`
	Seed        int64   `json:"seed"`
}

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("bench", stderr)
	var o loadOptions
	o.flags(fs)
	prompt := fs.Int("prompt", 512, "prompt tokens to prefill")
	gen := fs.Int("gen", 128, "tokens to decode after the prompt")
	runs := fs.Int("runs", 3, "repetitions; the best is reported")
	batches := batchList{1}
	fs.Var(&batches, "batch", "sequences decoded together (each with its own prompt), or a comma-separated list of counts measured in turn on one load of the model; rates count every sequence's tokens")
	asJSON := fs.Bool("json", false, "print JSON only: one object a batch, a line each")
	var sp sample.Params
	temp := fs.Float64("temperature", 0, "draw tokens at this temperature (0: greedy)")
	fs.IntVar(&sp.TopK, "top-k", 0, "with --temperature, keep the k most likely tokens (0: all)")
	topP := fs.Float64("top-p", 0, "with --temperature, keep the most likely tokens up to this cumulative probability (0: all)")
	minP := fs.Float64("min-p", 0, "with --temperature, drop tokens less likely than this times the most likely (0: none)")
	seed := fs.Int64("seed", 1, "with --temperature, the first sequence's seed (sequence s takes seed+s)")
	logprobs := fs.Int("logprobs", 0, "report the log-probabilities of each token and of this many most likely tokens, as served requests asking for them do: the device summarizes each step's logits rows (0: none)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile (pprof) of the measured runs, the model's load left out, to this file")
	rawRows := fs.Bool("raw-rows", false, "with --logprobs, read each step's whole logits rows back and take the log-probabilities on the host, as served requests whose grammar, penalties or bias change the rows do")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *prompt < 1 || *gen < 1 || *runs < 1 {
		return fmt.Errorf("bench: --prompt, --gen and --runs must be positive")
	}
	if *logprobs < 0 || *logprobs > gpu.MaxSummaryTop {
		return fmt.Errorf("bench: --logprobs %d: want 0 to %d", *logprobs, gpu.MaxSummaryTop)
	}
	if *rawRows && *logprobs == 0 {
		return fmt.Errorf("bench: --raw-rows needs --logprobs")
	}
	sp.Temperature, sp.TopP, sp.MinP = float32(*temp), float32(*topP), float32(*minP)
	if err := sp.Validate(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	o.quiet = *asJSON
	o.maxTokens = max(*prompt, slices.Max(batches))
	l, err := load(ctx, o, stderr)
	if err != nil {
		return err
	}
	defer l.Close()
	if cfg := l.model.Config; *prompt+*gen+2 > cfg.MaxPositions {
		return fmt.Errorf("bench: %d + %d tokens (and two untimed steps) exceed the context length of %d", *prompt, *gen, cfg.MaxPositions)
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer stop()
	}
	b := bench{l: l, prompt: *prompt, gen: *gen, runs: *runs, sampling: sp, seed: *seed, logprobs: *logprobs, rawRows: *rawRows, quiet: *asJSON, sweep: len(batches) > 1, stderr: stderr}
	for _, batch := range batches {
		r, err := b.measure(ctx, batch)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(r); err != nil {
				return err
			}
			continue
		}
		how := "greedy"
		if d := r.Sampling; d != nil {
			how = fmt.Sprintf("drawn at temperature %g", d.Temperature)
		}
		if b.sweep {
			fmt.Fprintf(stdout, "batch %d: ", batch)
		}
		fmt.Fprintf(stdout, "%s on %s, %s KV cache\nprefill  %6d tokens  %10.1f tok/s\ndecode   %6d tokens  %10.1f tok/s  (%.3f ms/token, %s)\n",
			r.Model, r.Device, r.KVCache, r.Prompt, r.PrefillTokS, r.Gen, r.DecodeTokS, r.DecodeMSPerTk, how)
	}
	return nil
}

// batchList is --batch: one count of sequences, or several separated by
// commas, each between 1 and maxBenchBatch.
type batchList []int

func (b *batchList) String() string {
	parts := make([]string, len(*b))
	for i, n := range *b {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func (b *batchList) Set(v string) error {
	var out batchList
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("%q is not a count of sequences", f)
		}
		if n < 1 || n > maxBenchBatch {
			return fmt.Errorf("%d sequences: want 1 to %d", n, maxBenchBatch)
		}
		out = append(out, n)
	}
	*b = out
	return nil
}

// bench measures decoding on a loaded model, batch by batch.
type bench struct {
	l                 *loaded
	prompt, gen, runs int
	sampling          sample.Params // greedy at temperature 0
	seed              int64
	logprobs          int  // --logprobs
	rawRows           bool // --raw-rows
	quiet, sweep      bool // sweep: several batches, each report named
	stderr            io.Writer
}

// measure runs b.runs times over batch sequences of a fixed
// pseudo-random prompt each and reports the best prefill and decode.
func (b *bench) measure(ctx context.Context, batch int) (benchResult, error) {
	l, sp := b.l, b.sampling
	// A fixed pseudo-random prompt, so runs compare.
	rng := rand.New(rand.NewPCG(1, 1))
	prompts := make([][]int32, batch)
	for s := range prompts {
		prompts[s] = make([]int32, b.prompt)
		for i := range prompts[s] {
			prompts[s][i] = int32(rng.IntN(l.model.Config.Vocab))
		}
	}
	r := benchResult{Model: l.bundle.Name, Device: l.dev.Name(), KVCache: l.cache.String(), Batch: batch, Prompt: b.prompt * batch, Gen: b.gen * batch}
	if n, c := l.model.Coded(); n > 0 {
		r.CodedWeights, r.Coding = n, c.String()
	}
	r.Logprobs, r.RawRows = b.logprobs, b.rawRows
	if sp.Temperature > 0 {
		r.Sampling = &benchSampling{Temperature: sp.Temperature, TopK: sp.TopK, TopP: sp.TopP, MinP: sp.MinP, Seed: b.seed}
	}
	if n := l.model.Ranks(); n > 1 {
		r.Device = fmt.Sprintf("%s, tensor parallel over %d GPUs", r.Device, n)
	}
	for run := 0; run < b.runs; run++ {
		var pre, dec time.Duration
		var err error
		var draws []*sample.Sampler
		if sp.Temperature > 0 {
			for s := range batch {
				p := sp
				p.Seed = new(b.seed + int64(s))
				draws = append(draws, sample.New(p))
			}
		}
		if batch == 1 && draws == nil && b.logprobs == 0 {
			pre, dec, err = benchOnce(ctx, l, prompts[0], b.gen)
		} else {
			pre, dec, err = benchBatch(ctx, l, prompts, b.gen, draws, b.logprobs, b.rawRows)
		}
		if err != nil {
			return r, err
		}
		if !b.quiet {
			if b.sweep {
				fmt.Fprintf(b.stderr, "batch %d, ", batch)
			}
			fmt.Fprintf(b.stderr, "run %d/%d: prefill %d tokens in %s (%.0f tok/s), decode %d tokens in %s (%.1f tok/s)\n",
				run+1, b.runs, r.Prompt, pre.Round(time.Microsecond), float64(r.Prompt)/pre.Seconds(), r.Gen, dec.Round(time.Microsecond), float64(r.Gen)/dec.Seconds())
		}
		if run == 0 || pre.Seconds() < r.PrefillSecs {
			r.PrefillSecs = pre.Seconds()
		}
		if run == 0 || dec.Seconds() < r.DecodeSecs {
			r.DecodeSecs = dec.Seconds()
		}
	}
	if err := l.model.GraphError(); err != nil {
		fmt.Fprintf(b.stderr, "bench: steps ran operation by operation: %v\n", err)
	}
	r.PrefillTokS = float64(r.Prompt) / r.PrefillSecs
	r.DecodeTokS = float64(r.Gen) / r.DecodeSecs
	r.DecodeMSPerTk = 1000 * r.DecodeSecs / float64(b.gen) // per step
	return r, nil
}

// maxBenchBatch is the most sequences --batch takes: the model's default
// limit of sequences per step.
const maxBenchBatch = 64

// benchOnce prefills ids and then decodes gen tokens greedily
// (models.Sequence.Greedy: the argmax taken on the device, and each step
// issued before the previous step's token is read, where the device
// allows). Two decode steps before the timed ones record both kinds of
// step on devices that replay recorded steps.
func benchOnce(ctx context.Context, l *loaded, ids []int32, gen int) (prefill, decode time.Duration, err error) {
	seq, err := l.model.NewSequence(len(ids) + gen + 2)
	if err != nil {
		return 0, 0, err
	}
	defer seq.Close()
	start := time.Now()
	next, err := seq.FeedArgmax(ctx, ids)
	if err != nil {
		return 0, 0, err
	}
	prefill = time.Since(start)
	keep := func(id int32) { next = id }
	if err := seq.Greedy(ctx, next, 2, keep); err != nil {
		return 0, 0, err
	}
	start = time.Now()
	if err := seq.Greedy(ctx, next, gen, keep); err != nil {
		return 0, 0, err
	}
	return prefill, time.Since(start), nil
}

// benchBatch prefills each prompt in turn into one shared paged cache, then
// decodes gen tokens of every sequence together, one step per token:
// greedily (draws nil), or drawn by each sequence's sampler; with logprobs,
// every row's logits read back with the tokens and the log-probabilities
// of the chosen and the logprobs most likely tokens taken on the host.
// Where the device chains such steps (models.Model.IssueStep) each is
// queued before the previous one's tokens are read, after two untimed
// steps (benchChained); otherwise each waits for the one before, after one.
func benchBatch(ctx context.Context, l *loaded, prompts [][]int32, gen int, draws []*sample.Sampler, logprobs int, raw bool) (prefill, decode time.Duration, err error) {
	m := l.model
	const blockSize = 16
	B, P := len(prompts), len(prompts[0])
	per := (P + gen + 2 + blockSize - 1) / blockSize // positions up to P+gen+1: two untimed steps where chained
	cache, err := m.NewCache(B*per, blockSize)
	if err != nil {
		return 0, 0, err
	}
	defer cache.Close()
	tables := make([][]int32, B)
	for s := range tables {
		tables[s] = make([]int32, per)
		for i := range tables[s] {
			tables[s][i] = int32(s*per + i)
		}
	}
	next := make([]int32, B)
	step := &models.Batch{}
	start := time.Now()
	for s, ids := range prompts {
		step.Tables = tables[s : s+1]
		step.Tokens = ids
		step.Pos = step.Pos[:0]
		step.Seq = step.Seq[:0]
		for i := range ids {
			step.Pos = append(step.Pos, int32(i))
			step.Seq = append(step.Seq, 0)
		}
		step.Logits = []int32{int32(P - 1)}
		if err := m.ForwardArgmax(ctx, cache, step, next[s:s+1]); err != nil {
			return 0, 0, err
		}
	}
	prefill = time.Since(start)
	step = &models.Batch{Tables: tables, Tokens: next, Pos: make([]int32, B), Seq: make([]int32, B), Logits: make([]int32, B)}
	for s := range B {
		step.Seq[s], step.Logits[s] = int32(s), int32(s)
	}
	var lp benchLogprobs
	if logprobs > 0 {
		step.Read, step.Summaries, step.Top = step.Logits, !raw, logprobs
		lp = benchLogprobs{k: logprobs, width: step.ReadWidth(m.Config.Vocab), raw: raw}
	}
	rows := func() []gpu.SampleRow {
		if draws == nil {
			return nil
		}
		r := make([]gpu.SampleRow, B)
		for s, d := range draws {
			r[s] = d.Row()
		}
		return r
	}
	chain := m.Chains()
	if draws != nil {
		peek := make([]gpu.SampleRow, B)
		for s, d := range draws {
			peek[s] = d.NextRow() // the first step's draws, not taken
		}
		chain = m.ChainsDraws(peek)
	}
	if chain {
		for s := range B {
			step.Pos[s] = int32(P)
		}
		decode, err = benchChained(ctx, m, cache, step, gen, rows, lp)
		return prefill, decode, err
	}
	for t := 0; t <= gen; t++ {
		if t == 1 {
			start = time.Now()
		}
		for s := range B {
			step.Pos[s] = int32(P + t)
		}
		if err := m.ForwardChoose(ctx, cache, step, rows(), next, lp.buf(0, B)); err != nil {
			return 0, 0, err
		}
		if err := lp.take(0, next); err != nil {
			return 0, 0, err
		}
	}
	return prefill, time.Since(start), nil
}

// benchLogprobs takes a step's log-probabilities from its logits rows, or
// their summaries, as a served sequence that asks for the k most likely
// tokens' does; k = 0 takes none.
type benchLogprobs struct {
	k, width int
	raw      bool         // whole rows, not summaries
	rows     [2][]float32 // two steps' rows: one read while the other is taken
}

// buf is the memory of slot i for B rows, or nil without logprobs.
func (l *benchLogprobs) buf(i, B int) []float32 {
	if l.k == 0 {
		return nil
	}
	if len(l.rows[i]) < B*l.width {
		l.rows[i] = make([]float32, B*l.width)
	}
	return l.rows[i]
}

// take computes the log-probabilities of slot i's rows, ids chosen, the
// rows at once, as the scheduler takes them.
func (l *benchLogprobs) take(i int, ids []int32) error {
	if l.k == 0 {
		return nil
	}
	if !l.raw {
		for s := range ids {
			if _, _, _, err := gpu.ReadSummary(l.rows[i][s*l.width:(s+1)*l.width], l.k); err != nil {
				return fmt.Errorf("bench: sequence %d: %w", s, err)
			}
		}
		return nil
	}
	gpu.InParallel(len(ids), func(s int) {
		gpu.LogProbs(l.rows[i][s*l.width:(s+1)*l.width], int(ids[s]), l.k)
	})
	return nil
}

// benchChained decodes gen+2 steps of step (its tokens the first step's,
// its positions that step's), greedy (rows nil) or drawn as rows says,
// each queued before the step before it is read, as a serving shard
// queues them (models.Model.IssueStep), and times the last gen: the first
// two, fed from the host and from the step before, record their graphs.
// The rows step.Read names are read with the tokens and lp takes their
// log-probabilities while the next step runs.
func benchChained(ctx context.Context, m *models.Model, cache *models.Cache, step *models.Batch, gen int, rows func() []gpu.SampleRow, lp benchLogprobs) (time.Duration, error) {
	B := len(step.Tokens)
	var (
		got   = [2][]int32{make([]int32, B), make([]int32, B)}
		wait  [2]func() error
		start time.Time
	)
	for t := 0; t <= gen+1; t++ {
		if t == 2 {
			// Both graphs are recorded once the first step is read.
			if err := wait[1](); err != nil {
				return 0, err
			}
			wait[1] = func() error { return nil }
			start = time.Now()
		}
		var err error
		if wait[t%2], err = m.IssueStep(ctx, cache, step, rows(), t > 0, got[t%2], lp.buf(t%2, B)); err != nil {
			return 0, err
		}
		for s := range B {
			step.Pos[s]++
		}
		if t > 0 {
			if err := wait[(t-1)%2](); err != nil {
				return 0, err
			}
			if err := lp.take((t-1)%2, got[(t-1)%2]); err != nil {
				return 0, err
			}
		}
	}
	if err := wait[(gen+1)%2](); err != nil {
		return 0, err
	}
	if err := lp.take((gen+1)%2, got[(gen+1)%2]); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// startCPUProfile starts writing a CPU profile to path; stop ends it and
// closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
