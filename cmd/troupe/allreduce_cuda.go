package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
	"github.com/troupe/troupe/xgmi"
)

type cudaBenchOpts struct {
	ranks, lo, hi, factor int
	dt                    gpu.DType
	cfg                   xgmi.Config
	step                  int
	warmup, iters         int
	target                time.Duration
	check, graph, json    bool
}

// cudaAllReduceBench is allreduce-bench on the CUDA fabric: GPUs 0 to
// ranks-1 of this process, device buffers, and time by CUDA events on
// GPU 0 over calls recorded in a graph (or issued one by one).
func cudaAllReduceBench(ctx context.Context, stdout io.Writer, o cudaBenchOpts) error {
	devs, err := openCUDAs(ctx, o.ranks)
	if err != nil {
		return fmt.Errorf("allreduce-bench: %w", err)
	}
	defer closeCUDAs(devs)
	fab, err := xgmi.NewCUDAFabric(devs, xgmi.CUDAFabricConfig{StepBytes: o.step})
	if err != nil {
		return fmt.Errorf("allreduce-bench: %w", err)
	}
	defer func() {
		for _, d := range devs {
			_ = d.Sync(ctx)
		}
		fab.Close()
	}()
	comm, err := xgmi.NewDeviceComm(fab, o.cfg)
	if err != nil {
		return fmt.Errorf("allreduce-bench: %w", err)
	}
	mode := "graph"
	if !o.graph {
		mode = "eager"
	}
	res := allReduceResult{Fabric: "cuda", Ranks: o.ranks, WindowBytes: fab.WindowBytes(), Rows: []allReduceRow{}, CUDA: devs[0].Name() + ", " + mode}
	if !o.json {
		fmt.Fprintf(stdout, "# all-reduce, sum, %d ranks on the cuda fabric (%s; peer access, %s windows), algo %s (one-shot up to %s), %s, time by events on GPU 0\n#\n",
			o.ranks, devs[0].Info().Name, fmtBytes(fab.WindowBytes()), o.cfg.Algorithm, fmtBytes(o.cfg.OneShotMaxBytes), mode)
		fmt.Fprintf(stdout, "#%11s %12s %6s %6s %8s %10s %8s %8s %7s\n", "size", "count", "type", "redop", "algo", "time", "algbw", "busbw", "#wrong")
		fmt.Fprintf(stdout, "#%11s %12s %6s %6s %8s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")
	}
	es := o.dt.Size()
	for size := o.lo; size <= o.hi; size *= o.factor {
		bytes := size / es * es
		if bytes == 0 {
			continue
		}
		row, err := benchCUDASize(ctx, comm, devs, o, bytes)
		if err != nil {
			return fmt.Errorf("allreduce-bench: %d bytes: %w", bytes, err)
		}
		res.Rows = append(res.Rows, row)
		if !o.json {
			wrong := strconv.Itoa(row.Wrong)
			if row.Wrong < 0 {
				wrong = "N/A"
			}
			fmt.Fprintf(stdout, " %11d %12d %6s %6s %8s %10.2f %8.2f %8.2f %7s\n", row.Bytes, row.Count, row.Type, row.RedOp, row.Algo, row.TimeUS, row.AlgBW, row.BusBW, wrong)
		}
	}
	if o.json {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "#\n# busbw = algbw x 2(n-1)/n\n# cuda: %s\n", res.CUDA)
	return nil
}

// benchCUDASize times all-reduces of bytes per rank on every GPU.
func benchCUDASize(ctx context.Context, comm *xgmi.DeviceComm, devs []*cuda.Device, o cudaBenchOpts, bytes int) (row allReduceRow, err error) {
	n := bytes / o.dt.Size()
	row = allReduceRow{Bytes: bytes, Count: n, Type: o.dt.String(), RedOp: "sum", Algo: comm.Algorithm(bytes).String(), Wrong: -1}
	ins := make([][]byte, len(devs))
	srcs := make([]gpu.Buffer, len(devs))
	dsts := make([]gpu.Buffer, len(devs))
	var graphs []gpu.Graph
	defer func() {
		for _, g := range graphs {
			g.Close()
		}
		for r, d := range devs {
			if srcs[r] != nil {
				d.Free(srcs[r])
			}
			if dsts[r] != nil {
				d.Free(dsts[r])
			}
		}
	}()
	for r, d := range devs {
		ins[r] = benchInput(o.dt, bytes, r)
		if srcs[r], err = d.Alloc(o.dt, n); err != nil {
			return row, err
		}
		if dsts[r], err = d.Alloc(o.dt, n); err != nil {
			return row, err
		}
		if err := d.Write(srcs[r], 0, ins[r]); err != nil {
			return row, err
		}
	}
	callAll := func() error {
		for r := range devs {
			if err := comm.Rank(r).AllReduce(dsts[r], srcs[r]); err != nil {
				return err
			}
		}
		return nil
	}
	syncAll := func() error {
		var errs []error
		for _, d := range devs {
			errs = append(errs, d.Sync(ctx))
		}
		return errors.Join(errs...)
	}
	if o.check {
		if err := callAll(); err != nil {
			return row, err
		}
		want := alignedBytes(bytes)
		if err := xgmi.SumReference(o.dt, want, ins); err != nil {
			return row, err
		}
		got := alignedBytes(bytes)
		row.Wrong = 0
		for r, d := range devs {
			if err := d.Read(got, dsts[r], 0); err != nil {
				return row, err
			}
			row.Wrong = max(row.Wrong, countWrong(got, want, o.dt.Size()))
		}
	}
	// A unit is what one Launch does: per calls all-reduces on every rank.
	per := 1
	unit := callAll
	if o.graph {
		per = 50
		switch {
		case bytes > 16<<20:
			per = 4
		case bytes > 1<<20:
			per = 10
		}
		for r, d := range devs {
			g, err := d.Capture(func() error {
				for range per {
					if err := comm.Rank(r).AllReduce(dsts[r], srcs[r]); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return row, err
			}
			graphs = append(graphs, g)
		}
		unit = func() error {
			for _, g := range graphs {
				if err := g.Launch(); err != nil {
					return err
				}
			}
			return nil
		}
	}
	times := func(k int) (time.Duration, error) {
		return devs[0].Elapsed(func() error {
			for range k {
				if err := unit(); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for range max(o.warmup, 1) {
		if err := unit(); err != nil {
			return row, err
		}
	}
	if err := syncAll(); err != nil {
		return row, err
	}
	k := o.iters
	if k == 0 {
		t1, err := times(1)
		if err != nil {
			return row, err
		}
		k = int(min(max(int64(o.target/max(t1, time.Microsecond)), 3), 2000))
	}
	if err := syncAll(); err != nil {
		return row, err
	}
	el, err := times(k)
	if err != nil {
		return row, err
	}
	if err := syncAll(); err != nil {
		return row, err
	}
	row.Iters = k * per
	sec := el.Seconds() / float64(row.Iters)
	row.TimeUS = sec * 1e6
	row.AlgBW = float64(bytes) / sec / 1e9
	row.BusBW = row.AlgBW * 2 * float64(len(devs)-1) / float64(len(devs))
	return row, nil
}
