package trace

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// synth builds spans with exact times, in microseconds after t0.
type synth struct {
	t  oteltrace.Tracer
	t0 time.Time
}

func (s synth) span(ctx context.Context, name string, from, to float64, kv ...attribute.KeyValue) context.Context {
	at := func(us float64) time.Time { return s.t0.Add(time.Duration(us * float64(time.Microsecond))) }
	ctx, sp := s.t.Start(ctx, name, oteltrace.WithTimestamp(at(from)), oteltrace.WithAttributes(kv...))
	sp.End(oteltrace.WithTimestamp(at(to)))
	return ctx
}

// open starts a span ended by the returned function at to.
func (s synth) open(ctx context.Context, name string, from float64, kv ...attribute.KeyValue) (context.Context, func(to float64)) {
	at := func(us float64) time.Time { return s.t0.Add(time.Duration(us * float64(time.Microsecond))) }
	ctx, sp := s.t.Start(ctx, name, oteltrace.WithTimestamp(at(from)), oteltrace.WithAttributes(kv...))
	return ctx, func(to float64) { sp.End(oteltrace.WithTimestamp(at(to))) }
}

// syntheticTrace records a request of two prefill chunks and three decode
// steps over two pipeline stages, the second with two tensor-parallel
// ranks, and returns its waterfall from the store.
func syntheticTrace(t *testing.T) Waterfall {
	t.Helper()
	p := newTestProvider(t, DefaultStoreConfig())
	s := synth{t: p.TracerProvider().Tracer(ScopeName), t0: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	fwd := func(ctx context.Context, from, mid, to float64) {
		s.span(ctx, SpanShardForward, from, mid, AttrShardIndex.Int(0), AttrLayerStart.Int(0), AttrLayerEnd.Int(16))
		s.span(ctx, SpanShardForward, mid+10, to, AttrShardIndex.Int(1), AttrLayerStart.Int(16), AttrLayerEnd.Int(32))
		s.span(ctx, SpanShardForward, mid+12, to-5, AttrShardIndex.Int(1), AttrLayerStart.Int(16), AttrLayerEnd.Int(32))
	}

	ctx, endReq := s.open(context.Background(), SpanRequest, 0, AttrRequestID.String("synthetic"))
	s.span(ctx, SpanQueue, 5, 105, AttrRequestID.String("synthetic"))

	// Chunk 1 of the prompt yields no token.
	c := s.span(ctx, SpanPrefill, 110, 1110, AttrPosition.Int(0), AttrPromptTokens.Int(512), AttrKVBlocks.Int(32))
	fwd(c, 120, 600, 1100)
	// Chunk 2 yields token 0.
	c, endPre := s.open(ctx, SpanPrefill, 1120, AttrPosition.Int(512), AttrPromptTokens.Int(100), AttrKVBlocks.Int(39))
	fwd(c, 1130, 1400, 1700)
	s.span(c, SpanSample, 1710, 1730)
	s.span(c, SpanEmit, 1730, 1740, AttrTokenSeq.Int(0), AttrTokenID.Int(9001))
	endPre(1750)

	start := 1800.0
	for seq := 1; seq <= 3; seq++ {
		c, end := s.open(ctx, SpanDecodeStep, start, AttrTokenSeq.Int(seq), AttrBatchSize.Int(4), AttrPosition.Int(611+seq), AttrKVBlocks.Int(39))
		fwd(c, start+20, start+820, start+1620)
		s.span(c, SpanSample, start+1640, start+1660)
		s.span(c, SpanEmit, start+1665, start+1675+float64(seq), AttrTokenSeq.Int(seq), AttrTokenID.Int(9001+seq))
		end(start + 1700 + float64(seq))
		start += 1800
	}
	endReq(start)

	w, ok := p.Store().ByRequest("synthetic")
	if !ok {
		t.Fatal("synthetic request not in the store")
	}
	return w
}

func TestBreakdown(t *testing.T) {
	t.Parallel()
	rows := Breakdown(syntheticTrace(t))
	if len(rows) != 4 {
		t.Fatalf("got %d rows, want 4: %+v", len(rows), rows)
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6 {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}

	first := rows[0]
	if first.Seq != 0 || first.Kind != SpanPrefill || first.TokenID != 9001 {
		t.Errorf("first row seq %d kind %s token %d, want 0 prefill 9001", first.Seq, first.Kind, first.TokenID)
	}
	near("first total (time to first token)", first.TotalUS, 1750)
	near("first queue", first.QueueUS, 100)
	near("first prefill (both chunks)", first.PrefillUS, 1000+630)
	if len(first.Shards) != 2 {
		t.Fatalf("first row has %d shards, want 2", len(first.Shards))
	}
	near("first shard0", first.Shards[0].ForwardUS, (600-120)+(1400-1130))
	near("first shard1", first.Shards[1].ForwardUS, (1100-610)+(1700-1410))
	near("first sample", first.SampleUS, 20)
	near("first emit", first.EmitUS, 10)
	near("first other", first.OtherUS, 1750-100-750-780-20-10)

	for i, r := range rows[1:] {
		seq := float64(i + 1)
		if r.Seq != int64(i+1) || r.Kind != SpanDecodeStep || r.TokenID != 9001+int64(i+1) {
			t.Errorf("row %d: seq %d kind %s token %d", i+1, r.Seq, r.Kind, r.TokenID)
		}
		near("decode total", r.TotalUS, 1700+seq)
		near("decode queue", r.QueueUS, 0)
		if len(r.Shards) != 2 || r.Shards[0].LayerEnd != 16 || r.Shards[1].LayerStart != 16 {
			t.Fatalf("row %d shards %+v", i+1, r.Shards)
		}
		near("decode shard0", r.Shards[0].ForwardUS, 800)
		// The two ranks of shard 1 span [830, 1620).
		near("decode shard1", r.Shards[1].ForwardUS, 790)
		near("decode sample", r.SampleUS, 20)
		near("decode emit", r.EmitUS, 10+seq)
		near("decode other", r.OtherUS, 1700+seq-800-790-20-10-seq)
	}
}

func TestWriteBreakdownGolden(t *testing.T) {
	t.Parallel()
	rows := Breakdown(syntheticTrace(t))
	for _, tc := range []struct {
		file   string
		asJSON bool
	}{
		{"breakdown.golden.txt", false},
		{"breakdown.golden.json", true},
	} {
		var buf bytes.Buffer
		if err := WriteBreakdown(&buf, rows, tc.asJSON); err != nil {
			t.Fatalf("WriteBreakdown: %v", err)
		}
		golden(t, tc.file, buf.Bytes())
	}
}

func TestWriteBreakdownEmpty(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := WriteBreakdown(&buf, nil, true); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); got != "[]\n" {
		t.Errorf("JSON of no rows = %q, want %q", got, "[]\n")
	}
	buf.Reset()
	if err := WriteBreakdown(&buf, nil, false); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(buf.Bytes(), []byte("seq")) || bytes.Count(buf.Bytes(), []byte("\n")) != 1 {
		t.Errorf("table of no rows = %q, want the header line alone", buf.String())
	}
}

// TestBreakdownAfterJSON checks that a waterfall read back from JSON, with
// numbers as float64 or json.Number, gives the same rows.
func TestBreakdownAfterJSON(t *testing.T) {
	t.Parallel()
	w := syntheticTrace(t)
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	var plain Waterfall
	if err := json.Unmarshal(b, &plain); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(Breakdown(w))
	got, _ := json.Marshal(Breakdown(plain))
	if !bytes.Equal(got, want) {
		t.Errorf("breakdown after JSON:\n%s\nwant\n%s", got, want)
	}
}

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\ngot:\n%s\nwant:\n%s", name, got, want)
	}
}

