package main

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int{"8": 8, "4K": 4 << 10, "64KiB": 64 << 10, "1M": 1 << 20, "64MiB": 64 << 20, "1GiB": 1 << 30, "2kB": 2 << 10} {
		got, err := parseBytes(in)
		if err != nil || got != want {
			t.Errorf("parseBytes(%q): got %d, %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1T", "1.5M"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q): no error", in)
		}
	}
}

func TestAllReduceBenchTable(t *testing.T) {
	var out bytes.Buffer
	err := dispatch(t.Context(), []string{"allreduce-bench", "--ranks", "3", "--min", "8", "--max", "64K", "--factor", "8", "--iters", "3", "--warmup", "1", "--window", "16K", "--dtype", "f16"}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	rows := tableRows(out.String(), func(line string, f []string) {
		if len(f) != 9 || f[2] != "f16" || f[3] != "sum" || f[8] != "0" {
			t.Errorf("row %q: want 9 columns, f16, sum and 0 wrong", line)
		}
	})
	if rows != 5 {
		t.Errorf("got %d rows, want 5 (8 B to 32 KiB by 8)", rows)
	}
	if !strings.Contains(out.String(), "# cuda: not available") {
		t.Errorf("table lacks the cuda line:\n%s", out.String())
	}
}

func TestAllReduceBenchJSON(t *testing.T) {
	var out bytes.Buffer
	err := dispatch(t.Context(), []string{"allreduce-bench", "--json", "--ranks", "2", "--min", "1K", "--max", "4K", "--iters", "2", "--algo", "twoshot", "--cuda=false"}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var res allReduceResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	if res.Ranks != 2 || len(res.Rows) != 3 || res.CUDA != "not probed" {
		t.Fatalf("got %+v, want 2 ranks, 3 rows, cuda not probed", res)
	}
	for _, r := range res.Rows {
		if r.Algo != "twoshot" || r.Wrong != 0 || r.TimeUS <= 0 || r.BusBW != r.AlgBW {
			t.Errorf("row %+v: want twoshot, 0 wrong, a positive time and busbw = algbw on 2 ranks", r)
		}
	}
}

func TestAllReduceBenchBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--ranks", "0"}, {"--dtype", "i32"}, {"--algo", "ring"}, {"--min", "1M", "--max", "1K"}, {"--window", "100"}} {
		if err := dispatch(t.Context(), append([]string{"allreduce-bench", "--cuda=false"}, args...), io.Discard, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestProbeCommand(t *testing.T) {
	var out bytes.Buffer
	if err := dispatch(t.Context(), []string{"probe", "--ranks", "4"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "fabric host: 4 ranks") || !strings.Contains(out.String(), "fabric cuda:") {
		t.Errorf("probe printed:\n%s", out.String())
	}
	out.Reset()
	if err := dispatch(t.Context(), []string{"probe", "--json"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var res probeResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Host.Links) != 2 || res.Host.Links[0].Kind != "host" {
		t.Errorf("host links: got %+v, want two host links", res.Host.Links)
	}
	if len(res.CUDA.Devices) == 0 && !strings.HasPrefix(res.CUDA.Note, "no GPUs: ") {
		t.Errorf("cuda without devices: note %q, want it to say why", res.CUDA.Note)
	}
}

// TestAllReduceBenchCUDAWithoutGPU: on a machine without GPUs the CUDA
// fabric fails with the driver's reason, and bad flags are refused.
func TestAllReduceBenchCUDAWithoutGPU(t *testing.T) {
	err := dispatch(t.Context(), []string{"allreduce-bench", "--device", "cuda", "--max", "1K"}, io.Discard, io.Discard)
	if err == nil {
		t.Skip("a GPU is present: the CUDA fabric ran")
	}
	if !strings.Contains(err.Error(), "cuda") {
		t.Errorf("error %q does not name cuda", err)
	}
	if err := dispatch(t.Context(), []string{"allreduce-bench", "--device", "tpu"}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "--device") {
		t.Errorf("--device tpu: %v", err)
	}
}

// TestTensorParallelFlags: --tp needs the CUDA lane and a positive count.
func TestTensorParallelFlags(t *testing.T) {
	for _, args := range [][]string{{"--tp", "2"}, {"--tp", "2", "--device", "ref"}, {"--tp", "0"}} {
		err := dispatch(t.Context(), append([]string{"bench", "--prompt", "4", "--gen", "1", "--runs", "1"}, args...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--tp") {
			t.Errorf("bench %v: %v, want an error about --tp", args, err)
		}
	}
}

// TestAllReduceBenchProcs runs allreduce-bench --procs 2: the command
// starts a bus node and two rank processes (this test binary, as troupe).
// Without GPUs both ranks fail to open theirs, and the command reports
// each rank's error; with two GPUs it prints the table, every row right.
func TestAllReduceBenchProcs(t *testing.T) {
	t.Setenv(testMainEnv, "1")
	var out, errOut bytes.Buffer
	err := dispatch(t.Context(), []string{"allreduce-bench", "--device", "cuda", "--procs", "2", "--min", "8", "--max", "64K", "--factor", "8", "--iters", "3", "--warmup", "1"}, &out, &errOut)
	if err != nil {
		for _, want := range []string{"rank 0 (GPU 0): exit status 1", "rank 1 (GPU 1): exit status 1", "open cuda device"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
		t.Logf("no GPUs: %v", err)
		return
	}
	rows := tableRows(out.String(), func(line string, f []string) {
		if len(f) != 9 || f[8] != "0" {
			t.Errorf("row %q: want 9 columns and 0 wrong", line)
		}
	})
	if rows != 5 || !strings.Contains(out.String(), "CUDA IPC, one process per GPU") {
		t.Errorf("got %d rows, want 5:\n%s", rows, out.String())
	}
}

func TestAllReduceBenchProcsArguments(t *testing.T) {
	for _, args := range [][]string{
		{"--procs", "2"},
		{"--procs", "1", "--device", "cuda"},
		{"--procs", "9", "--device", "cuda"},
	} {
		err := dispatch(t.Context(), append([]string{"allreduce-bench"}, args...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "want 2 to 8 processes") {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// tableRows calls check with each data row of an allreduce-bench table
// (comment lines skipped) and its fields, and counts them.
func tableRows(table string, check func(line string, f []string)) int {
	rows := 0
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		rows++
		check(line, f)
	}
	return rows
}
