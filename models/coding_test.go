package models_test

import (
	"encoding/json"
	"testing"

	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/synth"
)

func presetConfig(t *testing.T, p synth.Preset) *models.Config {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := models.ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The twins' memory by coding, for OLMo 2's 1B and 7B shapes: all codes
// only the products of at least 2^24 weights that a kernel takes.
func TestTwinBytes(t *testing.T) {
	twin := func(rows, k int) int64 { return int64(rows) * int64(k) * 2 / 4 * 3 }
	for _, c := range []struct {
		name          string
		cfg           *models.Config
		head, all     int64
		auto, autoLow models.Coding
	}{
		// 1B: q|k|v (6,144 × 2,048) and o (2,048²) are too small; gate|up
		// and down are coded.
		{"1b", presetConfig(t, synth.OLMo2(2048, 16, 16, 8192)), twin(100352, 2048),
			twin(100352, 2048) + 16*(twin(16384, 2048)+twin(2048, 8192)), models.CodeAll, models.CodeHead},
		// 7B: q|k|v, o (4,096², exactly 2^24) and gate|up; down's k, 11,008,
		// no kernel takes.
		{"7b", presetConfig(t, synth.OLMo2(4096, 32, 32, 11008)), twin(100352, 4096),
			twin(100352, 4096) + 32*(twin(12288, 4096)+twin(4096, 4096)+twin(22016, 4096)), models.CodeAll, models.CodeHead},
	} {
		c.cfg.Vocab = 100352
		dev := gputest.Coder{}
		for _, w := range []struct {
			coding models.Coding
			want   int64
		}{{models.CodeNone, 0}, {models.CodeHead, c.head}, {models.CodeAll, c.all}} {
			if got := models.TwinBytes(c.cfg, w.coding, dev); got != w.want {
				t.Errorf("%s %s: %d bytes of twins, want %d", c.name, w.coding, got, w.want)
			}
		}
		if got := models.CodeAuto.Resolve(c.cfg, dev, 8*c.all); got != c.auto {
			t.Errorf("%s: auto with 8× the twins free resolved to %s, want %s", c.name, got, c.auto)
		}
		if got := models.CodeAuto.Resolve(c.cfg, dev, 8*c.all-8); got != c.autoLow {
			t.Errorf("%s: auto with less than 8× the twins free resolved to %s, want %s", c.name, got, c.autoLow)
		}
		for _, fixed := range []models.Coding{models.CodeNone, models.CodeHead, models.CodeAll} {
			if got := fixed.Resolve(c.cfg, dev, 0); got != fixed {
				t.Errorf("%s: %s resolved to %s", c.name, fixed, got)
			}
		}
		if got := models.TwinBytes(c.cfg, models.CodeAll, nil); got != 0 {
			t.Errorf("%s: %d bytes of twins on a device that codes nothing", c.name, got)
		}
	}
}

func TestCodingText(t *testing.T) {
	for _, c := range []models.Coding{models.CodeNone, models.CodeHead, models.CodeAll, models.CodeAuto} {
		b, err := c.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back models.Coding
		if err := back.UnmarshalText(b); err != nil || back != c {
			t.Errorf("%s: read back as %s (%v)", c, back, err)
		}
	}
	var c models.Coding
	if err := c.UnmarshalText([]byte("most")); err == nil {
		t.Error("a coding named most was read")
	}
}
