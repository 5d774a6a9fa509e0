package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/gateway"
	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
	"github.com/troupe/troupe/gpu/ref"
	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/scheduler"
	"github.com/troupe/troupe/trace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestServeTensorParallel serves the demo model over two tensor-parallel
// ranks (two CPU devices summing through a host fabric) and checks the
// greedy completion of every demo prompt against the reference text,
// through the OpenAI client, before and after resizing the node while it
// serves; each rank is a micro service whose INFO names its rank.
func TestServeTensorParallel(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := startServe(t, func(c *serveConfig) {
		c.TP, c.Threads = 2, 2
		c.Cluster.ClientListen, c.Cluster.User, c.Cluster.Password = addr, "ops", "secret"
	})
	c := s.client()
	checkDemoCompletions(t, c)
	// The node resizes while serving, each replica on devices of its own:
	// a second replica, then one of two stages, then two of one again;
	// every shape gives the reference text.
	for _, want := range []replicasDoc{{Replicas: 2, Stages: 1}, {Replicas: 1, Stages: 2}, {Replicas: 2, Stages: 1}} {
		body, _ := json.Marshal(want)
		resp, err := http.Post(s.url+"/v1/admin/replicas", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var got replicasDoc
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || got.Replicas != want.Replicas || got.Stages != want.Stages {
			t.Fatalf("scaling to %v: %d %+v, %v", want, resp.StatusCode, got, err)
		}
		checkDemoCompletions(t, c)
	}
	nc, err := nats.Connect("nats://"+addr, nats.UserInfo("ops", "secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, verb := range []string{"PING", "STATS"} {
		if _, err := nc.Request("$SRV."+verb+".shard", nil, 5*time.Second); err != nil {
			t.Errorf("%s shard: %v", verb, err)
		}
	}
	// Every rank answers INFO with its rank.
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$SRV.INFO.shard", inbox, nil); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		msg, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("INFO shard: %v (saw %v)", err, seen)
		}
		for r := range 2 {
			if want := fmt.Sprintf("rank %d of 2", r); strings.Contains(string(msg.Data), want) {
				seen[want] = true
			}
		}
	}
}

// TestServeTensorParallelReplicas serves two replicas of two ranks each
// (four CPU devices, a host fabric per replica): concurrent requests are
// spread over both, every completion equals the reference, and each
// replica's ranks hold devices of their own.
func TestServeTensorParallelReplicas(t *testing.T) {
	ctx := context.Background()
	cfg := testServeConfig()
	cfg.MaxBatchTokens, cfg.TP, cfg.Replicas, cfg.Threads = 256, 2, 2, 2
	n, tp := startTestNode(t, cfg, nil, nil)
	defer tp.Shutdown(ctx)
	defer n.Close()
	devices := map[any]bool{}
	for r := range 2 {
		ranks := tpRanks(n, r)
		if len(ranks) != 2 {
			t.Fatalf("replica %d: %d ranks, want 2", r, len(ranks))
		}
		for _, sh := range ranks {
			devices[sh.Device] = true
		}
	}
	if len(devices) != 4 {
		t.Errorf("the ranks share device actors: %d distinct, want 4", len(devices))
	}
	refs := demoRefs(t)
	var wg sync.WaitGroup
	for round := range 2 {
		for i, ref := range refs {
			wg.Go(func() { checkGreedy(ctx, t, n, fmt.Sprintf("r%d-%d", round, i), ref) })
		}
	}
	wg.Wait()
	n.replicasMu.Lock()
	defer n.replicasMu.Unlock()
	if len(n.replicas) != 2 {
		t.Fatalf("%d replicas, want 2", len(n.replicas))
	}
	for _, rep := range n.replicas {
		if st := rep.sched.Stats(); st.Steps == 0 {
			t.Errorf("replica %s ran no step: %+v", rep.id, st)
		}
	}
}

