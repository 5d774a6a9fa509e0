package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/xgmi"
)

// allReduceRow is one message size of allreduce-bench.
type allReduceRow struct {
	Bytes  int     `json:"bytes"`
	Count  int     `json:"count"`
	Type   string  `json:"type"`
	RedOp  string  `json:"redop"`
	Algo   string  `json:"algo"`
	Iters  int     `json:"iters"`
	TimeUS float64 `json:"time_us"`
	AlgBW  float64 `json:"algbw_gbps"`
	BusBW  float64 `json:"busbw_gbps"`
	Wrong  int     `json:"wrong"` // elements of any rank that differ from the oracle; -1: not checked
}

// allReduceResult is what allreduce-bench prints with --json.
type allReduceResult struct {
	Fabric      string         `json:"fabric"`
	Ranks       int            `json:"ranks"`
	WindowBytes int            `json:"window_bytes"`
	Rows        []allReduceRow `json:"rows"`
	CUDA        string         `json:"cuda"`
}

func cmdAllReduceBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("allreduce-bench", stderr)
	ranks := fs.Int("ranks", 2, "ranks (goroutines of this process on the host fabric)")
	minS := fs.String("min", "8", "smallest message in bytes per rank (suffixes K, KiB, M, MiB, G, GiB)")
	maxS := fs.String("max", "64MiB", "largest message in bytes per rank")
	factor := fs.Int("factor", 2, "size multiplier between rows")
	dtS := fs.String("dtype", "bf16", "element type: bf16, f16 or f32")
	algoS := fs.String("algo", "auto", "all-reduce algorithm: auto, oneshot, twoshot or lowlatency")
	oneShotS := fs.String("oneshot-max", "", "largest message auto reduces in one shot (default: the library's)")
	llS := fs.String("lowlatency-max", "", "largest message auto reduces with the low-latency one-shot (default: the library's)")
	windowS := fs.String("window", "", "window per rank (default: the library's)")
	warmup := fs.Int("warmup", 5, "untimed calls per size")
	iters := fs.Int("iters", 0, "timed calls per size (0: enough for about --target)")
	target := fs.Duration("target", 100*time.Millisecond, "time to spend timing each size when --iters is 0")
	check := fs.Bool("check", true, "check the first call of each size against the oracle")
	probeGPU := fs.Bool("cuda", true, "look for CUDA devices (host fabric)")
	device := fs.String("device", "host", "fabric: host (goroutines of this process) or cuda (GPUs 0 to --ranks-1, peer access)")
	procs := fs.Int("procs", 0, "cuda: run the ranks as this many processes, one GPU each, joined by CUDA IPC over a bus node on the loopback interface (sets --ranks)")
	ipcRank := fs.Int("ipc-rank", -1, "internal: this process is rank N of --procs")
	ipcBus := fs.String("ipc-bus", "", "internal: the bus node of --procs")
	graph := fs.Bool("graph", true, "cuda: time all-reduces recorded in a CUDA graph (false: issued one by one)")
	asJSON := fs.Bool("json", false, "print JSON only")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lo, err := parseBytes(*minS)
	if err != nil {
		return fmt.Errorf("allreduce-bench: --min: %w", err)
	}
	hi, err := parseBytes(*maxS)
	if err != nil {
		return fmt.Errorf("allreduce-bench: --max: %w", err)
	}
	dt, err := parseDType(*dtS)
	if err != nil {
		return fmt.Errorf("allreduce-bench: %w", err)
	}
	algo, err := xgmi.ParseAlgorithm(*algoS)
	if err != nil {
		return fmt.Errorf("allreduce-bench: %w", err)
	}
	if lo < 1 || hi < lo || *factor < 2 || *warmup < 0 || *iters < 0 || *target <= 0 {
		return fmt.Errorf("allreduce-bench: want 1 <= --min <= --max, --factor >= 2, non-negative --warmup and --iters, positive --target")
	}
	cfg := xgmi.DefaultConfig()
	if *device == "cuda" {
		cfg = xgmi.DefaultCUDAConfig()
	} else if *device != "host" {
		return fmt.Errorf("allreduce-bench: --device %q: want host or cuda", *device)
	}
	cfg.Algorithm = algo
	if *oneShotS != "" {
		if cfg.OneShotMaxBytes, err = parseBytes(*oneShotS); err != nil {
			return fmt.Errorf("allreduce-bench: --oneshot-max: %w", err)
		}
	}
	if *llS != "" {
		if cfg.LowLatencyMaxBytes, err = parseBytes(*llS); err != nil {
			return fmt.Errorf("allreduce-bench: --lowlatency-max: %w", err)
		}
	}
	if *procs != 0 {
		if *device != "cuda" || *procs < 2 || *procs > 8 {
			return fmt.Errorf("allreduce-bench: --procs %d: want 2 to 8 processes, with --device cuda", *procs)
		}
		*ranks = *procs
	}
	if *device == "cuda" {
		step := 0
		if *windowS != "" {
			if step, err = parseBytes(*windowS); err != nil {
				return fmt.Errorf("allreduce-bench: --window: %w", err)
			}
		}
		o := cudaBenchOpts{
			ranks: *ranks, lo: lo, hi: hi, factor: *factor, dt: dt, cfg: cfg, step: step,
			warmup: *warmup, iters: *iters, target: *target, check: *check, graph: *graph, json: *asJSON,
		}
		switch {
		case *ipcRank >= 0:
			return ipcAllReduceRank(ctx, stdout, o, *ipcRank, *ipcBus)
		case *procs != 0:
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("allreduce-bench: %w", err)
			}
			return ipcAllReduceBench(ctx, stdout, stderr, ipcBenchOpts{procs: *procs, exe: exe, args: args})
		}
		return cudaAllReduceBench(ctx, stdout, o)
	}
	fcfg := xgmi.DefaultHostFabricConfig()
	fcfg.Ranks = *ranks
	if *windowS != "" {
		if fcfg.WindowBytes, err = parseBytes(*windowS); err != nil {
			return fmt.Errorf("allreduce-bench: --window: %w", err)
		}
	}
	fab, err := xgmi.NewHostFabric(fcfg)
	if err != nil {
		return fmt.Errorf("allreduce-bench: %w", err)
	}
	defer fab.Close()
	comm, err := xgmi.NewComm(fab, cfg)
	if err != nil {
		return fmt.Errorf("allreduce-bench: %w", err)
	}

	res := allReduceResult{Fabric: "host", Ranks: *ranks, WindowBytes: fcfg.WindowBytes, Rows: []allReduceRow{}}
	if !*asJSON {
		fmt.Fprintf(stdout, "# all-reduce, sum, %d ranks on the host fabric (goroutines of one process, %s windows), algo %s\n#\n", *ranks, fmtBytes(fcfg.WindowBytes), algo)
		fmt.Fprintf(stdout, "#%11s %12s %6s %6s %10s %10s %8s %8s %7s\n", "size", "count", "type", "redop", "algo", "time", "algbw", "busbw", "#wrong")
		fmt.Fprintf(stdout, "#%11s %12s %6s %6s %10s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")
	}
	es := dt.Size()
	for size := lo; size <= hi; size *= *factor {
		bytes := size / es * es
		if bytes == 0 {
			continue
		}
		row, err := benchAllReduceSize(ctx, comm, dt, bytes, *warmup, *iters, *target, *check)
		if err != nil {
			return fmt.Errorf("allreduce-bench: %d bytes: %w", bytes, err)
		}
		res.Rows = append(res.Rows, row)
		if !*asJSON {
			wrong := strconv.Itoa(row.Wrong)
			if row.Wrong < 0 {
				wrong = "N/A"
			}
			fmt.Fprintf(stdout, " %11d %12d %6s %6s %10s %10.2f %8.2f %8.2f %7s\n", row.Bytes, row.Count, row.Type, row.RedOp, row.Algo, row.TimeUS, row.AlgBW, row.BusBW, wrong)
		}
	}
	res.CUDA = "not probed"
	if *probeGPU {
		res.CUDA = cudaAllReduceStatus(ctx)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "#\n# busbw = algbw x 2(n-1)/n\n# cuda: %s\n", res.CUDA)
	return nil
}

