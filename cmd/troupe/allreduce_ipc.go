package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gpu/cuda"
	"github.com/troupe/troupe/xgmi"
)

// ipcTokenEnv carries the bus token from allreduce-bench --procs to the
// processes it starts (not on their command lines, which other users of
// the host can read).
const ipcTokenEnv = "TROUPE_IPC_TOKEN"

// ipcBenchOpts is allreduce-bench --procs: how to start the rank processes.
type ipcBenchOpts struct {
	procs int
	exe   string   // the troupe binary the ranks run
	args  []string // allreduce-bench's own arguments, given to every rank
}

// ipcAllReduceBench is allreduce-bench across processes: it starts a bus
// node on the loopback interface (with a token of its own), runs one
// process per GPU (rank r on GPU r), which join an IPC fabric through the
// node and time the same table as in one process, and forwards rank 0's
// table to stdout. A rank that fails fails the command with its error
// output.
func ipcAllReduceBench(ctx context.Context, stdout, stderr io.Writer, o ipcBenchOpts) error {
	cfg, err := bus.LoopbackConfig("allreduce-bench")
	if err != nil {
		return fmt.Errorf("allreduce-bench: %w", err)
	}
	node, err := bus.Start(ctx, cfg)
	if err != nil {
		return fmt.Errorf("allreduce-bench: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = node.Shutdown(sctx)
	}()
	cmds := make([]*exec.Cmd, o.procs)
	errOut := make([]bytes.Buffer, o.procs)
	for r := range o.procs {
		args := append([]string{"allreduce-bench"}, o.args...)
		args = append(args, "--ipc-rank", strconv.Itoa(r), "--ipc-bus", node.ClientURL())
		c := exec.CommandContext(ctx, o.exe, args...)
		c.Env = append(os.Environ(), ipcTokenEnv+"="+cfg.ClientAuth.Token)
		c.Stdout = io.Discard
		if r == 0 {
			c.Stdout = stdout
		}
		c.Stderr = &errOut[r]
		c.WaitDelay = 10 * time.Second
		if err := c.Start(); err != nil {
			for _, started := range cmds[:r] {
				_ = started.Process.Kill()
				_ = started.Wait()
			}
			return fmt.Errorf("allreduce-bench: start rank %d: %w", r, err)
		}
		cmds[r] = c
	}
	var errs []error
	for r, c := range cmds {
		if err := c.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("rank %d (GPU %d): %w: %s", r, r, err, strings.TrimSpace(errOut[r].String())))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("allreduce-bench: %w", err)
	}
	for r := range errOut {
		_, _ = stderr.Write(errOut[r].Bytes())
	}
	return nil
}

// ipcAllReduceRank is one rank process of allreduce-bench --procs: GPU
// rank joins the IPC fabric of o.ranks processes through the bus node at
// busURL and runs the table with the others; only rank 0 prints it.
func ipcAllReduceRank(ctx context.Context, stdout io.Writer, o cudaBenchOpts, rank int, busURL string) error {
	fail := func(err error) error { return fmt.Errorf("allreduce-bench: rank %d: %w", rank, err) }
	nc, err := nats.Connect(busURL, nats.Token(os.Getenv(ipcTokenEnv)), nats.Name(fmt.Sprintf("allreduce-bench-rank-%d", rank)))
	if err != nil {
		return fail(fmt.Errorf("connect to %s: %w", busURL, err))
	}
	defer nc.Close()
	// A rank that cannot open its GPU never joins: the others' exchange
	// gives up after its timeout, naming it.
	dev, err := cuda.Open(ctx, cudaConfig(rank))
	if err != nil {
		return fail(fmt.Errorf("open cuda device %d: %w", rank, err))
	}
	defer dev.Close()
	subs, err := bus.NewSubjects("allreduce-bench")
	if err != nil {
		return fail(err)
	}
	ex, err := bus.NewExchange(ctx, nc, bus.ExchangeConfig{Subject: subs.Exchange("fabric"), Rank: rank, Ranks: o.ranks})
	if err != nil {
		return fail(err)
	}
	defer ex.Close()
	fab, err := xgmi.NewIPCFabric(ctx, dev, ex, xgmi.CUDAFabricConfig{StepBytes: o.step})
	if err != nil {
		return fail(err)
	}
	defer fab.Shutdown(ctx)
	comm, err := xgmi.NewDeviceComm(fab, o.cfg)
	if err != nil {
		return fail(err)
	}
	b := cudaBench{
		comm:   comm,
		local:  []benchRank{{rank, dev}},
		fabric: fmt.Sprintf("CUDA IPC, one process per GPU, %d processes", o.ranks),
		gather: func(ctx context.Context, v int) ([]int, error) {
			parts, err := ex.AllGather(ctx, binary.LittleEndian.AppendUint64(nil, uint64(v)))
			if err != nil {
				return nil, err
			}
			out := make([]int, len(parts))
			for q, p := range parts {
				if len(p) != 8 {
					return nil, fmt.Errorf("rank %d sent %d bytes, want a count", q, len(p))
				}
				out[q] = int(binary.LittleEndian.Uint64(p))
			}
			return out, nil
		},
	}
	if rank != 0 {
		stdout = io.Discard
	}
	if err := b.run(ctx, stdout, o, fab.WindowBytes()); err != nil {
		return fail(err)
	}
	return nil
}
