package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
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

// benchRank is a rank whose GPU this process drives.
type benchRank struct {
	id  int
	dev *cuda.Device
}

// cudaBench is what the CUDA benchmark runs on: the communicator, the
// ranks of this process, and how the processes agree (one process: every
// rank is here and there is nothing to agree on).
type cudaBench struct {
	comm   *xgmi.DeviceComm
	local  []benchRank
	fabric string // how the ranks are joined, for the table's title
	// gather returns every process's v, rank 0's process first.
	gather func(ctx context.Context, v int) ([]int, error)
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
	defer fab.Shutdown(ctx)
	comm, err := xgmi.NewDeviceComm(fab, o.cfg)
	if err != nil {
		return fmt.Errorf("allreduce-bench: %w", err)
	}
	b := cudaBench{comm: comm, fabric: "peer access", gather: func(_ context.Context, v int) ([]int, error) { return []int{v}, nil }}
	for r, d := range devs {
		b.local = append(b.local, benchRank{r, d})
	}
	return b.run(ctx, stdout, o, fab.WindowBytes())
}

// run prints the table of every size; only rank 0's process writes to
// stdout.
func (b cudaBench) run(ctx context.Context, stdout io.Writer, o cudaBenchOpts, windowBytes int) error {
	dev := b.local[0].dev
	mode := "graph"
	if !o.graph {
		mode = "eager"
	}
	res := allReduceResult{Fabric: "cuda", Ranks: o.ranks, WindowBytes: windowBytes, Rows: []allReduceRow{}, CUDA: dev.Name() + ", " + mode}
	if !o.json {
		fmt.Fprintf(stdout, "# all-reduce, sum, %d ranks on the cuda fabric (%s; %s, %s windows), algo %s (low-latency up to %s, one-shot up to %s), %s, time by events on GPU %d\n#\n",
			o.ranks, dev.Info().Name, b.fabric, fmtBytes(windowBytes), o.cfg.Algorithm, fmtBytes(o.cfg.LowLatencyMaxBytes), fmtBytes(o.cfg.OneShotMaxBytes), mode, b.local[0].id)
		fmt.Fprintf(stdout, "#%11s %12s %6s %6s %10s %10s %8s %8s %7s\n", "size", "count", "type", "redop", "algo", "time", "algbw", "busbw", "#wrong")
		fmt.Fprintf(stdout, "#%11s %12s %6s %6s %10s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")
	}
	es := o.dt.Size()
	for size := o.lo; size <= o.hi; size *= o.factor {
		bytes := size / es * es
		if bytes == 0 {
			continue
		}
		row, err := benchCUDASize(ctx, b, o, bytes)
		if err != nil {
			return fmt.Errorf("allreduce-bench: %d bytes: %w", bytes, err)
		}
		res.Rows = append(res.Rows, row)
		if !o.json {
			wrong := strconv.Itoa(row.Wrong)
			if row.Wrong < 0 {
				wrong = "N/A"
			}
			fmt.Fprintf(stdout, " %11d %12d %6s %6s %10s %10.2f %8.2f %8.2f %7s\n", row.Bytes, row.Count, row.Type, row.RedOp, row.Algo, row.TimeUS, row.AlgBW, row.BusBW, wrong)
		}
	}
	if o.json {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "#\n# busbw = algbw x 2(n-1)/n\n# cuda: %s\n", res.CUDA)
	return nil
}

// benchCUDASize times all-reduces of bytes per rank on every GPU.
func benchCUDASize(ctx context.Context, b cudaBench, o cudaBenchOpts, bytes int) (row allReduceRow, err error) {
	comm, local := b.comm, b.local
	n := bytes / o.dt.Size()
	row = allReduceRow{Bytes: bytes, Count: n, Type: o.dt.String(), RedOp: "sum", Algo: comm.Algorithm(bytes).String(), Wrong: -1}
	ins := make([][]byte, comm.Size()) // every rank's, for the oracle
	for r := range ins {
		ins[r] = benchInput(o.dt, bytes, r)
	}
	srcs := make([]gpu.Buffer, len(local))
	dsts := make([]gpu.Buffer, len(local))
	var graphs []gpu.Graph
	defer func() {
		for _, g := range graphs {
			g.Close()
		}
		for i, l := range local {
			if srcs[i] != nil {
				l.dev.Free(srcs[i])
			}
			if dsts[i] != nil {
				l.dev.Free(dsts[i])
			}
		}
	}()
	for i, l := range local {
		if srcs[i], err = l.dev.Alloc(o.dt, n); err != nil {
			return row, err
		}
		if dsts[i], err = l.dev.Alloc(o.dt, n); err != nil {
			return row, err
		}
		if err := l.dev.Write(srcs[i], 0, ins[l.id]); err != nil {
			return row, err
		}
	}
	callAll := func() error {
		for i, l := range local {
			if err := comm.Rank(l.id).AllReduce(dsts[i], srcs[i]); err != nil {
				return err
			}
		}
		return nil
	}
	syncAll := func() error {
		var errs []error
		for _, l := range local {
			errs = append(errs, l.dev.Sync(ctx))
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
		wrong := 0
		for i, l := range local {
			if err := l.dev.Read(got, dsts[i], 0); err != nil {
				return row, err
			}
			wrong = max(wrong, countWrong(got, want, o.dt.Size()))
		}
		all, err := b.gather(ctx, wrong)
		if err != nil {
			return row, err
		}
		row.Wrong = slices.Max(all)
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
		for i, l := range local {
			g, err := l.dev.Capture(func() error {
				for range per {
					if err := comm.Rank(l.id).AllReduce(dsts[i], srcs[i]); err != nil {
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
		return local[0].dev.Elapsed(func() error {
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
	// Every process makes as many calls as rank 0's.
	ks, err := b.gather(ctx, k)
	if err != nil {
		return row, err
	}
	k = ks[0]
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
	row.BusBW = row.AlgBW * 2 * float64(comm.Size()-1) / float64(comm.Size())
	return row, nil
}
