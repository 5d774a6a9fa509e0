package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/xgmi"
)

// fakeGroup stands for a fabric: a collective waits until every rank
// arrived or the group is aborted.
type fakeGroup struct {
	ranks int

	mu      sync.Mutex
	arrived int
	all     chan struct{} // closed when every rank arrived
	aborted chan struct{} // closed by Abort; replaced by Reset
	resets  int
	running *atomic.Int32 // ranks in a pass
	dirty   int           // ranks in a pass at a reset
}

func newFakeGroup(ranks int, running *atomic.Int32) *fakeGroup {
	return &fakeGroup{ranks: ranks, all: make(chan struct{}), aborted: make(chan struct{}), running: running}
}

func (g *fakeGroup) Abort(error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.aborted:
	default:
		close(g.aborted)
	}
}

func (g *fakeGroup) Reset() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.resets++
	g.dirty += int(g.running.Load())
	g.arrived, g.all, g.aborted = 0, make(chan struct{}), make(chan struct{})
	return nil
}

// collective is a rank's all-reduce: it returns once every rank arrived,
// or fails once the group is aborted.
func (g *fakeGroup) collective() error {
	g.mu.Lock()
	all, aborted := g.all, g.aborted
	if g.arrived++; g.arrived == g.ranks {
		close(g.all)
	}
	g.mu.Unlock()
	select {
	case <-all:
		return nil
	case <-aborted:
		return xgmi.ErrAborted
	}
}

// rankActor is a scripted rank: behave decides, per step, whether it
// joins the collective, fails, or waits for the abort without joining.
type rankActor struct {
	rank    int
	g       *fakeGroup
	plane   *xgmi.Host
	running *atomic.Int32
	behave  func(step uint64) string
	seen    chan<- ForwardMsg // each drawn step's plan
	plans   chan<- ForwardMsg // every plan, where not nil
}

func (a rankActor) Receive(_ context.Context, c ShardCall) error {
	a.running.Add(1)
	defer a.running.Add(-1)
	if a.plans != nil {
		a.plans <- c.Req
	}
	switch a.behave(c.Req.Step) {
	case "fail":
		c.Fail(errors.New("scripted failure"))
		return nil
	case "hang":
		// A rank that never reaches the collective (a missed issue): it
		// stays out until the group is aborted.
		a.g.mu.Lock()
		aborted := a.g.aborted
		a.g.mu.Unlock()
		<-aborted
		c.Fail(errors.New("hung rank released"))
		return nil
	}
	if err := a.g.collective(); err != nil {
		c.Fail(err)
		return nil
	}
	if len(c.Req.Sample) > 0 {
		a.seen <- c.Req
	}
	name := fmt.Sprintf("rank/%d", a.rank)
	out := []float32{float32(a.rank), float32(c.Req.Step)}
	ref := bus.TensorRef{Location: bus.LocationHost, Node: a.plane.Node(), Buffer: name, Bytes: 8, DType: bus.F32, Shape: []int64{1, 2}}
	if c.Req.Argmax || len(c.Req.Sample) > 0 {
		r := ForwardReply{IDs: []int32{int32(100*a.rank) + int32(c.Req.Step)}}
		if len(c.Req.Read) > 0 {
			a.plane.Publish(name, out)
			r.Output = ref
		}
		return c.Reply(r)
	}
	a.plane.Publish(name, out)
	return c.Reply(ForwardReply{Output: ref})
}

// rankLab is what the tests of scripted ranks share: a bus, an actor
// system on it, a plane, and a fake group of two ranks.
type rankLab struct {
	node    *bus.Node
	nc      *nats.Conn
	sys     *actors.System
	plane   *xgmi.Host
	running atomic.Int32 // ranks in a pass
	g       *fakeGroup
}

func newRankLab(t *testing.T) *rankLab {
	t.Helper()
	node, nc := testBus(t)
	sys, err := actors.NewSystem(actors.Config{Cluster: "test", Node: node.Name()}, nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sys.Shutdown(context.Background()) })
	l := &rankLab{node: node, nc: nc, sys: sys, plane: xgmi.NewHost(node.Name())}
	l.g = newFakeGroup(2, &l.running)
	return l
}

