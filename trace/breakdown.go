package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
)

// TokenRow is the latency breakdown of one token of a request, in
// microseconds.
type TokenRow struct {
	// Seq is the token's number within the request, from AttrTokenSeq.
	Seq int64 `json:"seq"`
	// TokenID is the sampled token, or -1 when the trace does not say.
	TokenID int64 `json:"token_id"`
	// Kind is the name of the token's step span: SpanPrefill or
	// SpanDecodeStep.
	Kind string `json:"kind"`
	// StartUS is when the token's step began, after the trace's start.
	StartUS float64 `json:"start_us"`
	// TotalUS is the step's duration, including spans under it that end
	// after it; for the first token, the time from the trace's start to the
	// end of its step (time to first token).
	TotalUS float64 `json:"total_us"`
	// QueueUS is the request's queue time, on the first token's row only.
	QueueUS float64 `json:"queue_us,omitempty"`
	// PrefillUS is the time in prefill spans; prefill chunks that yield no
	// token count towards the next row.
	PrefillUS float64     `json:"prefill_us,omitempty"`
	Shards    []ShardTime `json:"shards"`
	SampleUS  float64     `json:"sample_us"`
	EmitUS    float64     `json:"emit_us"`
	// OtherUS is TotalUS less queue, shard forwards, sample and emit: the
	// time spent between them (scheduling, messaging, and prefill work
	// outside the shards).
	OtherUS float64 `json:"other_us"`
}

// ShardTime is one shard's forward time within a token's step. When
// several spans share a shard index (tensor-parallel ranks), it is the
// time from the first start to the last end among them.
type ShardTime struct {
	Index      int64   `json:"index"`
	LayerStart int64   `json:"layer_start"`
	LayerEnd   int64   `json:"layer_end"`
	ForwardUS  float64 `json:"forward_us"`
}

// Breakdown computes the per-token latency breakdown of a request's trace,
// one row per token, ordered by Seq. A step is a prefill or decode.step
// span; its token is its AttrTokenSeq, else that of an emit span under it.
// Prefill chunks that yield no token count towards the next token's row;
// the first token's row also gets the queue time, and its total runs from
// the trace's start (time to first token). A trailing prefill that has
// yielded no token yet gives a row with Seq -1.
func Breakdown(w Waterfall) []TokenRow {
	children := make(map[string][]int, len(w.Spans))
	for i, s := range w.Spans {
		if s.ParentID != "" {
			children[s.ParentID] = append(children[s.ParentID], i)
		}
	}
	var queueUS float64
	for _, s := range w.Spans {
		if s.Name == SpanQueue {
			queueUS += s.DurationUS
		}
	}

	var (
		rows    []TokenRow
		ends    []float64 // end of each row's step and its descendants
		pending *TokenRow // prefill chunks that yielded no token yet
		pendEnd float64
	)
	for _, step := range w.Spans { // in start order
		if step.Name != SpanPrefill && step.Name != SpanDecodeStep {
			continue
		}
		r, end := stepRow(w.Spans, children, step)
		if r.Seq < 0 && step.Name == SpanPrefill {
			if pending == nil {
				pending = &r
			} else {
				mergeRow(pending, r)
			}
			pendEnd = max(pendEnd, end)
			continue
		}
		if pending != nil {
			mergeRow(&r, *pending)
			pending = nil
		}
		rows, ends = append(rows, r), append(ends, end)
	}
	if pending != nil {
		rows, ends = append(rows, *pending), append(ends, pendEnd)
	}
	for i := range rows {
		r := &rows[i]
		if i == 0 {
			r.QueueUS = queueUS
			r.TotalUS = ends[i] // from the trace's start
		} else {
			r.TotalUS = ends[i] - r.StartUS
		}
		slices.SortFunc(r.Shards, func(a, b ShardTime) int { return int(a.Index - b.Index) })
		r.OtherUS = r.TotalUS - r.QueueUS - r.SampleUS - r.EmitUS
		for _, sh := range r.Shards {
			r.OtherUS -= sh.ForwardUS
		}
	}
	slices.SortStableFunc(rows, func(a, b TokenRow) int {
		switch {
		case a.Seq < b.Seq:
			return -1
		case a.Seq > b.Seq:
			return 1
		}
		return 0
	})
	return rows
}

