package models_test

import (
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cpu"
)

func openCPU(t testing.TB) gpu.Device {
	d, err := cpu.New(cpu.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func init() {
	extraLanes = append(extraLanes,
		lane{name: "cpu", open: openCPU},
		// A bf16 KV cache (--kv-cache bf16): keys and values rounded, so
		// the CUDA lane's bounds.
		lane{name: "cpu-bf16-kv", open: openCPU, tol: 1e-2, margin: 2e-2, cache: gpu.BF16})
}