// spawnRanks spawns the lab's two scripted ranks, prefix0 and prefix1:
// each is like (its rank, group, plane and counter filled in), behaving
// at each step as behave says for its rank.
func (l *rankLab) spawnRanks(t *testing.T, prefix string, like rankActor, behave func(rank int, step uint64) string) []*actors.Ref[ShardCall] {
	t.Helper()
	var refs []*actors.Ref[ShardCall]
	for r := range 2 {
		a := like
		a.rank, a.g, a.plane, a.running = r, l.g, l.plane, &l.running
		a.behave = func(step uint64) string { return behave(r, step) }
		ref, err := actors.Spawn(context.Background(), l.sys, actors.Props[ShardCall]{Kind: ShardKind, ID: fmt.Sprintf("%s%d", prefix, r),
			New: func() actors.Actor[ShardCall] { return a }})
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	return refs
}

// TestLockstep drives two scripted ranks: a step that succeeds returns
// rank 0's logits; a step where a rank fails, or never reaches the
// collective, fails as a whole, with the group aborted and reset only once
// no rank is still in its pass; the next step succeeds.
func TestLockstep(t *testing.T) {
	ctx := context.Background()
	lab := newRankLab(t)
	script := map[uint64][2]string{2: {"ok", "fail"}, 3: {"ok", "hang"}}
	seen := make(chan ForwardMsg, 2)
	g := lab.g
	refs := lab.spawnRanks(t, "t", rankActor{seen: seen}, func(r int, step uint64) string {
		if s, ok := script[step]; ok {
			return s[r]
		}
		return "ok"
	})
	l, err := NewLockstep(refs, g, lab.plane, 2)
	if err != nil {
		t.Fatal(err)
	}
	b := &models.Batch{Tokens: []int32{5}, Pos: []int32{0}, Seq: []int32{0}, Tables: [][]int32{{0}}, Logits: []int32{0}}
	logits := make([]float32, 2)
	for step, want := range []string{"", "scripted failure", "did not finish", ""} {
		// The hung step ends when the watchdog aborts the group; the
		// others have all the time they need.
		l.StepTimeout = time.Minute
		if strings.Contains(want, "finish") {
			l.StepTimeout = 20 * time.Millisecond
		}
		err := l.Forward(ctx, b, logits)
		switch {
		case want == "" && err != nil:
			t.Fatalf("step %d: %v", step+1, err)
		case want == "" && (logits[0] != 0 || logits[1] != float32(step+1)):
			t.Errorf("step %d: logits %v, want rank 0's [0 %d]", step+1, logits, step+1)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("step %d: got %v, want an error containing %q", step+1, err, want)
		}
	}
	// A greedy step: every rank chooses, rank 0's choice is the step's.
	ids := make([]int32, 1)
	if err := l.ForwardArgmax(ctx, b, ids); err != nil || ids[0] != 5 {
		t.Errorf("argmax step 5: ids %v, err %v; want rank 0's [5]", ids, err)
	}
	// A drawn step that continues: every rank gets the draws, the next
	// step's and Continues (so that ranks that queue ahead all do); rank
	// 0's draw is the step's.
	rows := []gpu.SampleRow{{Temperature: 0.8, U: 0.25}}
	next := []gpu.SampleRow{{Temperature: 0.8, U: 0.75}}
	drawn := *b
	drawn.Continues, drawn.NextDraws = true, next
	if err := l.ForwardSample(ctx, &drawn, rows, ids); err != nil || ids[0] != 6 {
		t.Errorf("drawn step 6: ids %v, err %v; want rank 0's [6]", ids, err)
	}
	for range refs {
		m := <-seen
		if !m.Continues || !slices.EqualFunc(m.Sample, rows, gpu.SampleRow.Equal) || !slices.EqualFunc(m.NextSample, next, gpu.SampleRow.Equal) || m.Argmax {
			t.Errorf("a rank's drawn plan: continues %v, sample %v, next %v, argmax %v", m.Continues, m.Sample, m.NextSample, m.Argmax)
		}
	}
	if err := l.ForwardSample(ctx, b, nil, ids); err == nil {
		t.Error("a drawn step without draws ran")
	}
	// Steps that read their row: rank 0's tokens and row.
	read := *b
	read.Read = []int32{0}
	if err := l.ForwardChoose(ctx, &read, nil, ids, logits); err != nil || ids[0] != 7 || logits[0] != 0 || logits[1] != 7 {
		t.Errorf("argmax step 7 reading its row: ids %v, row %v, err %v; want rank 0's [7] and [0 7]", ids, logits, err)
	}
	if err := l.ForwardChoose(ctx, &read, rows, ids, logits); err != nil || ids[0] != 8 || logits[1] != 8 {
		t.Errorf("drawn step 8 reading its row: ids %v, row %v, err %v; want rank 0's [8] and [0 8]", ids, logits, err)
	}
	for range refs {
		if m := <-seen; !slices.Equal(m.Read, read.Read) {
			t.Errorf("a rank's drawn plan reads rows %v, want %v", m.Read, read.Read)
		}
	}
	read.Read = []int32{1}
	if err := l.ForwardChoose(ctx, &read, nil, ids, logits); err == nil {
		t.Error("a step reading a row it does not have ran")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resets != 2 || g.dirty != 0 {
		t.Errorf("%d resets with %d ranks still in a pass, want 2 with none", g.resets, g.dirty)
	}
}

// TestForwardArgmaxWire round-trips a greedy step's plan and reply through
// the bus codec, and checks that a plan without the new fields decodes as
// a logits step.
func TestForwardArgmaxWire(t *testing.T) {
	msg := ForwardMsg{Step: 7, Tokens: []int32{1, 2}, Pos: []int32{0, 1}, Seq: []int32{0, 0}, Tables: [][]int32{{3}}, Logits: []int32{1}, Argmax: true}
	raw, err := bus.Encode(msg)
	if err != nil {
		t.Fatal(err)
	}
	var got ForwardMsg
	if err := bus.Decode(raw, &got); err != nil || !got.Argmax || got.Step != 7 || len(got.Logits) != 1 {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	msg.Argmax = false
	if raw, err = bus.Encode(msg); err != nil {
		t.Fatal(err)
	}
	got = ForwardMsg{}
	if err := bus.Decode(raw, &got); err != nil || got.Argmax {
		t.Fatalf("a logits step decoded as %+v, %v", got, err)
	}
	reply := ForwardReply{IDs: []int32{42, 7}}
	if raw, err = bus.Encode(reply); err != nil {
		t.Fatal(err)
	}
	var r ForwardReply
	if err := bus.Decode(raw, &r); err != nil || len(r.IDs) != 2 || r.IDs[0] != 42 || r.IDs[1] != 7 {
		t.Fatalf("reply decoded as %+v, %v", r, err)
	}
}

// TestDrawsWire round-trips a drawn step's plan, its draws' penalties and
// lists included, the next step's draws that follow them, and a submit
// with penalties and a bias, through the bus codec; a list's entry takes
// at most 13 bytes.
func TestDrawsWire(t *testing.T) {
	pen := gpu.Penalties{Repetition: 1.2, Presence: 0.5, Frequency: -0.25}
	rows := []gpu.SampleRow{
		{Temperature: 0.8, TopK: 40, U: 0.25, Penalties: pen, Adjust: []gpu.LogitAdjust{{ID: 7, Seen: true, Count: 2, Bias: -0.5}, {ID: 90000, Bias: 3}}},
		{Temperature: 0, U: 0},
	}
	next := []gpu.SampleRow{{Temperature: 0.8, TopK: 40, U: 0.5, Penalties: pen, Follows: true}, {}}
	msg := ForwardMsg{Step: 3, Tokens: []int32{1, 2}, Pos: []int32{4, 9}, Seq: []int32{0, 1}, Tables: [][]int32{{3}, {4}}, Logits: []int32{0, 1},
		Sample: rows, NextSample: next, Continues: true}
	raw, err := bus.Encode(msg)
	if err != nil {
		t.Fatal(err)
	}
	var got ForwardMsg
	if err := bus.Decode(raw, &got); err != nil || !slices.EqualFunc(got.Sample, rows, gpu.SampleRow.Equal) || !slices.EqualFunc(got.NextSample, next, gpu.SampleRow.Equal) {
		t.Fatalf("decoded %+v, %+v, %v; want the draws %+v, %+v", got.Sample, got.NextSample, err, rows, next)
	}
	long := msg
	long.Sample = slices.Clone(rows)
	for id := range int32(1000) {
		long.Sample[1].Adjust = append(long.Sample[1].Adjust, gpu.LogitAdjust{ID: 100000 + id, Seen: true, Count: id % 3})
	}
	longRaw, err := bus.Encode(long)
	if err != nil {
		t.Fatal(err)
	}
	if extra := len(longRaw) - len(raw); extra > 13*1000+16 { // and the list's name and length
		t.Errorf("1,000 entries of a list take %d bytes on the wire", extra)
	}
	sub := SubmitMsg{ID: "r", Prompt: []int32{1}, MaxTokens: 4, PresencePenalty: -1.5, FrequencyPenalty: 0.25, LogitBias: map[int32]float32{5: -100, 6: 2}}
	if raw, err = bus.Encode(sub); err != nil {
		t.Fatal(err)
	}
	var s SubmitMsg
	if err := bus.Decode(raw, &s); err != nil || s.PresencePenalty != -1.5 || s.FrequencyPenalty != 0.25 || len(s.LogitBias) != 2 || s.LogitBias[5] != -100 || s.LogitBias[6] != 2 {
		t.Fatalf("submit decoded as %+v, %v", s, err)
	}
}

// TestTPStage serves a stage of two scripted ranks as one actor: a call
// through its mailbox and one over the bus both get rank 0's output, the
// plan reaching every rank as it came (micro-batch included); a step where
// a rank fails fails as a whole, with the group reset, and the next one
// succeeds.
func TestTPStage(t *testing.T) {
	ctx := context.Background()
	lab := newRankLab(t)
	plane, g, nc, node := lab.plane, lab.g, lab.nc, lab.node
	plans := make(chan ForwardMsg, 16)
	ranks := lab.spawnRanks(t, "st-t", rankActor{plans: plans}, func(r int, step uint64) string {
		if step == 2 && r == 1 {
			return "fail"
		}
		return "ok"
	})
	s, err := NewTPStage("st", ranks, g, plane, time.Minute, "layers 4-8, 2 ranks")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := actors.Spawn(ctx, lab.sys, s.Props())
	if err != nil {
		t.Fatal(err)
	}
	subj, _ := bus.NewSubjects("test")
	in := bus.TensorRef{Location: bus.LocationHost, Node: node.Name(), Buffer: "shard/prev", Bytes: 8, DType: bus.F32}
	for step := uint64(1); step <= 3; step++ {
		msg := ForwardMsg{Step: step, Micro: 2, Input: in, Pos: []int32{4}, Seq: []int32{0}, Tables: [][]int32{{0}}}
		var r ForwardReply
		if step%2 == 1 {
			r, err = actors.Ask(ctx, ref, shardCall, msg)
		} else {
			r, err = bus.Request[ForwardMsg, ForwardReply](ctx, nc, subj.ActorEndpoint(ShardKind, "st", "forward"), msg)
		}
		for range 2 {
			if m := <-plans; m.Step != step || m.Micro != 2 || m.Input.Buffer != "shard/prev" || len(m.Pos) != 1 {
				t.Errorf("step %d: a rank's plan %+v", step, m)
			}
		}
		if step == 2 {
			if err == nil || !strings.Contains(err.Error(), "scripted failure") {
				t.Errorf("step 2: %v, want the scripted failure", err)
			}
			continue
		}
		if err != nil || r.Output.Buffer != "rank/0" {
			t.Errorf("step %d: output %q, err %v; want rank 0's rank/0", step, r.Output.Buffer, err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resets != 1 || g.dirty != 0 {
		t.Errorf("%d resets with %d ranks in a pass, want 1 with none", g.resets, g.dirty)
	}
}
