package models_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/demo"
)

// TestGreedyMatchesFeedArgmax checks Sequence.Greedy against a loop of
// FeedArgmax calls on every lane: the same tokens, and the sequence left at
// the same length. On devices with a device-side argmax and late reads (the
// CPU and CUDA lanes) Greedy chains the steps on the device and reads each
// token back one step late; elsewhere (the reference lane) it is that loop.
func TestGreedyMatchesFeedArgmax(t *testing.T) {
	var checkpoints []string
	if demo.Embedded() {
		checkpoints = append(checkpoints, "demo")
	}
	if root := shared(t, "fixtures"); root != "" {
		for _, name := range []string{"olmo2", "llama-gqa"} {
			if _, err := os.Stat(filepath.Join(root, name)); err == nil {
				checkpoints = append(checkpoints, filepath.Join(root, name))
			}
		}
	}
	if len(checkpoints) == 0 {
		t.Skip("no demo model (nodemo) and no shared fixtures")
	}
	ctx := context.Background()
	const gen = 20
	prompt := []int32{5, 9, 200, 31, 7}
	for _, ln := range lanes() {
		for _, ck := range checkpoints {
			t.Run(ln.name+"/"+filepath.Base(ck), func(t *testing.T) {
				if ln.slow && ck == "demo" {
					t.Skip("the reference lane runs the small fixtures only")
				}
				dev := ln.open(t)
				defer dev.Close()
				_, argmaxer := dev.(gpu.Argmaxer)
				_, late := dev.(gpu.LateReader)
				if chained := argmaxer && late; chained != (ln.name != "ref") {
					t.Fatalf("lane %s: chained steps %v", ln.name, chained)
				}
				var m *models.Model
				if ck == "demo" {
					b := openDemo(t)
					var err error
					if m, err = models.Load(b.Config, b.Checkpoint, dev, models.Options{CacheDType: ln.cache}); err != nil {
						t.Fatal(err)
					}
				} else {
					m = loadModel(t, ck, dev, models.Options{MaxTokens: 64, CacheDType: ln.cache})
				}
				defer m.Close()
				run := func(greedy bool) ([]int32, int) {
					seq, err := m.NewSequence(len(prompt) + gen + 1)
					if err != nil {
						t.Fatal(err)
					}
					defer seq.Close()
					next, err := seq.FeedArgmax(ctx, prompt)
					if err != nil {
						t.Fatal(err)
					}
					out := []int32{next}
					if greedy {
						err = seq.Greedy(ctx, next, gen, func(id int32) { out = append(out, id) })
					} else {
						for range gen {
							if next, err = seq.FeedArgmax(ctx, []int32{next}); err != nil {
								break
							}
							out = append(out, next)
						}
					}
					if err != nil {
						t.Fatal(err)
					}
					return out, seq.Len()
				}
				want, wantLen := run(false)
				got, gotLen := run(true)
				if !slices.Equal(got, want) || gotLen != wantLen {
					t.Fatalf("Greedy: %v (length %d), FeedArgmax loop: %v (length %d)", got, gotLen, want, wantLen)
				}
				t.Logf("%d tokens equal: %v", len(got), got)
			})
		}
	}
}

// TestGreedyStops checks Greedy's limits on the CPU lane (chained steps):
// more tokens than the sequence holds are refused before any step, and a
// context cancelled between tokens ends it with the context's error.
func TestGreedyStops(t *testing.T) {
	b := openDemo(t)
	var cpuLane *lane
	for _, ln := range lanes() {
		if ln.name == "cpu" {
			cpuLane = &ln
		}
	}
	if cpuLane == nil {
		t.Fatal("no cpu lane")
	}
	dev := cpuLane.open(t)
	defer dev.Close()
	m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	seq, err := m.NewSequence(32)
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	if err := seq.Greedy(context.Background(), 5, 33, func(int32) {}); err == nil || seq.Len() != 0 {
		t.Fatalf("33 tokens into a sequence of 32: error %v, length %d", err, seq.Len())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got []int32
	err = seq.Greedy(ctx, 5, 20, func(id int32) {
		if got = append(got, id); len(got) == 3 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || len(got) != 3 || seq.Len() < 3 || seq.Len() > 4 {
		t.Fatalf("cancelled after 3 tokens: error %v, %d tokens, length %d", err, len(got), seq.Len())
	}
}