// stepRow sums the spans under step into a row, and returns the latest end
// among step and its descendants.
func stepRow(spans []Span, children map[string][]int, step Span) (TokenRow, float64) {
	r := TokenRow{Kind: step.Name, StartUS: step.StartUS, TokenID: -1, Seq: -1}
	if seq, ok := step.Int(string(AttrTokenSeq)); ok {
		r.Seq = seq
	}
	if id, ok := step.Int(string(AttrTokenID)); ok {
		r.TokenID = id
	}
	if step.Name == SpanPrefill {
		r.PrefillUS = step.DurationUS
	}
	end := step.End()
	shards := map[int64]*shardSpan{}
	walk(spans, children, step.SpanID, func(s Span) {
		end = max(end, s.End())
		switch s.Name {
		case SpanShardForward:
			idx, _ := s.Int(string(AttrShardIndex))
			sh := shards[idx]
			if sh == nil {
				sh = &shardSpan{start: s.StartUS, end: s.End()}
				sh.layerStart, _ = s.Int(string(AttrLayerStart))
				sh.layerEnd, _ = s.Int(string(AttrLayerEnd))
				shards[idx] = sh
			}
			sh.start, sh.end = min(sh.start, s.StartUS), max(sh.end, s.End())
		case SpanSample:
			r.SampleUS += s.DurationUS
		case SpanEmit:
			r.EmitUS += s.DurationUS
			if r.Seq < 0 {
				if seq, ok := s.Int(string(AttrTokenSeq)); ok {
					r.Seq = seq
				}
			}
		}
		if r.TokenID < 0 && (s.Name == SpanEmit || s.Name == SpanSample) {
			if id, ok := s.Int(string(AttrTokenID)); ok {
				r.TokenID = id
			}
		}
	})
	for idx, sh := range shards {
		r.Shards = append(r.Shards, ShardTime{Index: idx, LayerStart: sh.layerStart, LayerEnd: sh.layerEnd, ForwardUS: sh.end - sh.start})
	}
	return r, end
}

// mergeRow adds the times of b into a.
func mergeRow(a *TokenRow, b TokenRow) {
	a.PrefillUS += b.PrefillUS
	a.SampleUS += b.SampleUS
	a.EmitUS += b.EmitUS
	a.Shards = mergeShards(a.Shards, b.Shards)
}

type shardSpan struct {
	start, end           float64
	layerStart, layerEnd int64
}

// walk calls fn for every descendant of the span with id parent.
func walk(spans []Span, children map[string][]int, parent string, fn func(Span)) {
	for _, i := range children[parent] {
		fn(spans[i])
		walk(spans, children, spans[i].SpanID, fn)
	}
}

// mergeShards adds the forward times of b into a, by shard index.
func mergeShards(a, b []ShardTime) []ShardTime {
	for _, sb := range b {
		i := slices.IndexFunc(a, func(s ShardTime) bool { return s.Index == sb.Index })
		if i < 0 {
			a = append(a, sb)
			continue
		}
		a[i].ForwardUS += sb.ForwardUS
	}
	return a
}

// WriteBreakdown writes rows as an indented JSON array, or as a text
// table followed by the mean of the decode rows.
func WriteBreakdown(w io.Writer, rows []TokenRow, asJSON bool) error {
	if asJSON {
		if rows == nil {
			rows = []TokenRow{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			return fmt.Errorf("trace: write breakdown: %w", err)
		}
		return nil
	}

	// The shard columns are the union of shard indices over all rows.
	var shards []ShardTime
	for _, r := range rows {
		for _, s := range r.Shards {
			if !slices.ContainsFunc(shards, func(x ShardTime) bool { return x.Index == s.Index }) {
				shards = append(shards, s)
			}
		}
	}
	slices.SortFunc(shards, func(a, b ShardTime) int { return int(a.Index - b.Index) })

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "seq\ttoken\tkind\ttotal_us\tqueue_us\tprefill_us\t"
	for _, s := range shards {
		head += fmt.Sprintf("shard%d[%d,%d)_us\t", s.Index, s.LayerStart, s.LayerEnd)
	}
	fmt.Fprintln(tw, head+"sample_us\temit_us\tother_us\t")

	var mean TokenRow
	meanShards := make([]float64, len(shards))
	n := 0
	for _, r := range rows {
		token := "-"
		if r.TokenID >= 0 {
			token = strconv.FormatInt(r.TokenID, 10)
		}
		line := fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s\t", r.Seq, token, r.Kind, us(r.TotalUS), usOpt(r.QueueUS), usOpt(r.PrefillUS))
		for i, s := range shards {
			j := slices.IndexFunc(r.Shards, func(x ShardTime) bool { return x.Index == s.Index })
			if j < 0 {
				line += "-\t"
				continue
			}
			line += us(r.Shards[j].ForwardUS) + "\t"
			if r.Kind == SpanDecodeStep {
				meanShards[i] += r.Shards[j].ForwardUS
			}
		}
		fmt.Fprintln(tw, line+us(r.SampleUS)+"\t"+us(r.EmitUS)+"\t"+us(r.OtherUS)+"\t")
		if r.Kind == SpanDecodeStep {
			n++
			mean.TotalUS += r.TotalUS
			mean.SampleUS += r.SampleUS
			mean.EmitUS += r.EmitUS
			mean.OtherUS += r.OtherUS
		}
	}
	if n > 0 {
		f := float64(n)
		line := fmt.Sprintf("mean\tn=%d\t%s\t%s\t-\t-\t", n, SpanDecodeStep, us(mean.TotalUS/f))
		for _, v := range meanShards {
			line += us(v/f) + "\t"
		}
		fmt.Fprintln(tw, line+us(mean.SampleUS/f)+"\t"+us(mean.EmitUS/f)+"\t"+us(mean.OtherUS/f)+"\t")
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("trace: write breakdown: %w", err)
	}
	return nil
}

func us(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func usOpt(v float64) string {
	if v == 0 {
		return "-"
	}
	return us(v)
}
