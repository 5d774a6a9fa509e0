package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/troupe/troupe/gpu"
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

// TestBenchBatches: --batch takes a list of counts, measured in turn on
// one load of the model, one JSON object a line each; counts out of range
// or not numbers are refused, naming the flag.
func TestBenchBatches(t *testing.T) {
	out, stderr, err := runCLI(t, "", "bench", "--prompt", "8", "--gen", "4", "--runs", "1", "--batch", "1,3, 2")
	if err != nil {
		t.Fatalf("bench --batch 1,3,2: %v", err)
	}
	if got := strings.Count(out, "tokens  "); got != 6 || !strings.Contains(out, "batch 3: ") || strings.Count(stderr, "loading ") != 1 {
		t.Errorf("bench --batch 1,3,2: three reports and one load wanted:\n%s\n%s", out, stderr)
	}
	out, _, err = runCLI(t, "", "bench", "--prompt", "8", "--gen", "4", "--runs", "1", "--json", "--batch", "2,1")
	if err != nil {
		t.Fatalf("bench --json --batch 2,1: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("bench --json --batch 2,1: %d lines, want 2:\n%s", len(lines), out)
	}
	for i, want := range []int{2, 1} {
		var r benchResult
		if err := json.Unmarshal([]byte(lines[i]), &r); err != nil || r.Batch != want || r.Gen != 4*want || !(r.DecodeTokS > 0) {
			t.Errorf("line %d: %+v, %v; want batch %d", i, r, err, want)
		}
	}
	for _, bad := range []string{"0", "65", "2,x", ""} {
		if _, _, err := runCLI(t, "", "bench", "--prompt", "4", "--gen", "1", "--runs", "1", "--batch", bad); err == nil || !strings.Contains(err.Error(), "batch") {
			t.Errorf("bench --batch %q: %v, want an error naming the flag", bad, err)
		}
	}
}

// TestBenchKVCache: --kv-cache picks the cache's element type (f32 by
// default on the CPU lane), bench names it, and an unknown one is refused.
func TestBenchKVCache(t *testing.T) {
	for flag, want := range map[string]string{"": "f32", "auto": "f32", "f32": "f32", "bf16": "bf16", "f16": "f16"} {
		args := []string{"bench", "--prompt", "8", "--gen", "4", "--runs", "1", "--json"}
		if flag != "" {
			args = append(args, "--kv-cache", flag)
		}
		out, _, err := runCLI(t, "", args...)
		if err != nil {
			t.Fatalf("bench --kv-cache %q: %v", flag, err)
		}
		var r benchResult
		if err := json.Unmarshal([]byte(out), &r); err != nil || r.KVCache != want || !(r.DecodeTokS > 0) {
			t.Errorf("bench --kv-cache %q: %+v, %v; want a %s cache", flag, r, err, want)
		}
	}
	if _, _, err := runCLI(t, "", "bench", "--prompt", "4", "--gen", "1", "--runs", "1", "--kv-cache", "f8"); err == nil || !strings.Contains(err.Error(), "--kv-cache") {
		t.Errorf("bench --kv-cache f8: %v, want an error naming the flag", err)
	}
	for device, want := range map[string]gpu.DType{"cpu": gpu.F32, "ref": gpu.F32, "cuda": gpu.BF16} {
		if got, err := kvCacheType("auto", device); err != nil || got != want {
			t.Errorf("auto on %s: %v, %v; want %v", device, got, err, want)
		}
	}
}

// FuzzBatchList: --batch's parser never panics, takes only counts in
// range, and prints what it took in a form it takes back.
func FuzzBatchList(f *testing.F) {
	for _, s := range []string{"1", "1,8,64", " 2, 3", "0", "65", "1,,2", "-1", "x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var b batchList
		if err := b.Set(s); err != nil {
			return
		}
		if len(b) == 0 {
			t.Fatalf("%q: no counts", s)
		}
		for _, n := range b {
			if n < 1 || n > maxBenchBatch {
				t.Fatalf("%q: count %d out of range", s, n)
			}
		}
		var again batchList
		if err := again.Set(b.String()); err != nil || !slices.Equal(again, b) {
			t.Fatalf("%q: %v printed %q, which parses to %v (%v)", s, b, b.String(), again, err)
		}
	})
}

// TestBenchLogprobs: --logprobs reads each step's rows back summarized,
// or whole with --raw-rows, with its tokens and reports it in the JSON,
// greedy or drawn, for one sequence or several; it takes a count up to 20.
func TestBenchLogprobs(t *testing.T) {
	for _, args := range [][]string{{"--logprobs", "5"}, {"--logprobs", "3", "--batch", "2", "--temperature", "0.7"},
		{"--logprobs", "4", "--raw-rows", "--batch", "2"}} {
		out, _, err := runCLI(t, "", append([]string{"bench", "--prompt", "8", "--gen", "6", "--runs", "1", "--json"}, args...)...)
		if err != nil {
			t.Fatalf("bench %v: %v", args, err)
		}
		var r benchResult
		if err := json.Unmarshal([]byte(out), &r); err != nil || r.Logprobs != int(args[1][0]-'0') || r.RawRows != slices.Contains(args, "--raw-rows") || r.Gen != 6*r.Batch || !(r.DecodeTokS > 0) {
			t.Errorf("bench %v: %+v, %v", args, r, err)
		}
	}
	for _, bad := range [][]string{{"--logprobs", "21"}, {"--logprobs", "-1"}, {"--raw-rows"}} {
		if _, _, err := runCLI(t, "", append([]string{"bench", "--prompt", "4", "--gen", "1", "--runs", "1"}, bad...)...); err == nil || !strings.Contains(err.Error(), "logprobs") {
			t.Errorf("bench %v: %v, want an error naming --logprobs", bad, err)
		}
	}
}

// TestBenchCPUProfile: --cpuprofile writes a pprof CPU profile (gzipped
// protocol buffers naming the sample types) of the measured runs, and a
// path it cannot create is an error before the measurement.
func TestBenchCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	if _, _, err := runCLI(t, "", "bench", "--prompt", "8", "--gen", "16", "--runs", "2", "--json", "--cpuprofile", path); err != nil {
		t.Fatalf("bench --cpuprofile: %v", err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("profile of %d bytes is not gzipped: %v", len(raw), err)
	}
	pb, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"samples", "cpu", "nanoseconds"} {
		if !bytes.Contains(pb, []byte(want)) {
			t.Errorf("profile names no %q", want)
		}
	}
	bad := filepath.Join(t.TempDir(), "absent", "cpu.prof")
	if _, _, err := runCLI(t, "", "bench", "--prompt", "4", "--gen", "1", "--runs", "1", "--cpuprofile", bad); err == nil || !strings.Contains(err.Error(), "cpu profile") {
		t.Errorf("bench --cpuprofile %s: %v, want an error naming the profile", bad, err)
	}
}
