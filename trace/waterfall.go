package trace

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Waterfall is one trace as a flat list of spans, ordered by start time,
// with times in microseconds relative to the trace's first span. It is the
// JSON document that /debug/traces and /debug/requests serve.
type Waterfall struct {
	TraceID string `json:"trace_id"`
	Spans   []Span `json:"spans"`
	// Dropped counts spans the store did not keep because the trace exceeded
	// its per-trace limit.
	Dropped int `json:"dropped_spans,omitempty"`
}

// Span is one span of a Waterfall.
type Span struct {
	Name     string `json:"name"`
	SpanID   string `json:"span_id"`
	ParentID string `json:"parent_id"` // empty for a root span
	// StartUS is the start in microseconds after the trace's first span began.
	StartUS    float64        `json:"start_us"`
	DurationUS float64        `json:"duration_us"`
	Attrs      map[string]any `json:"attrs"`
}

// Int returns the attribute key of s as an integer. Attributes may hold
// int64 (from spans), float64 or json.Number (from decoded JSON).
func (s Span) Int(key string) (int64, bool) {
	switch v := s.Attrs[key].(type) {
	case int64:
		return v, true
	case int:
		return int64(v), true
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			return int64(v), true
		}
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n, true
		}
	case string:
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n, true
		}
	}
	return 0, false
}

// String returns the attribute key of s as a string.
func (s Span) String(key string) (string, bool) {
	v, ok := s.Attrs[key].(string)
	return v, ok
}

// End returns the end of s in microseconds after the trace's start.
func (s Span) End() float64 { return s.StartUS + s.DurationUS }

// micros converts d to microseconds, keeping nanosecond precision.
func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// waterfallOf builds a Waterfall from ended spans of one trace.
func waterfallOf(traceID string, spans []sdktrace.ReadOnlySpan, dropped int) Waterfall {
	w := Waterfall{TraceID: traceID, Spans: make([]Span, 0, len(spans)), Dropped: dropped}
	if len(spans) == 0 {
		return w
	}
	start := spans[0].StartTime()
	for _, s := range spans[1:] {
		if s.StartTime().Before(start) {
			start = s.StartTime()
		}
	}
	for _, s := range spans {
		ws := Span{
			Name:       s.Name(),
			SpanID:     s.SpanContext().SpanID().String(),
			StartUS:    micros(s.StartTime().Sub(start)),
			DurationUS: micros(s.EndTime().Sub(s.StartTime())),
			Attrs:      make(map[string]any, len(s.Attributes())),
		}
		if p := s.Parent(); p.SpanID().IsValid() {
			ws.ParentID = p.SpanID().String()
		}
		for _, kv := range s.Attributes() {
			ws.Attrs[string(kv.Key)] = kv.Value.AsInterface()
		}
		w.Spans = append(w.Spans, ws)
	}
	sortSpans(w.Spans)
	return w
}

// sortSpans orders spans by start, then by longer first so that a parent
// precedes a child that starts at the same instant.
func sortSpans(spans []Span) {
	slices.SortStableFunc(spans, func(a, b Span) int {
		if a.StartUS != b.StartUS {
			if a.StartUS < b.StartUS {
				return -1
			}
			return 1
		}
		if a.DurationUS != b.DurationUS {
			if a.DurationUS > b.DurationUS {
				return -1
			}
			return 1
		}
		return 0
	})
}