// TestBreakdownPrefillWithoutToken covers a trace whose prefill span yields
// no token itself: the first token comes from a decode.step, which then
// carries the queue and prefill time; the token id is on the sample span.
func TestBreakdownPrefillWithoutToken(t *testing.T) {
	t.Parallel()
	p := newTestProvider(t, DefaultStoreConfig())
	s := synth{t: p.TracerProvider().Tracer(ScopeName), t0: time.Unix(1_000_000, 0)}
	ctx, endReq := s.open(context.Background(), SpanRequest, 0, AttrRequestID.String("sched"))
	s.span(ctx, SpanQueue, 0, 50)
	s.span(ctx, SpanPrefill, 50, 300)
	for seq := range 2 {
		at := 300 + float64(seq)*100
		c, end := s.open(ctx, SpanDecodeStep, at, AttrTokenSeq.Int(seq))
		s.span(c, SpanShardForward, at+10, at+70, AttrShardIndex.Int(0), AttrLayerStart.Int(0), AttrLayerEnd.Int(4))
		s.span(c, SpanSample, at+70, at+75, AttrTokenID.Int(7+seq))
		s.span(c, SpanEmit, at+75, at+80, AttrTokenSeq.Int(seq))
		end(at + 90)
	}
	// A second request's worth of prefill that has not yielded a token yet.
	s.span(ctx, SpanPrefill, 500, 600)
	endReq(600)

	w, ok := p.Store().ByRequest("sched")
	if !ok {
		t.Fatal("request not in the store")
	}
	rows := Breakdown(w)
	type want struct {
		seq, token                     int64
		total, queue, prefill, fwd, ot float64
	}
	wants := []want{
		{seq: -1, token: -1, total: 100, prefill: 100, ot: 100},
		{seq: 0, token: 7, total: 390, queue: 50, prefill: 250, fwd: 60, ot: 390 - 50 - 60 - 5 - 5},
		{seq: 1, token: 8, total: 90, fwd: 60, ot: 90 - 60 - 5 - 5},
	}
	if len(rows) != len(wants) {
		t.Fatalf("got %d rows, want %d: %+v", len(rows), len(wants), rows)
	}
	for i, w := range wants {
		r := rows[i]
		var fwd float64
		for _, sh := range r.Shards {
			fwd += sh.ForwardUS
		}
		got := want{r.Seq, r.TokenID, r.TotalUS, r.QueueUS, r.PrefillUS, fwd, r.OtherUS}
		if got != w {
			t.Errorf("row %d = %+v, want %+v", i, got, w)
		}
	}
}