// TestServeTensorParallelStages serves the demo model as two pipeline
// stages of two tensor-parallel ranks each (four CPU devices, a host
// fabric per stage, an actor a stage driving its ranks): every greedy
// completion equals the reference, each stage's ranks hold its layers on
// devices of their own, and the steps' spans come from both stages.
func TestServeTensorParallelStages(t *testing.T) {
	ctx := context.Background()
	cfg := testServeConfig()
	cfg.MaxBatchTokens, cfg.TP, cfg.Shards, cfg.Threads = 256, 2, 2, 2
	exp := tracetest.NewInMemoryExporter()
	var log syncBuffer
	n, tp := startTestNode(t, cfg, exp, &log)
	defer tp.Shutdown(ctx)
	defer n.Close()
	layers := n.bundle.Config.Layers
	for s := range 2 {
		id := scheduler.ShardID(n.replicaID(0), s)
		for r := range 2 {
			if _, ok := n.actors.Lookup(scheduler.ShardKind, fmt.Sprintf("%s-t%d", id, r)); !ok {
				t.Errorf("stage %d: no rank %d", s, r)
			}
		}
		n.tpd.mu.Lock()
		if held := countOf(n.tpd.owner, id); held != 2 {
			t.Errorf("stage %d holds %d devices, want 2", s, held)
		}
		n.tpd.mu.Unlock()
	}
	if want := fmt.Sprintf("runs layers [%d, %d) as rank 1 of 2", layers/2, layers); !strings.Contains(log.String(), want) {
		t.Errorf("the log does not say %q", want)
	}
	for i, ref := range demoRefs(t) {
		checkGreedy(ctx, t, n, fmt.Sprintf("r%d", i), ref)
	}
	if err := tp.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	stages := map[int64]bool{}
	for _, sp := range exp.GetSpans() {
		if sp.Name != scheduler.SpanShard {
			continue
		}
		for _, a := range sp.Attributes {
			if a.Key == trace.AttrShardIndex {
				stages[a.Value.AsInt64()] = true
			}
		}
	}
	if !stages[0] || !stages[1] {
		t.Errorf("shard spans of stages %v, want 0 and 1", stages)
	}
}

// TestServeTensorParallelPlacement serves the demo model as a replica
// group placed on the node itself (--placement test,test) with --tp 2: the
// spawner starts each stage as two ranks on devices of their own and an
// actor that runs them in lock-step, which the pipeline calls as any
// stage. Concurrent greedy requests, cut into micro-batches that run
// through the stages as a wavefront, get the reference tokens; stopping
// the group stops the ranks and gives their devices back.
func TestServeTensorParallelPlacement(t *testing.T) {
	ctx := context.Background()
	cfg := testServeConfig()
	cfg.MaxBatchTokens, cfg.TP, cfg.Threads, cfg.Placement, cfg.MicroBatches = 256, 2, 2, "test,test", 0
	exp := tracetest.NewInMemoryExporter()
	n, tp := startTestNode(t, cfg, exp, nil)
	defer tp.Shutdown(ctx)
	defer n.Close()
	var stageIDs []string
	for s := range 2 {
		id := scheduler.ShardID(n.replicaID(0)+"-p0", s)
		stageIDs = append(stageIDs, id)
		if _, ok := n.actors.Lookup(scheduler.ShardKind, id); !ok {
			t.Errorf("no stage actor %s", id)
		}
		for r := range 2 {
			if _, ok := n.actors.Lookup(scheduler.ShardKind, fmt.Sprintf("%s-t%d", id, r)); !ok {
				t.Fatalf("stage %d: no rank %d", s, r)
			}
		}
	}
	refs := demoRefs(t)
	var wg sync.WaitGroup
	for i, ref := range refs {
		wg.Go(func() { checkGreedy(ctx, t, n, fmt.Sprintf("r%d", i), ref) })
	}
	wg.Wait()
	if err := tp.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	micro := 0
	for _, sp := range exp.GetSpans() {
		for _, a := range sp.Attributes {
			if a.Key == scheduler.AttrMicroBatch {
				micro++
			}
		}
	}
	if micro == 0 {
		t.Error("no step ran as micro-batches")
	}
	// Stopping a stage's actor stops its ranks and frees their devices.
	p, _ := n.actors.Lookup(scheduler.ShardKind, stageIDs[1])
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the ranks of a stopped stage to stop", 10*time.Second, func() bool {
		_, r0 := n.actors.Lookup(scheduler.ShardKind, stageIDs[1]+"-t0")
		_, r1 := n.actors.Lookup(scheduler.ShardKind, stageIDs[1]+"-t1")
		n.tpd.mu.Lock()
		defer n.tpd.mu.Unlock()
		return !r0 && !r1 && countOf(n.tpd.owner, stageIDs[1]) == 0
	})
}

