package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"github.com/troupe/troupe/models"
)

// report is what inspect prints.
type report struct {
	Model        string           `json:"model"`
	Architecture string           `json:"architecture"`
	ModelType    string           `json:"model_type"`
	Summary      string           `json:"summary"`
	Parameters   int64            `json:"parameters"`
	DTypes       map[string]int64 `json:"dtypes"` // parameters per dtype
	WeightBytes  int64            `json:"weight_bytes"`
	KVBytesPer   int64            `json:"kv_bytes_per_token"`
	Context      int              `json:"context_length"`
	MemoryBytes  int64            `json:"memory_bytes"` // weights + a full context of KV (bf16)
	Tokenizer    bool             `json:"tokenizer"`
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
	b, err := openBundle(ctx, *model, progress)
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	defer b.Close()
	r := inspect(b)
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
	fmt.Fprintf(stdout, "weights       %s\n", bytesOf(r.WeightBytes))
	fmt.Fprintf(stdout, "kv cache      %s per token (bf16), %s for the full context of %d\n", bytesOf(r.KVBytesPer), bytesOf(r.KVBytesPer*int64(r.Context)), r.Context)
	fmt.Fprintf(stdout, "memory needed %s for one sequence at full context\n", bytesOf(r.MemoryBytes))
	fmt.Fprintf(stdout, "tokenizer     %v\n", r.Tokenizer)
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
		r.WeightBytes += int64(len(t.Data))
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
