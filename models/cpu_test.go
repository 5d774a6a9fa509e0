package models_test

import (
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cpu"
)

func init() {
	extraLanes = append(extraLanes, lane{name: "cpu", open: func(t testing.TB) gpu.Device {
		d, err := cpu.New(cpu.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}})
}
