package xgmi

import (
	"context"
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
	if c := DefaultCUDAConfig(); c.Validate() != nil || c.OneShotMaxBytes != 4<<20 || c.LowLatencyMaxBytes != 128<<10 {
		t.Errorf("DefaultCUDAConfig: %+v", DefaultCUDAConfig())
	}
}

// TestIPCFabricArguments: an IPC fabric needs a GPU and an exchange.
func TestIPCFabricArguments(t *testing.T) {
	exs, err := LocalExchanges(2)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := NewIPCFabric(ctx, nil, exs[0], CUDAFabricConfig{}); err == nil || !strings.Contains(err.Error(), "device is nil") {
		t.Errorf("no device: %v", err)
	}
	if _, err := NewIPCFabric(ctx, new(cuda.Device), nil, CUDAFabricConfig{}); err == nil || !strings.Contains(err.Error(), "no exchange") {
		t.Errorf("no exchange: %v", err)
	}
	one, _ := LocalExchanges(1)
	if _, err := NewIPCFabric(ctx, new(cuda.Device), one[0], CUDAFabricConfig{}); err == nil || !strings.Contains(err.Error(), "1 ranks") {
		t.Errorf("one rank: %v", err)
	}
}
