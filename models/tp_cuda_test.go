//go:build cuda

package models_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/modeltest"
	"github.com/troupe/troupe/xgmi"
)

// TestCUDATensorParallel loads the demo model and the dense fixtures
// split over two GPUs (tensor parallelism through xgmi's CUDA fabric) and
// whole on one, and checks that the split model's logits over the prompt
// agree with the whole model's (relative L2 within 1e-2: the all-reduces
// sum the partial products in another order) and that greedy decoding
// chooses the same tokens, and that the group's queued steps (IssueStep,
// greedy and drawn) choose what its loop does. It skips with fewer than
// two GPUs.
func TestCUDATensorParallel(t *testing.T) {
	ctx := context.Background()
	var devs []*cuda.Device
	for i := range 2 {
		cfg := cudaConfig()
		cfg.Ordinal = i
		d, err := cuda.Open(ctx, cfg)
		if err != nil {
			for _, d := range devs {
				d.Close()
			}
			t.Skipf("tensor parallelism needs 2 GPUs: GPU %d: %v", i, err)
		}
		devs = append(devs, d)
	}
	defer func() {
		for _, d := range devs {
			d.Close()
		}
	}()
	fab, err := xgmi.NewCUDAFabric(devs, xgmi.CUDAFabricConfig{StepBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, d := range devs {
			_ = d.Sync(ctx)
		}
		fab.Close()
	}()
	comm, err := xgmi.NewDeviceComm(fab, xgmi.DefaultCUDAConfig())
	if err != nil {
		t.Fatal(err)
	}
	reducers := []models.Reducer{comm.Rank(0), comm.Rank(1)}
	gdevs := []gpu.Device{devs[0], devs[1]}

	// The demo model as embedded (as the other demo tests load it), the
	// fixtures from their directories.
	opens := map[string]func(t *testing.T) *models.Bundle{"demo": func(t *testing.T) *models.Bundle { return openDemo(t) }}
	for _, f := range []string{"olmo2", "llama-gqa", "qwen3"} {
		if p := modeltest.Shared(t, filepath.Join("fixtures", f)); p != "" {
			opens[f] = func(t *testing.T) *models.Bundle {
				b, err := models.OpenDir(p)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Close() })
				return b
			}
		}
	}
	for name, open := range opens {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			o := models.Options{MaxTokens: 64, CacheDType: gpu.BF16}
			whole, err := models.Load(b.Config, b.Checkpoint, devs[0], o)
			if err != nil {
				t.Fatal(err)
			}
			defer whole.Close()
			split, err := models.LoadTP(b.Config, b.Checkpoint, gdevs, reducers, o)
			if err != nil {
				t.Fatal(err)
			}
			defer split.Close()
			if split.Ranks() != 2 {
				t.Fatalf("ranks = %d", split.Ranks())
			}
			V := b.Config.Vocab
			prompt := []int32{1, 450, 846, 338, 263, 2987, 17, 2988, 5, 9, 100, 7}
			for i := range prompt {
				prompt[i] %= int32(V)
			}
			rel, greedy := compareSplit(t, whole, split, prompt, 24)
			t.Logf("%s: logits over %d prompt tokens: relative L2 %.2e; greedy %v", name, len(prompt), rel, greedy[1])
			if rel > 1e-2 || math.IsNaN(rel) {
				t.Errorf("split logits differ from the whole model's: relative L2 %.3e", rel)
			}
			for i := range greedy[0] {
				if greedy[0][i] != greedy[1][i] {
					t.Fatalf("greedy step %d: split chose %d, whole %d (whole: %v)", i, greedy[1][i], greedy[0][i], greedy[0])
				}
			}
			if !split.Chains() || !split.ChainsDraws(chainDraws(0)) {
				t.Fatal("the split model does not chain")
			}
			checkChains(t, split)
		})
	}
}

// cudaConfig is GPU 0's configuration; TROUPE_CUDA_KERNELS names a
// kernels/ directory to load instead of the embedded artifacts, and
// TROUPE_CUDA_SERIAL=1 turns overlapped launches off.
func cudaConfig() cuda.Config {
	cfg := cuda.DefaultConfig()
	if dir := os.Getenv("TROUPE_CUDA_KERNELS"); dir != "" {
		cfg.Kernels = os.DirFS(dir)
	}
	cfg.Serial = os.Getenv("TROUPE_CUDA_SERIAL") == "1"
	cfg.PTX = os.Getenv("TROUPE_CUDA_PTX") == "1"
	return cfg
}
