package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBenchSampled: bench draws tokens with --temperature (one sequence
// and a batch, filtered and not), reports the draws in its JSON, and
// refuses draws out of range.
func TestBenchSampled(t *testing.T) {
	for _, args := range [][]string{
		{"--temperature", "0.8", "--top-k", "20"},
		{"--temperature", "1", "--batch", "3", "--top-p", "0.9", "--seed", "7"},
		{"--temperature", "0.7", "--batch", "2", "--min-p", "0.05"},
	} {
		out, _, err := runCLI(t, "", append([]string{"bench", "--prompt", "8", "--gen", "6", "--runs", "1", "--json"}, args...)...)
		if err != nil {
			t.Fatalf("bench %v: %v", args, err)
		}
		var r benchResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("bench %v: %v in %q", args, err, out)
		}
		if r.Sampling == nil || r.Sampling.Temperature <= 0 || !(r.DecodeTokS > 0) || r.Gen != 6*r.Batch {
			t.Errorf("bench %v: %+v (sampling %+v)", args, r, r.Sampling)
		}
	}
	out, _, err := runCLI(t, "", "bench", "--prompt", "8", "--gen", "2", "--runs", "1", "--temperature", "0.5")
	if err != nil || !strings.Contains(out, "drawn at temperature 0.5") {
		t.Errorf("bench --temperature 0.5: %v, %q", err, out)
	}
	for _, bad := range [][]string{{"--temperature", "-1"}, {"--temperature", "1", "--top-p", "2"}, {"--temperature", "1", "--top-k", "-3"}} {
		if _, _, err := runCLI(t, "", append([]string{"bench", "--prompt", "4", "--gen", "1", "--runs", "1"}, bad...)...); err == nil {
			t.Errorf("bench %v: no error", bad)
		}
	}
}
