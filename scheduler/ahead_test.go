package scheduler

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	ttrace "github.com/troupe/troupe/trace"
	"github.com/troupe/troupe/xgmi"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestShardQueuesAhead drives a shard that queues greedy and drawn steps ahead with
// hand-made plans, beside a shard that does not, on the demo model: every
// reply equals the plain shard's; a plan that is the queued step is
// answered by it; a plan fed another token, one whose blocks lack the next
// position, one that says it does not continue, and a logits step each
// leave nothing queued, or drop what was.
func TestShardQueuesAhead(t *testing.T) {
	ctx := context.Background()
	b, dev := demoOnCPU(t)
	plane := xgmi.NewHost("n")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(ctx)
	shard := func(ahead bool) *Shard {
		m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{MaxTokens: 64, MaxSeqs: 4})
		if err != nil {
			t.Fatal(err)
		}
		cache, err := m.NewCache(16, 16)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cache.Close(); m.Close() })
		var p trace.TracerProvider
		if ahead {
			p = tp
		}
		s := NewShard(fmt.Sprint(ahead), 0, m, cache, plane, p)
		s.QueueAhead = ahead
		return s
	}
	queued, plain := shard(true), shard(false)
	tables := [][]int32{{0, 1}, {2, 3}}
	step := func(what string, m ForwardMsg) []int32 {
		t.Helper()
		got, err := queued.Forward(ctx, m)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		want, err := plain.Forward(ctx, m)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !slices.Equal(got.IDs, want.IDs) {
			t.Fatalf("%s: the queueing shard chose %v, the plain one %v", what, got.IDs, want.IDs)
		}
		return got.IDs
	}
	expect := func(what string, used, dropped int, pending bool) {
		t.Helper()
		if queued.aheadUsed != used || queued.aheadDropped != dropped || (queued.ahead != nil) != pending {
			t.Fatalf("%s: %d answered ahead, %d dropped, pending %v; want %d, %d, %v", what,
				queued.aheadUsed, queued.aheadDropped, queued.ahead != nil, used, dropped, pending)
		}
	}
	prompt := ForwardMsg{Tokens: []int32{5, 9, 200, 31, 7, 11, 4}, Pos: []int32{0, 1, 2, 3, 4, 0, 1}, Seq: []int32{0, 0, 0, 0, 0, 1, 1},
		Tables: tables, Logits: []int32{4, 6}, Argmax: true, Continues: true}
	ids := step("prompt", prompt)
	expect("a prompt step", 0, 0, false)
	dec := ForwardMsg{Tokens: ids, Pos: []int32{5, 2}, Seq: []int32{0, 1}, Tables: tables, Logits: []int32{0, 1}, Argmax: true, Continues: true}
	next := func() {
		dec.Tokens = slices.Clone(ids)
		dec.Pos = []int32{dec.Pos[0] + 1, dec.Pos[1] + 1}
	}
	ids = step("decode 1", dec)
	expect("a decode step", 0, 0, true)
	for i := 2; i <= 4; i++ {
		next()
		ids = step(fmt.Sprint("decode ", i), dec)
	}
	expect("steady decoding", 3, 0, true)
	next()
	dec.Tokens[1] = ids[1] + 1 // not the token chosen
	ids = step("another token", dec)
	expect("another token", 3, 1, true)
	next()
	dec.Continues = false
	ids = step("an ending step", dec)
	expect("an ending step", 4, 1, false)
	// Sequence 1 at position 31 fills its two blocks: no room for 32.
	dec.Continues = true
	dec.Tokens, dec.Pos = slices.Clone(ids), []int32{dec.Pos[0] + 1, 31}
	step("a full table", dec)
	expect("a full table", 4, 1, false)
	dec.Pos = []int32{dec.Pos[0] + 1, 20}
	step("a jump", dec)
	expect("a jump", 4, 1, true)
	logits := dec
	logits.Argmax, logits.Pos = false, []int32{dec.Pos[0] + 1, 21}
	for _, sh := range []*Shard{queued, plain} {
		if _, err := sh.Forward(ctx, logits); err != nil {
			t.Fatal(err)
		}
	}
	expect("a logits step", 4, 2, false)
	// Drawn steps are queued with the next draws their plan carries; a plan
	// whose draws are not the queued step's drops it; one without next
	// draws queues nothing.
	draws := func(u float64) []gpu.SampleRow {
		return []gpu.SampleRow{{Temperature: 0.9, TopK: 20, U: u}, {Temperature: 1.1, U: 1 - u}}
	}
	dr := ForwardMsg{Tokens: []int32{1, 2}, Pos: []int32{logits.Pos[0] + 1, 22}, Seq: []int32{0, 1}, Tables: tables, Logits: []int32{0, 1},
		Sample: draws(0.3), NextSample: draws(0.6), Continues: true}
	drawNext := func(u, next float64) {
		dr.Tokens, dr.Pos = slices.Clone(ids), []int32{dr.Pos[0] + 1, dr.Pos[1] + 1}
		dr.Sample, dr.NextSample = draws(u), nil
		if next >= 0 {
			dr.NextSample = draws(next)
		}
	}
	ids = step("drawn 1", dr)
	expect("a drawn step", 4, 2, true)
	drawNext(0.6, 0.8)
	ids = step("drawn 2", dr)
	expect("steady drawing", 5, 2, true)
	drawNext(0.1, 0.2)
	ids = step("another draw", dr)
	expect("another draw", 5, 3, true)
	drawNext(0.2, -1)
	ids = step("no next draws", dr)
	expect("no next draws", 6, 3, false)
	// Draws with penalties and a bias: the next step's draws follow this
	// step's lists (kept with the device's tokens), and the plan after
	// carries them resolved, as the scheduler's sequences keep them; a
	// plan whose lists differ drops the queued step.
	pen := gpu.Penalties{Repetition: 1.3, Presence: 0.4, Frequency: 0.6}
	dr.Sample = []gpu.SampleRow{
		{Temperature: 0.9, U: 0.3, Penalties: pen, Adjust: []gpu.LogitAdjust{{ID: 5, Seen: true}, {ID: 9, Bias: 2}}},
		{Temperature: 1.1, U: 0.7, Adjust: []gpu.LogitAdjust{{ID: 3, Bias: -100}}},
	}
	follow := func(u float64) []gpu.SampleRow {
		next := slices.Clone(dr.Sample)
		for i := range next {
			next[i].Adjust, next[i].Follows, next[i].U = nil, true, u
		}
		return next
	}
	penNext := func(u float64) {
		resolved, err := gpu.FollowRows(dr.Sample, ids, dr.NextSample)
		if err != nil {
			t.Fatal(err)
		}
		dr.Tokens, dr.Pos = slices.Clone(ids), []int32{dr.Pos[0] + 1, dr.Pos[1] + 1}
		dr.Sample, dr.NextSample = resolved, follow(u)
	}
	dr.Tokens, dr.Pos, dr.NextSample = slices.Clone(ids), []int32{dr.Pos[0] + 1, dr.Pos[1] + 1}, nil
	dr.NextSample = follow(0.45)
	ids = step("penalised 1", dr)
	expect("a penalised step", 6, 3, true)
	for i := 2; i <= 3; i++ {
		penNext(0.1 * float64(i))
		ids = step(fmt.Sprint("penalised ", i), dr)
	}
	expect("steady penalised drawing", 8, 3, true)
	if n := len(dr.Sample[0].Adjust); n < 3 {
		t.Fatalf("the penalised row's list holds %d tokens after three steps", n)
	}
	penNext(0.9)
	dr.Sample[1].Adjust[0].Bias = -50 // not the list the queued step drew with
	dr.NextSample = nil
	ids = step("another list", dr)
	expect("another list", 8, 4, false)
	// A sequence that ended leaves the next plan: the queued step answers
	// the other's row, and nothing is queued after it.
	both := ForwardMsg{Tokens: slices.Clone(ids), Pos: []int32{dr.Pos[0] + 1, dr.Pos[1] + 1}, Seq: []int32{0, 1}, Tables: tables,
		Logits: []int32{0, 1}, Argmax: true, Continues: true}
	ids = step("both", both)
	expect("both", 8, 4, true)
	one := ForwardMsg{Tokens: []int32{ids[1]}, Pos: []int32{both.Pos[1] + 1}, Seq: []int32{0}, Tables: [][]int32{tables[1]},
		Logits: []int32{0}, Argmax: true, Continues: true}
	step("one left", one)
	expect("one left", 9, 4, false)
	// Each greedy or drawn step's span says how it was met.
	var how []string
	for _, sp := range rec.Ended() {
		for _, a := range sp.Attributes() {
			if a.Key == ttrace.AttrShardAhead {
				how = append(how, a.Value.AsString())
			}
		}
	}
	want := []string{"issued", "issued", "answered", "answered", "answered", "dropped", "answered", "issued", "issued",
		"issued", "answered", "dropped", "answered", "issued", "answered", "answered", "dropped", "issued", "answered"}
	if !slices.Equal(how, want) {
		t.Errorf("shard.ahead of the steps: %v, want %v", how, want)
	}
}
