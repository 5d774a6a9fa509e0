package synth

import (
	"testing"

	"github.com/troupe/troupe/models"
)

func TestPresetsParse(t *testing.T) {
	for _, name := range Names("olmo2") {
		raw := presets["olmo2"][name]
		if raw["model_type"] != "olmo2" {
			t.Errorf("%s: model_type %v", name, raw["model_type"])
		}
	}
	if _, err := Write(t.TempDir(), "olmo2", "nope", 1, nil); err == nil {
		t.Error("unknown preset: got no error")
	}
}

// TestWriteLoads writes a small checkpoint and opens it as a model directory.
func TestWriteLoads(t *testing.T) {
	tiny := OLMo2(64, 2, 4, 128)
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
