package models_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/demo"
)

type demoSample struct {
	Prompt    string  `json:"prompt"`
	PromptIDs []int32 `json:"prompt_ids"`
	GreedyIDs []int32 `json:"greedy_ids"`
	Text      string  `json:"text"`
}

// openDemo opens the embedded demo model, closed when the test ends; a
// build without it (nodemo) skips the test.
func openDemo(t testing.TB) *models.Bundle {
	t.Helper()
	if !demo.Embedded() {
		t.Skip("built without the demo model (nodemo)")
	}
	b, err := models.OpenFS(demo.Name, demo.FS(), demo.Weights())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func demoReference(t testing.TB) []demoSample {
	raw, err := os.ReadFile(filepath.Join("demo", demo.Name, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct{ Samples []demoSample }
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.Samples) != 6 {
		t.Fatalf("reference.json has %d samples, want 6", len(ref.Samples))
	}
	return ref.Samples
}

// TestDemoGreedy reproduces the Hugging Face greedy continuations of the
// embedded model. Divergence is accepted only at a step where the model's
// own top-2 gap is below greedyTolerance.
func TestDemoGreedy(t *testing.T) {
	samples := demoReference(t)
	onFastLanes(t, openDemo(t), func(t *testing.T, ln lane, m *models.Model) {
		for i, s := range samples {
			got := greedy(t, m, s.PromptIDs, len(s.GreedyIDs))
			for j := range s.GreedyIDs {
				if got.ids[j] != s.GreedyIDs[j] {
					if got.margins[j] < ln.greedyMargin() {
						t.Logf("sample %d step %d: tie (margin %.2g)", i, j, got.margins[j])
						break
					}
					t.Fatalf("sample %d (%q) step %d: token %d, want %d (margin %.3g)", i, s.Prompt, j, got.ids[j], s.GreedyIDs[j], got.margins[j])
				}
			}
		}
	})
}

// onFastLanes runs f as a subtest on every lane but the slow reference
// one, with the model of bundle b loaded on the lane's device.
func onFastLanes(t *testing.T, b *models.Bundle, f func(t *testing.T, ln lane, m *models.Model)) {
	for _, ln := range lanes() {
		if ln.slow {
			continue
		}
		t.Run(ln.name, func(t *testing.T) {
			dev := ln.open(t)
			defer dev.Close()
			m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{CacheDType: ln.cache})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			f(t, ln, m)
		})
	}
}

type greedyRun struct {
	ids     []int32
	margins []float64
}

func greedy(t testing.TB, m *models.Model, prompt []int32, n int) greedyRun {
	t.Helper()
	ctx := context.Background()
	seq, err := m.NewSequence(len(prompt) + n)
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	logits, err := seq.Feed(ctx, prompt, false)
	if err != nil {
		t.Fatal(err)
	}
	var r greedyRun
	for i := 0; i < n; i++ {
		best := argmax(logits)
		second := math.Inf(-1)
		for j, v := range logits {
			if j != best {
				second = math.Max(second, float64(v))
			}
		}
		r.ids = append(r.ids, int32(best))
		r.margins = append(r.margins, float64(logits[best])-second)
		if i < n-1 {
			if logits, err = seq.Feed(ctx, []int32{int32(best)}, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	return r
}

// TestLoadProgress: Options.Progress counts the checkpoint's bytes as the
// load takes them, growing with each tensor, to every byte of a whole
// model, and to a stage's share of its layers for a pipeline stage.
func TestLoadProgress(t *testing.T) {
	b := openDemo(t)
	load := func(first, last int) []int64 {
		t.Helper()
		var seen []int64
		dev := openCPU(t)
		defer dev.Close()
		m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{FirstLayer: first, LastLayer: last, Progress: func(n int64) { seen = append(seen, n) }})
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
		for i := 1; i < len(seen); i++ {
			if seen[i] <= seen[i-1] {
				t.Fatalf("progress went %d then %d", seen[i-1], seen[i])
			}
		}
		return seen
	}
	whole := load(0, 0)
	if got, want := whole[len(whole)-1], b.Checkpoint.Bytes(); got != want {
		t.Errorf("a whole model's load took %d bytes of the checkpoint's %d", got, want)
	}
	stage := load(1, 3)
	if got := stage[len(stage)-1]; got <= 0 || got >= b.Checkpoint.Bytes()/2 {
		t.Errorf("layers 1 and 2 alone took %d bytes of %d", got, b.Checkpoint.Bytes())
	}
}
