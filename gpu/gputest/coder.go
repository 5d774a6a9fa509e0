package gputest

import "github.com/troupe/troupe/gpu"

// Coder wraps a device as a gpu.WeightCoder that takes the shapes the CUDA
// lane's coded kernels take (k a multiple of 512 up to 8192) and codes
// nothing, for tests of what a coding plans.
type Coder struct{ gpu.Device }

// Code implements gpu.WeightCoder; it codes nothing.
func (Coder) Code(gpu.Buffer, int, int, ...[]byte) (bool, error) { return false, nil }

// Codable implements gpu.WeightCoder.
func (Coder) Codable(rows, k int) bool { return rows > 0 && k%512 == 0 && k <= 8192 }
