package models_test

import (
	"context"
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/gpu/ref"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/modeltest"
	"github.com/troupe/troupe/models/safetensors"
)

// reference is a fixture's Hugging Face output.
type reference struct {
	prompt, greedy []int32
	logits         []float32 // [len(prompt), vocab]
	margins        []float32
}

func readReference(t testing.TB, path string) reference {
	t.Helper()
	c, err := safetensors.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	i64 := func(name string) []int32 {
		x, ok := c.Tensor(name)
		if !ok || x.DType != "I64" {
			t.Fatalf("%s: no I64 tensor %s", path, name)
		}
		out := make([]int32, x.Elements())
		for i := range out {
			out[i] = int32(binary.LittleEndian.Uint64(x.Data[8*i:]))
		}
		return out
	}
	f32 := func(name string) []float32 {
		x, ok := c.Tensor(name)
		if !ok || x.DType != "F32" {
			t.Fatalf("%s: no F32 tensor %s", path, name)
		}
		out := make([]float32, x.Elements())
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(x.Data[4*i:]))
		}
		return out
	}
	return reference{prompt: i64("prompt_ids"), greedy: i64("greedy_ids"), logits: f32("logits"), margins: f32("greedy_margins")}
}

// lane is a device to check the models on.
type lane struct {
	name string
	open func(t testing.TB) gpu.Device
	// heavy lanes only run the small fixtures.
	slow bool
	// tol is the largest relative L2 error of logits against the
	// reference (0: 1e-4); margin the top-1/top-2 gap below which a greedy
	// step may differ from the reference (0: greedyTolerance).
	tol, margin float64
	// cache is the KV cache's element type (0: the model's default).
	cache gpu.DType
}

func (ln lane) logitsTol() float64 {
	if ln.tol == 0 {
		return 1e-4
	}
	return ln.tol
}

func (ln lane) greedyMargin() float64 {
	if ln.margin == 0 {
		return greedyTolerance
	}
	return ln.margin
}

func lanes() []lane {
	return append([]lane{{name: "ref", open: func(testing.TB) gpu.Device { return ref.New() }, slow: true}}, extraLanes...)
}

// extraLanes are added by the lanes' own test files.
var extraLanes []lane

func loadModel(t testing.TB, dir string, dev gpu.Device, o models.Options) *models.Model {
	t.Helper()
	cfg, err := models.ReadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	ckpt, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ckpt.Close() })
	m, err := models.Load(cfg, ckpt, dev, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// greedyTolerance is the smallest top-1/top-2 logit gap at which a greedy
// step must agree with the reference.
const greedyTolerance = 1e-3

func TestFixtures(t *testing.T) {
	root := modeltest.MustShared(t, "fixtures")
	for _, name := range []string{"llama-gqa", "olmo2", "qwen3", "qwen3-moe"} {
		for _, ln := range lanes() {
			t.Run(name+"/"+ln.name, func(t *testing.T) {
				dir := filepath.Join(root, name)
				want := readReference(t, filepath.Join(dir, "reference.safetensors"))
				dev := ln.open(t)
				defer dev.Close()
				m := loadModel(t, dir, dev, models.Options{MaxTokens: 64, CacheDType: ln.cache})
				checkFixture(t, m, want, ln)
			})
		}
	}
}

func checkFixture(t *testing.T, m *models.Model, want reference, ln lane) {
	ctx := context.Background()
	V := m.Config.Vocab
	seq, err := m.NewSequence(len(want.prompt) + len(want.greedy))
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	logits, err := seq.Feed(ctx, want.prompt, true)
	if err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for p := range want.prompt {
		e := gputest.RelL2(logits[p*V:(p+1)*V], want.logits[p*V:(p+1)*V])
		worst = math.Max(worst, e)
		t.Logf("pos %d err %.3g", p, e)
		if e > ln.logitsTol() {
			t.Errorf("position %d: logits relative L2 error %.3g, want <= %.3g", p, e, ln.logitsTol())
		}
	}
	t.Logf("worst prompt-position logits error %.3g", worst)
	last := append([]float32(nil), logits[(len(want.prompt)-1)*V:]...)
	for i, w := range want.greedy {
		got := int32(argmax(last))
		if got != w {
			if float64(want.margins[i]) < ln.greedyMargin() {
				t.Logf("step %d: took %d where the reference took %d at a margin of %.2g: a tie", i, got, w, want.margins[i])
				return
			}
			t.Fatalf("step %d: greedy token %d, want %d (margin %.3g)", i, got, w, want.margins[i])
		}
		if i == len(want.greedy)-1 {
			break
		}
		out, err := seq.Feed(ctx, []int32{got}, false)
		if err != nil {
			t.Fatal(err)
		}
		last = append(last[:0], out...)
	}
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