// countOf counts the devices owners gives to id.
func countOf(owners []string, id string) int {
	n := 0
	for _, o := range owners {
		if o == id {
			n++
		}
	}
	return n
}

// greedyOf asks node n, through its gateway backend, for ref's greedy
// completion of the reference's length, as request id.
func greedyOf(ctx context.Context, n *node, id string, ref demoRef) ([]int32, error) {
	var got []int32
	_, err := n.backend.Generate(ctx, gateway.GenerateRequest{
		RequestID: id, Model: demo.Name, Prompt: n.tok.Encode(ref.Prompt),
		MaxTokens: len(ref.GreedyIDs), IgnoreEOS: true,
	}, func(tk gateway.Token) error { got = append(got, tk.ID); return nil })
	return got, err
}

// checkGreedy checks ref's greedy completion from node n against the
// reference tokens.
func checkGreedy(ctx context.Context, t *testing.T, n *node, id string, ref demoRef) {
	t.Helper()
	got, err := greedyOf(ctx, n, id, ref)
	if err != nil {
		t.Errorf("%s: %v", id, err)
	} else if fmt.Sprint(got) != fmt.Sprint(ref.GreedyIDs) {
		t.Errorf("%s: got %v, want %v", id, got, ref.GreedyIDs)
	}
}

// tpRanks returns the ranks of the node's r-th replica, if it is of one
// stage (nil for one of several, whose stages hold their ranks).
func tpRanks(n *node, r int) []*scheduler.Shard {
	n.replicasMu.Lock()
	defer n.replicasMu.Unlock()
	if r >= len(n.replicas) {
		return nil
	}
	return n.tpd.ranks(n.replicas[r].id)
}

// startTPNode starts a node serving the demo model over two CPU ranks
// (--tp 2), its spans recorded in exp.
func startTPNode(t *testing.T) (*node, *trace.Provider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	cfg := testServeConfig()
	cfg.MaxBatchTokens, cfg.TP, cfg.Threads = 256, 2, 2
	n, tp := startTestNode(t, cfg, exp, nil)
	return n, tp, exp
}

// startTestNode starts a node of cfg, traced (its spans in exp, when not
// nil), logging to log (when not nil); a failed test prints that log. The
// caller closes the node, then tp.
func startTestNode(t *testing.T, cfg serveConfig, exp sdktrace.SpanExporter, log io.Writer) (*node, *trace.Provider) {
	t.Helper()
	ctx := context.Background()
	var kept syncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node %s's log:\n%s", cfg.Node, kept.String())
		}
	})
	if log == nil {
		log = &kept
	} else {
		log = io.MultiWriter(log, &kept)
	}
	tcfg := trace.DefaultConfig()
	tcfg.NodeName, tcfg.SpanExporter = cfg.Node, exp
	tp, err := trace.Setup(ctx, tcfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := startNode(ctx, cfg, tp, log)
	if err != nil {
		tp.Shutdown(ctx)
		t.Fatal(err)
	}
	return n, tp
}

