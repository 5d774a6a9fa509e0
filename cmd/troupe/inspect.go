package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/hub"
	"github.com/troupe/troupe/models/safetensors"
)

// report is what inspect prints.
type report struct {
	Model        string           `json:"model"`
	Architecture string           `json:"architecture"`
	ModelType    string           `json:"model_type"`
	Summary      string           `json:"summary"`
	Parameters   int64            `json:"parameters"`
	DTypes       map[string]int64 `json:"dtypes"`                 // parameters per dtype
	Quantization string           `json:"quantization,omitempty"` // a quantized checkpoint's scheme, as loaded
	WeightBytes  int64            `json:"weight_bytes"`           // once loaded: fp8 weights dequantized to bf16
	KVBytesPer   int64            `json:"kv_bytes_per_token"`
	Context      int              `json:"context_length"`
	MemoryBytes  int64            `json:"memory_bytes"` // weights + a full context of KV (bf16)
	Tokenizer    bool             `json:"tokenizer"`
	// Peeked: a Hugging Face repository read without its weights (its
	// configs and its safetensors headers).
	Peeked bool `json:"peeked,omitempty"`
}

func cmdInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("inspect", stderr)
	model := fs.String("model", "", modelUsage)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var progress io.Writer = stderr
	if *asJSON {
		progress = nil
	}
	b, peeked, err := peekBundle(ctx, *model, progress)
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	defer b.Close()
	r := inspect(b)
	r.Peeked = peeked
	if *asJSON {
		return json.NewEncoder(stdout).Encode(r)
	}
	fmt.Fprintf(stdout, "model         %s\n", r.Model)
	fmt.Fprintf(stdout, "architecture  %s (%s)\n", r.Architecture, r.ModelType)
	fmt.Fprintf(stdout, "shape         %s\n", r.Summary)
	fmt.Fprintf(stdout, "parameters    %s\n", count(r.Parameters))
	keys := make([]string, 0, len(r.DTypes))
	for k := range r.DTypes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(stdout, "  %-11s %s\n", k, count(r.DTypes[k]))
	}
	if r.Quantization != "" {
		fmt.Fprintf(stdout, "quantization  %s\n", r.Quantization)
	}
	fmt.Fprintf(stdout, "weights       %s\n", bytesOf(r.WeightBytes))
	fmt.Fprintf(stdout, "kv cache      %s per token (bf16), %s for the full context of %d\n", bytesOf(r.KVBytesPer), bytesOf(r.KVBytesPer*int64(r.Context)), r.Context)
	fmt.Fprintf(stdout, "memory needed %s for one sequence at full context\n", bytesOf(r.MemoryBytes))
	fmt.Fprintf(stdout, "tokenizer     %v\n", r.Tokenizer)
	if r.Peeked {
		fmt.Fprintln(stdout, "read          configs and safetensors headers (no weights fetched)")
	}
	fmt.Fprintln(stdout, "supported     yes")
	return nil
}

func inspect(b *models.Bundle) report {
	c := b.Config
	r := report{
		Model: b.Name, Architecture: c.Architecture, ModelType: string(c.Arch), Summary: c.Describe(),
		Parameters: models.Params(c), DTypes: map[string]int64{}, Context: c.MaxPositions, Tokenizer: b.Tokenizer != nil,
	}
	for _, w := range models.Expected(c) {
		t, _ := b.Checkpoint.Tensor(w.Name)
		r.DTypes[t.DType] += int64(t.Elements())
	}
	r.WeightBytes = models.LoadedBytes(c, b.Checkpoint)
	if c.Quant != nil {
		r.Quantization = c.Quant.String()
	}
	r.KVBytesPer = int64(2*c.Layers*c.KVHeads*c.HeadDim) * 2
	r.MemoryBytes = r.WeightBytes + r.KVBytesPer*int64(c.MaxPositions)
	return r
}

func count(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	}
	return fmt.Sprint(n)
}

func bytesOf(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// peekBundle opens what --model names to describe it, fetching no
// weights: as openBundle does, but a Hugging Face repository the cache
// does not hold is read without its weights (peeked), for inspect and
// tokenize.
func peekBundle(ctx context.Context, spec string, progress io.Writer) (*models.Bundle, bool, error) {
	// A folder, the demo, a path that is no repository, or a repository
	// the cache holds whole: as openBundle opens it.
	c := hub.FromEnv(os.LookupEnv)
	repo, rev, perr := hub.ParseRef(spec)
	_, serr := os.Stat(spec)
	if perr != nil || serr == nil {
		b, err := openBundle(ctx, spec, progress)
		return b, false, err
	}
	if _, err := c.Cached(repo, rev); err == nil {
		b, err := openBundle(ctx, spec, progress)
		return b, false, err
	}
	remote, err := c.Peek(ctx, repo, rev)
	if err != nil {
		return nil, false, err
	}
	var headers []map[string]*safetensors.Tensor
	for name, h := range remote.Headers {
		ts, err := safetensors.ParseHeader(h.Prefix, h.Size)
		if err != nil {
			return nil, false, fmt.Errorf("%s: %s: %w", spec, name, err)
		}
		headers = append(headers, ts)
	}
	ckpt, err := safetensors.FromHeaders(headers...)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", spec, err)
	}
	// The small files, for the bundle to read (it keeps what it reads).
	dir, err := os.MkdirTemp("", "troupe-inspect-")
	if err != nil {
		return nil, false, err
	}
	defer os.RemoveAll(dir)
	for name, b := range remote.Files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return nil, false, err
		}
	}
	b, err := models.OpenWith(repo, os.DirFS(dir), ckpt)
	return b, true, err
}