// cudaAllReduceStatus says why the bench did not run on CUDA devices.
func cudaAllReduceStatus(ctx context.Context) string {
	peers, err := openCUDAPeers(ctx)
	if err != nil {
		return "not available: no GPUs: " + err.Error()
	}
	defer peers.Close()
	return fmt.Sprintf("%d GPUs found: run with --device cuda", peers.Count())
}

// benchAllReduceSize times all-reduces of bytes per rank. Every rank runs
// in a goroutine of its own; rank 0 times the calls between two barriers
// and tells the others how many to make.
func benchAllReduceSize(ctx context.Context, comm *xgmi.Comm, dt gpu.DType, bytes, warmup, iters int, target time.Duration, check bool) (allReduceRow, error) {
	n := comm.Size()
	ins := make([][]byte, n)
	outs := make([][]byte, n)
	for r := range n {
		ins[r] = benchInput(dt, bytes, r)
		outs[r] = alignedBytes(bytes)
	}
	row := allReduceRow{Bytes: bytes, Count: bytes / dt.Size(), Type: dt.String(), RedOp: "sum", Algo: comm.Algorithm(bytes).String(), Wrong: -1}
	var elapsed time.Duration
	err := comm.Run(ctx, func(ctx context.Context, rk *xgmi.Rank) error {
		id := rk.ID()
		call := func() error { return rk.AllReduce(ctx, outs[id], ins[id], dt) }
		if check {
			if err := call(); err != nil {
				return err
			}
		}
		start := time.Now()
		for range warmup {
			if err := call(); err != nil {
				return err
			}
		}
		// Rank 0 decides the count and broadcasts it.
		count := make([]byte, 8)
		if id == 0 {
			k := iters
			if k == 0 {
				per := time.Since(start) / time.Duration(max(warmup, 1))
				k = int(min(max(int64(target/max(per, time.Nanosecond)), 5), 100000))
			}
			binary.LittleEndian.PutUint64(count, uint64(k))
		}
		if err := rk.Broadcast(ctx, count, 0); err != nil {
			return err
		}
		k := int(binary.LittleEndian.Uint64(count))
		if err := rk.Barrier(ctx); err != nil {
			return err
		}
		t0 := time.Now()
		for range k {
			if err := call(); err != nil {
				return err
			}
		}
		if err := rk.Barrier(ctx); err != nil {
			return err
		}
		if id == 0 {
			elapsed, row.Iters = time.Since(t0), k
		}
		return nil
	})
	if err != nil {
		return row, err
	}
	if check {
		want := alignedBytes(bytes)
		if err := xgmi.SumReference(dt, want, ins); err != nil {
			return row, err
		}
		row.Wrong = 0
		for _, out := range outs {
			row.Wrong = max(row.Wrong, countWrong(out, want, dt.Size()))
		}
	}
	sec := elapsed.Seconds() / float64(row.Iters)
	row.TimeUS = sec * 1e6
	row.AlgBW = float64(bytes) / sec / 1e9
	row.BusBW = row.AlgBW * 2 * float64(n-1) / float64(n)
	return row, nil
}

