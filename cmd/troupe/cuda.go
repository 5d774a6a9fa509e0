package main

import (
	"context"
	"fmt"

	"github.com/troupe/troupe/gpu"
)

// openCUDA opens GPU 0.
func openCUDA(ctx context.Context) (gpu.Device, error) {
	return nil, fmt.Errorf("the cuda lane is not available in this build")
}
