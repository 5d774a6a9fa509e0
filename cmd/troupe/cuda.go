package main

import (
	"context"
	"fmt"
	"os"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
)

// kernelsEnv names a kernels/ directory (manifest.json, cuda/...) to load
// the CUDA kernels from instead of the embedded ones: for trying freshly
// built artifacts on a GPU host without rebuilding the binary.
const kernelsEnv = "TROUPE_CUDA_KERNELS"

// serialEnv set to 1 turns programmatic dependent launch off
// (cuda.Config.Serial), for comparisons.
const serialEnv = "TROUPE_CUDA_SERIAL"

// ptxEnv set to 1 loads the compute_80 PTX on Hopper too (cuda.Config.PTX),
// to run the kernels other GPUs run.
const ptxEnv = "TROUPE_CUDA_PTX"

// cudaConfig is the configuration of GPU ordinal.
func cudaConfig(ordinal int) cuda.Config {
	cfg := cuda.DefaultConfig()
	cfg.Ordinal = ordinal
	if dir := os.Getenv(kernelsEnv); dir != "" {
		cfg.Kernels = os.DirFS(dir)
	}
	cfg.Serial = os.Getenv(serialEnv) == "1"
	cfg.PTX = os.Getenv(ptxEnv) == "1"
	return cfg
}

// openCUDA opens GPU 0.
func openCUDA(ctx context.Context) (gpu.Device, error) {
	d, err := cuda.Open(ctx, cudaConfig(0))
	if err != nil {
		return nil, fmt.Errorf("open cuda device 0: %w", err)
	}
	return d, nil
}

// openCUDAs opens GPUs 0 to n-1.
func openCUDAs(ctx context.Context, n int) ([]*cuda.Device, error) {
	var devs []*cuda.Device
	for i := range n {
		d, err := cuda.Open(ctx, cudaConfig(i))
		if err != nil {
			closeCUDAs(devs)
			return nil, fmt.Errorf("open cuda device %d of %d: %w", i, n, err)
		}
		devs = append(devs, d)
	}
	return devs, nil
}

func closeCUDAs(devs []*cuda.Device) error {
	var first error
	for _, d := range devs {
		if err := d.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
