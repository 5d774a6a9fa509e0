package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/troupe/troupe/scheduler"
)

// TestServeMicroBatches: --micro-batches and micro_batches set the
// pipeline's micro-batches, off by default; out of range is refused.
func TestServeMicroBatches(t *testing.T) {
	cfg, err := parseServe(nil, &bytes.Buffer{})
	if err != nil || cfg.MicroBatches != scheduler.DefaultMicroBatches {
		t.Errorf("default: got %d (%v), want %d", cfg.MicroBatches, err, scheduler.DefaultMicroBatches)
	}
	if cfg, err := parseServe([]string{"--micro-batches", "0"}, &bytes.Buffer{}); err != nil || cfg.MicroBatches != 0 {
		t.Errorf("--micro-batches 0: got %d, %v", cfg.MicroBatches, err)
	}
	file := filepath.Join(t.TempDir(), "serve.json")
	os.WriteFile(file, []byte(`{"micro_batches":3}`), 0o644)
	if cfg, err := parseServe([]string{"--config", file}, &bytes.Buffer{}); err != nil || cfg.MicroBatches != 3 {
		t.Errorf("micro_batches in a file: got %d, %v", cfg.MicroBatches, err)
	}
	for _, bad := range []string{"-1", "65"} {
		if _, err := parseServe([]string{"--micro-batches", bad}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "--micro-batches") {
			t.Errorf("--micro-batches %s: got %v, want an error naming the flag", bad, err)
		}
	}
}
