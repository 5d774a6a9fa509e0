package xgmi

import (
	"strings"
	"testing"

	"github.com/troupe/troupe/gpu/cuda"
)

// TestCUDAFabricArguments: the fabric refuses what cannot work before it
// touches a GPU.
func TestCUDAFabricArguments(t *testing.T) {
	for _, tc := range []struct {
		devs []*cuda.Device
		cfg  CUDAFabricConfig
		want string
	}{
		{nil, CUDAFabricConfig{}, "0 devices"},
		{make([]*cuda.Device, 1), CUDAFabricConfig{}, "1 devices"},
		{make([]*cuda.Device, 9), CUDAFabricConfig{}, "9 devices"},
		{make([]*cuda.Device, 2), CUDAFabricConfig{StepBytes: 24}, "multiple of 16"},
		{make([]*cuda.Device, 2), CUDAFabricConfig{Timeout: -1}, "negative timeout"},
		{make([]*cuda.Device, 2), CUDAFabricConfig{}, "device 0 is nil"},
	} {
		_, err := NewCUDAFabric(tc.devs, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewCUDAFabric(%d devices, %+v): %v, want %q", len(tc.devs), tc.cfg, err, tc.want)
		}
	}
	if DefaultCUDAConfig().Validate() != nil || DefaultCUDAConfig().OneShotMaxBytes != 4<<20 {
		t.Errorf("DefaultCUDAConfig: %+v", DefaultCUDAConfig())
	}
}
