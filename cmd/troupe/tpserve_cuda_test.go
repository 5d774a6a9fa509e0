//go:build cuda

package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/troupe/troupe/gpu/cuda"
	"github.com/troupe/troupe/models/demo"
)

// TestServeTensorParallelCUDA serves the demo model with --tp 2 on GPUs 0
// and 1 (ranks joined by the CUDA fabric, a bf16 KV cache) and checks the
// greedy completion of every demo prompt against the reference text
// through the OpenAI client. It skips with fewer than two GPUs.
func TestServeTensorParallelCUDA(t *testing.T) {
	ctx := context.Background()
	// A binary built without the embedded model (nodemo) serves the same
	// checkpoint from the repository's directory.
	model := ""
	if !demo.Embedded() {
		model = filepath.Join("..", "..", "models", "demo", demo.Name)
	}
	for i := range 2 {
		d, err := cuda.Open(ctx, cudaConfig(i))
		if err != nil {
			t.Skipf("serving --tp 2 needs 2 GPUs: GPU %d: %v", i, err)
		}
		d.Close()
	}
	s := startServe(t, func(c *serveConfig) { c.Device, c.TP, c.Model = "cuda", 2, model })
	checkDemoCompletions(t, s.client())
}