// TestServeTensorParallelQueued drives ranks that queue each step ahead of
// its read, as the CUDA lane's do, on two CPU devices: greedy requests get
// the reference tokens, drawn ones (temperature, top-k) the tokens of
// ranks that do not queue, a greedy one that reports log-probabilities
// (its rows read beside the tokens) the reference tokens and the
// log-probabilities of ranks that do not queue, and steps were answered
// from the queue.
func TestServeTensorParallelQueued(t *testing.T) {
	ctx := context.Background()
	refs := demoRefs(t)
	var lps [2][]gateway.Token
	run := func(ahead bool) (drawn [][]int32, answered int) {
		n, tp, exp := startTPNode(t)
		defer tp.Shutdown(ctx)
		defer n.Close()
		for _, r := range tpRanks(n, 0) {
			r.QueueAhead = ahead
		}
		gen := func(id string, req gateway.GenerateRequest) []int32 {
			var got []int32
			req.RequestID, req.Model, req.IgnoreEOS = id, demo.Name, true
			if _, err := n.backend.Generate(ctx, req, func(tk gateway.Token) error { got = append(got, tk.ID); return nil }); err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			return got
		}
		for i, ref := range refs {
			got := gen(fmt.Sprintf("greedy-%d", i), gateway.GenerateRequest{Prompt: n.tok.Encode(ref.Prompt), MaxTokens: len(ref.GreedyIDs)})
			if fmt.Sprint(got) != fmt.Sprint(ref.GreedyIDs) {
				t.Errorf("ahead %v, prompt %d: got %v, want %v", ahead, i, got, ref.GreedyIDs)
			}
			seed := int64(7 + i)
			drawn = append(drawn, gen(fmt.Sprintf("drawn-%d", i), gateway.GenerateRequest{Prompt: n.tok.Encode(ref.Prompt), MaxTokens: 12,
				Temperature: 0.8, TopK: 40, TopP: 1, Seed: &seed}))
		}
		req := gateway.GenerateRequest{RequestID: "logprobs", Model: demo.Name, IgnoreEOS: true, Prompt: n.tok.Encode(refs[0].Prompt),
			MaxTokens: len(refs[0].GreedyIDs), Logprobs: true, TopLogprobs: 3}
		var toks []gateway.Token
		if _, err := n.backend.Generate(ctx, req, func(tk gateway.Token) error { toks = append(toks, tk); return nil }); err != nil {
			t.Fatal(err)
		}
		for k, tk := range toks {
			if k >= len(refs[0].GreedyIDs) || tk.ID != refs[0].GreedyIDs[k] || !(tk.Logprob < 0) || len(tk.TopLogprobs) != 3 {
				t.Fatalf("ahead %v: logprobs request's token %d: %+v", ahead, k, tk)
			}
		}
		lps[map[bool]int{false: 0, true: 1}[ahead]] = toks
		if err := tp.ForceFlush(ctx); err != nil {
			t.Fatal(err)
		}
		for _, s := range exp.GetSpans() {
			for _, a := range s.Attributes {
				if a.Key == trace.AttrShardAhead && a.Value.AsString() == "answered" {
					answered++
				}
			}
		}
		return drawn, answered
	}
	want, _ := run(false)
	got, answered := run(true)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("drawn tokens with queued steps %v, without %v", got, want)
	}
	for k := range lps[0] {
		a, b := lps[0][k], lps[1][k]
		if math.Abs(float64(a.Logprob-b.Logprob)) > 1e-5 || fmt.Sprint(a.TopLogprobs[0].ID, a.TopLogprobs[2].ID) != fmt.Sprint(b.TopLogprobs[0].ID, b.TopLogprobs[2].ID) {
			t.Errorf("token %d: log-probabilities with queued steps %+v, without %+v", k, b, a)
		}
	}
	if answered == 0 {
		t.Error("no rank answered a step from its queue")
	}
	t.Logf("%d rank steps answered from the queue", answered)
}

