package synth

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/troupe/troupe/models"
)

// TestPresetsParse: every preset parses as its architecture and holds
// within 1% of the published model's parameters; unknown names and layer
// counts are refused.
func TestPresetsParse(t *testing.T) {
	published := map[string]float64{ // billions of parameters, embeddings included
		"olmo2/1b": 1.485, "olmo2/7b": 7.299, "olmo2/13b": 13.716, "olmo2/70b": 70.1,
		"llama/1b": 1.236, "llama/3b": 3.213, "llama/8b": 8.030,
		"qwen3/0.6b": 0.596, "qwen3/1.7b": 1.72, "qwen3/8b": 8.19,
		"qwen3moe/30b-a3b": 30.5,
	}
	n := 0
	for _, arch := range Archs() {
		for _, name := range Names(arch) {
			n++
			raw, err := json.Marshal(presets[arch][name])
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := models.ParseConfig(raw)
			if err != nil {
				t.Fatalf("%s %s: %v", arch, name, err)
			}
			want, ok := published[arch+"/"+name]
			if got := float64(models.Params(cfg)) / 1e9; !ok || math.Abs(got-want) > 0.01*want {
				t.Errorf("%s %s: %.3fB parameters, published %.3fB", arch, name, got, want)
			}
		}
	}
	if n != len(published) {
		t.Errorf("%d presets, %d published counts", n, len(published))
	}
	for _, c := range []struct {
		arch, preset string
		layers       int
	}{{"olmo2", "nope", 0}, {"gpt2", "1b", 0}, {"llama", "1b", 17}, {"llama", "1b", -1}} {
		if _, err := Write(t.TempDir(), c.arch, c.preset, c.layers, 1, nil); err == nil {
			t.Errorf("%s %s with %d layers: no error", c.arch, c.preset, c.layers)
		}
	}
}

// TestWriteLoads writes a small checkpoint of each architecture and opens
// it as a model directory.
func TestWriteLoads(t *testing.T) {
	for name, tiny := range map[string]Preset{
		"olmo2": OLMo2(64, 2, 4, 128), "llama": Llama(64, 2, 4, 2, 16, 128, true, 8),
		"qwen3": Qwen3(64, 2, 4, 2, 128, false), "qwen3moe": Qwen3MoE(64, 2, 4, 2, 32, 8, 2),
	} {
		t.Run(name, func(t *testing.T) { writeLoads(t, tiny) })
	}
}

func writeLoads(t *testing.T, tiny Preset) {
	tiny["vocab_size"] = 500
	dir := t.TempDir()
	var calls int
	cfg, err := tiny.Write(dir, 1, func(w, total int64) {
		calls++
		if w > total {
			t.Errorf("progress %d of %d", w, total)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls == 0 {
		t.Error("no progress reported")
	}
	b, err := models.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got, want := models.Params(b.Config), models.Params(cfg); got != want || got == 0 {
		t.Errorf("params %d, want %d", got, want)
	}
	if b.Config.Vocab != 500 || b.Config.Hidden != 64 {
		t.Errorf("config %+v, want a vocabulary of 500 and width 64", b.Config)
	}
}
