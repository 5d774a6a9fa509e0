package main

import (
	"context"
	"fmt"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/xgmi"
)

// tpGroup is the GPUs of a tensor-parallel model and the communicator
// that sums across them.
type tpGroup struct {
	devs []*cuda.Device
	fab  *xgmi.CUDAFabric
	comm *xgmi.DeviceComm
}

// openTP opens GPUs 0 to n-1 and joins them with a CUDA fabric.
func openTP(ctx context.Context, n int) (*tpGroup, error) {
	devs, err := openCUDAs(ctx, n)
	if err != nil {
		return nil, err
	}
	g, err := newTPGroup(devs)
	if err != nil {
		closeCUDAs(devs)
		return nil, err
	}
	return g, nil
}

// newTPGroup joins devs with a CUDA fabric. The steps of a decode carry
// small messages, so the windows are small.
func newTPGroup(devs []*cuda.Device) (*tpGroup, error) {
	fab, err := xgmi.NewCUDAFabric(devs, xgmi.CUDAFabricConfig{StepBytes: 4 << 20})
	if err != nil {
		return nil, err
	}
	comm, err := xgmi.NewDeviceComm(fab, xgmi.DefaultCUDAConfig())
	if err != nil {
		fab.Close()
		return nil, err
	}
	return &tpGroup{devs: devs, fab: fab, comm: comm}, nil
}

func (g *tpGroup) gpuDevices() []gpu.Device {
	out := make([]gpu.Device, len(g.devs))
	for i, d := range g.devs {
		out[i] = d
	}
	return out
}

func (g *tpGroup) reducers() []models.Reducer {
	out := make([]models.Reducer, len(g.devs))
	for i := range g.devs {
		out[i] = g.comm.Rank(i)
	}
	return out
}

// release waits for the GPUs and frees the fabric; the devices stay open.
func (g *tpGroup) release() {
	for _, d := range g.devs {
		_ = d.Sync(context.Background())
	}
	g.fab.Close()
}

// Close waits for the GPUs, frees the fabric and closes the devices.
func (g *tpGroup) Close() error {
	g.release()
	if err := closeCUDAs(g.devs); err != nil {
		return fmt.Errorf("tensor parallelism: %w", err)
	}
	return nil
}
