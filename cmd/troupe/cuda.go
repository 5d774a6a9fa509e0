package main

import (
	"context"
	"fmt"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
)

// openCUDA opens GPU 0.
func openCUDA(ctx context.Context) (gpu.Device, error) {
	cfg := cuda.DefaultConfig()
	cfg.Ordinal = 0
	d, err := cuda.Open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open cuda device 0: %w", err)
	}
	return d, nil
}
