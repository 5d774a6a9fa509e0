package xgmi_test

import (
	"context"
	"fmt"
	"math"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/xgmi"
)

// Four ranks, goroutines of this process, sum their f32 vectors.
func ExampleRank_AllReduce() {
	cfg := xgmi.DefaultHostFabricConfig()
	cfg.Ranks = 4
	fab, err := xgmi.NewHostFabric(cfg)
	if err != nil {
		panic(err)
	}
	defer fab.Close()
	comm, err := xgmi.NewComm(fab, xgmi.DefaultConfig())
	if err != nil {
		panic(err)
	}
	bufs := make([][]float32, comm.Size())
	err = comm.Run(context.Background(), func(ctx context.Context, r *xgmi.Rank) error {
		v := []float32{float32(r.ID()), 1, -0.5}
		bufs[r.ID()] = v
		b := gpu.F32Bytes(v)
		return r.AllReduce(ctx, b, b, gpu.F32) // in place
	})
	if err != nil {
		panic(err)
	}
	same := true
	for _, v := range bufs[1:] {
		for i := range v {
			same = same && math.Float32bits(v[i]) == math.Float32bits(bufs[0][i])
		}
	}
	fmt.Println(bufs[0], same)
	// Output: [6 4 -2] true
}