// TestServeTensorParallelRankPanic makes rank 1 panic in a step: the step
// fails for both ranks (rank 0 does not stay in its all-reduce) and its
// request fails, the supervisor restarts the rank, and every later request
// gets the reference tokens from a fresh prefill. Each decode step has a shard.forward span per rank.
func TestServeTensorParallelRankPanic(t *testing.T) {
	ctx := context.Background()
	n, tp, exp := startTPNode(t)
	defer tp.Shutdown(ctx)
	defer n.Close()
	ranks := tpRanks(n, 0)
	if len(ranks) != 2 {
		t.Fatalf("%d ranks, want 2", len(ranks))
	}
	var once sync.Once
	panicked := make(chan struct{})
	ranks[1].Fault = func() {
		once.Do(func() {
			close(panicked)
			panic("injected fault")
		})
	}
	refs := demoRefs(t)
	gen := func(id string, ref demoRef) ([]int32, error) { return greedyOf(ctx, n, id, ref) }
	// The request in flight when the rank panics fails.
	if _, err := gen("during", refs[0]); err == nil || !strings.Contains(err.Error(), "injected fault") {
		t.Fatalf("request during the panic: %v, want the rank's panic", err)
	}
	select {
	case <-panicked:
	default:
		t.Fatal("rank 1 never ran its fault")
	}
	for i, ref := range refs {
		got, err := gen(fmt.Sprintf("after-%d", i), ref)
		if err != nil {
			t.Fatalf("prompt %d after the restart: %v", i, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(ref.GreedyIDs) {
			t.Errorf("prompt %d after the restart: got %v, want %v", i, got, ref.GreedyIDs)
		}
	}
	n.replicasMu.Lock()
	procs := n.replicas[0].actors
	n.replicasMu.Unlock()
	for r, want := range []uint64{0, 1} {
		ref, ok := procs[r].(*actors.Ref[scheduler.ShardCall])
		if !ok {
			t.Fatalf("actor %d is %T, not a rank", r, procs[r])
		}
		if st := ref.Stats(); st.Restarts != want {
			t.Errorf("rank %d stats %+v, want %d restarts", r, st, want)
		}
	}
	// The exporter forgets its spans when it shuts down: flush instead.
	if err := tp.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	// Each rank recorded shard.forward spans with its rank; a step's ranks
	// share their parent (the decode step).
	parents := map[string]map[int]bool{}
	for _, s := range exp.GetSpans() {
		if s.Name != trace.SpanShardForward {
			continue
		}
		rank := -1
		for _, a := range s.Attributes {
			if a.Key == trace.AttrShardRank {
				rank = int(a.Value.AsInt64())
			}
		}
		if rank < 0 {
			t.Fatalf("shard.forward span without %s: %v", trace.AttrShardRank, s.Attributes)
		}
		p := s.Parent.SpanID().String()
		if parents[p] == nil {
			parents[p] = map[int]bool{}
		}
		parents[p][rank] = true
	}
	if len(parents) == 0 {
		t.Fatal("no shard.forward spans")
	}
	// The failed step lacks the span of the rank that panicked first.
	missing := 0
	for _, rs := range parents {
		if !rs[0] || !rs[1] {
			missing++
		}
	}
	if missing > 1 {
		t.Errorf("%d of %d steps lack a rank's shard.forward span", missing, len(parents))
	}
}

// BenchmarkServeTP measures the served demo model on the CPU lane with
// --tp 1 (one device with all the threads) and --tp 2 (two devices
// sharing them, summing through the host fabric) for 1 and 8 streaming
// clients: aggregate tokens/s and the p50 inter-token latency.
//
//	go test -run XXX -bench ServeTP -benchtime 2x -count 3 ./cmd/troupe
func BenchmarkServeTP(b *testing.B) {
	for _, tp := range []int{1, 2} {
		for _, streams := range []int{1, 8} {
			b.Run(fmt.Sprintf("tp=%d/streams=%d", tp, streams), func(b *testing.B) {
				s := startServe(b, func(c *serveConfig) { c.TP = tp })
				const tokens = 64
				var itl []time.Duration
				var total int
				var mu sync.Mutex
				start := time.Now()
				for b.Loop() {
					var wg sync.WaitGroup
					for range streams {
						wg.Go(func() {
							_, gaps, n, err := streamOnce(s.url, tokens)
							if err != nil {
								b.Error(err)
								return
							}
							mu.Lock()
							itl, total = append(itl, gaps...), total+n
							mu.Unlock()
						})
					}
					wg.Wait()
				}
				b.ReportMetric(float64(total)/time.Since(start).Seconds(), "tok/s")
				b.ReportMetric(ms(pct(itl, 50)), "itl_p50_ms")
			})
		}
	}
}

// TestTPDevices reserves a tensor-parallel node's devices for replicas:
// the free ones of lowest index first, more opened where too few are
// free, up to the node's most, and given back when a replica stops.
func TestTPDevices(t *testing.T) {
	ctx := context.Background()
	opened := 0
	ts := &tpState{tp: 2, most: 6, shards: map[string][]*scheduler.Shard{}, open: func(_ context.Context, i int) (gpu.Device, *cuda.Device, error) {
		if i != opened {
			t.Errorf("opened device %d after %d", i, opened)
		}
		opened++
		return ref.New(), nil, nil
	}}
	take := func(id string, k int, want string) {
		t.Helper()
		idx, devs, cudas, err := ts.take(ctx, id, k)
		got := fmt.Sprint(idx)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, want) || (err == nil && (len(devs) != k || cudas != nil)) {
			t.Errorf("take %s %d: got %s (%d devices), want %s", id, k, got, len(devs), want)
		}
	}
	take("", 2, "[0 1]") // the start's devices, opened and free
	take("a", 2, "[0 1]")
	take("b", 2, "[2 3]")
	take("c", 4, "4 devices for c: 2 of the node's 6 are free")
	ts.release("c") // a failed start gives back what it took
	ts.release("a")
	take("d", 4, "[0 1 4 5]")
	ts.release("b")
	take("e", 2, "[2 3]")
	if opened != 6 {
		t.Errorf("%d devices opened, want 6", opened)
	}
}