// countWrong counts the elements of got that differ from want.
func countWrong(got, want []byte, es int) int {
	wrong := 0
	for i := 0; i < len(got); i += es {
		if string(got[i:i+es]) != string(want[i:i+es]) {
			wrong++
		}
	}
	return wrong
}

// benchInput returns rank r's input: small values, so that sums do not
// overflow f16.
func benchInput(dt gpu.DType, bytes, r int) []byte {
	b := alignedBytes(bytes)
	rng := rand.New(rand.NewPCG(uint64(r), uint64(bytes)))
	for i := 0; i < bytes; i += dt.Size() {
		v := float32(rng.IntN(2001)-1000) / 1000
		switch dt {
		case gpu.F32:
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(v))
		case gpu.BF16:
			binary.LittleEndian.PutUint16(b[i:], gpu.F32ToBF16(v))
		case gpu.F16:
			binary.LittleEndian.PutUint16(b[i:], gpu.F32ToF16(v))
		}
	}
	return b
}

// alignedBytes returns n zero bytes aligned to 8.
func alignedBytes(n int) []byte {
	back := make([]uint64, (n+7)/8)
	if len(back) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&back[0])), n)
}

func parseDType(s string) (gpu.DType, error) {
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16, gpu.F32} {
		if dt.String() == s {
			return dt, nil
		}
	}
	return 0, fmt.Errorf("unknown dtype %q: want bf16, f16 or f32", s)
}

// parseBytes reads a size such as 8, 4K, 64KiB, 1M, 64MiB or 1GiB; K, M
// and G are powers of 1024, as in nccl-tests.
func parseBytes(s string) (int, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSpace(s), "B"), "i")
	mult := 1
	if k := len(t); k > 0 {
		switch t[k-1] {
		case 'K', 'k':
			mult, t = 1<<10, t[:k-1]
		case 'M', 'm':
			mult, t = 1<<20, t[:k-1]
		case 'G', 'g':
			mult, t = 1<<30, t[:k-1]
		}
	}
	v, err := strconv.Atoi(t)
	if err != nil || v < 0 || v > math.MaxInt/mult {
		return 0, fmt.Errorf("bad size %q: want bytes such as 8, 4K, 64MiB", s)
	}
	return v * mult, nil
}

// fmtBytes writes n in the largest binary unit that divides it.
func fmtBytes(n int) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
