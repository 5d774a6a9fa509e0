package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"time"
)

// benchResult is what bench prints.
type benchResult struct {
	Model         string  `json:"model"`
	Device        string  `json:"device"`
	Prompt        int     `json:"prompt_tokens"`
	Gen           int     `json:"gen_tokens"`
	PrefillSecs   float64 `json:"prefill_seconds"`
	PrefillTokS   float64 `json:"prefill_tokens_per_second"`
	DecodeSecs    float64 `json:"decode_seconds"`
	DecodeTokS    float64 `json:"decode_tokens_per_second"`
	DecodeMSPerTk float64 `json:"decode_ms_per_token"`
}

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("bench", stderr)
	var o loadOptions
	fs.StringVar(&o.model, "model", "", "model directory (default: the embedded demo model)")
	fs.StringVar(&o.device, "device", "cpu", "compute lane: cpu, cuda or ref")
	fs.IntVar(&o.threads, "threads", 0, "CPU threads (0: all)")
	prompt := fs.Int("prompt", 512, "prompt tokens to prefill")
	gen := fs.Int("gen", 128, "tokens to decode after the prompt")
	runs := fs.Int("runs", 3, "repetitions; the best is reported")
	asJSON := fs.Bool("json", false, "print JSON only")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *prompt < 1 || *gen < 1 || *runs < 1 {
		return fmt.Errorf("bench: --prompt, --gen and --runs must be positive")
	}
	o.quiet = *asJSON
	o.maxTokens = *prompt
	l, err := load(ctx, o, stderr)
	if err != nil {
		return err
	}
	defer l.Close()
	cfg := l.model.Config
	if *prompt+*gen > cfg.MaxPositions {
		return fmt.Errorf("bench: %d + %d tokens exceed the context length of %d", *prompt, *gen, cfg.MaxPositions)
	}
	// A fixed pseudo-random prompt, so runs compare.
	rng := rand.New(rand.NewPCG(1, 1))
	ids := make([]int32, *prompt)
	for i := range ids {
		ids[i] = int32(rng.IntN(cfg.Vocab))
	}
	r := benchResult{Model: l.bundle.Name, Device: l.dev.Name(), Prompt: *prompt, Gen: *gen}
	for run := 0; run < *runs; run++ {
		pre, dec, err := benchOnce(ctx, l, ids, *gen)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if !*asJSON {
			fmt.Fprintf(stderr, "run %d/%d: prefill %d tokens in %s (%.0f tok/s), decode %d tokens in %s (%.1f tok/s)\n",
				run+1, *runs, *prompt, pre.Round(time.Microsecond), float64(*prompt)/pre.Seconds(), *gen, dec.Round(time.Microsecond), float64(*gen)/dec.Seconds())
		}
		if run == 0 || pre.Seconds() < r.PrefillSecs {
			r.PrefillSecs = pre.Seconds()
		}
		if run == 0 || dec.Seconds() < r.DecodeSecs {
			r.DecodeSecs = dec.Seconds()
		}
	}
	r.PrefillTokS = float64(*prompt) / r.PrefillSecs
	r.DecodeTokS = float64(*gen) / r.DecodeSecs
	r.DecodeMSPerTk = 1000 * r.DecodeSecs / float64(*gen)
	if *asJSON {
		return json.NewEncoder(stdout).Encode(r)
	}
	fmt.Fprintf(stdout, "%s on %s\nprefill  %6d tokens  %10.1f tok/s\ndecode   %6d tokens  %10.1f tok/s  (%.3f ms/token)\n",
		r.Model, r.Device, r.Prompt, r.PrefillTokS, r.Gen, r.DecodeTokS, r.DecodeMSPerTk)
	return nil
}

// benchOnce prefills ids and then decodes gen tokens greedily.
func benchOnce(ctx context.Context, l *loaded, ids []int32, gen int) (prefill, decode time.Duration, err error) {
	seq, err := l.model.NewSequence(len(ids) + gen)
	if err != nil {
		return 0, 0, err
	}
	defer seq.Close()
	start := time.Now()
	logits, err := seq.Feed(ctx, ids, false)
	if err != nil {
		return 0, 0, err
	}
	prefill = time.Since(start)
	start = time.Now()
	for i := 0; i < gen; i++ {
		next := int32(argmax(logits))
		if logits, err = seq.Feed(ctx, []int32{next}, false); err != nil {
			return 0, 0, err
		}
	}
	return prefill, time.Since(start), nil
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}
