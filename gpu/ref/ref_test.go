package ref_test

import (
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/gpu/ref"
)

// The reference passes its own suite trivially; this keeps the suite and the
// reference compiling and internally consistent.
func TestConformance(t *testing.T) {
	gputest.Run(t, ref.New(), gputest.Options{Tol: 0, CacheDTypes: []gpu.DType{gpu.F32, gpu.BF16}})
}
