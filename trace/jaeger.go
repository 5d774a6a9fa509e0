package trace

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// JaegerClient reads traces from a Jaeger query service's HTTP JSON API
// and converts them to Waterfalls, so that the same breakdown works on
// traces a collector gathered from several nodes.
type JaegerClient struct {
	// BaseURL is the query service, for example http://localhost:16686.
	BaseURL string
	// Service is the service whose traces a lookup by request id searches;
	// empty means "troupe".
	Service string
	// HTTP is the client to use; nil means http.DefaultClient.
	HTTP HTTPDoer
	// Lookback is how far back a lookup by request id searches; zero means
	// 24 hours.
	Lookback time.Duration
}

// Fetch returns the trace id when id is a 32-digit hex trace id that Jaeger
// knows, else the trace of the request with id.
func (c JaegerClient) Fetch(ctx context.Context, id string) (Waterfall, error) {
	if isTraceID(id) {
		w, err := c.Trace(ctx, id)
		if !errors.Is(err, ErrNotFound) {
			return w, err
		}
	}
	return c.Request(ctx, id)
}

// Trace returns the trace with the hex id traceID.
func (c JaegerClient) Trace(ctx context.Context, traceID string) (Waterfall, error) {
	u := strings.TrimRight(c.BaseURL, "/") + "/api/traces/" + url.PathEscape(traceID)
	ws, err := c.get(ctx, u)
	if err != nil {
		return Waterfall{}, fmt.Errorf("trace: jaeger trace %s: %w", traceID, err)
	}
	return ws[0].Waterfall, nil
}

// Request returns the most recent trace that has a span tagged with
// request.id = requestID.
func (c JaegerClient) Request(ctx context.Context, requestID string) (Waterfall, error) {
	service := c.Service
	if service == "" {
		service = "troupe"
	}
	lookback := c.Lookback
	if lookback <= 0 {
		lookback = 24 * time.Hour
	}
	tags, err := json.Marshal(map[string]string{string(AttrRequestID): requestID})
	if err != nil {
		return Waterfall{}, fmt.Errorf("trace: jaeger request %s: %w", requestID, err)
	}
	now := time.Now()
	q := url.Values{
		"service": {service},
		"tags":    {string(tags)},
		"start":   {strconv.FormatInt(now.Add(-lookback).UnixMicro(), 10)},
		"end":     {strconv.FormatInt(now.Add(time.Minute).UnixMicro(), 10)},
		"limit":   {"20"},
	}
	ws, err := c.get(ctx, strings.TrimRight(c.BaseURL, "/")+"/api/traces?"+q.Encode())
	if err != nil {
		return Waterfall{}, fmt.Errorf("trace: jaeger request %s: %w", requestID, err)
	}
	latest := 0
	for i := range ws {
		if ws[i].startUnixUS > ws[latest].startUnixUS {
			latest = i
		}
	}
	return ws[latest].Waterfall, nil
}

// jaegerWaterfall is a Waterfall with its absolute start.
type jaegerWaterfall struct {
	Waterfall
	startUnixUS int64
}

// get fetches u and returns its traces, or ErrNotFound if there are none.
func (c JaegerClient) get(ctx context.Context, u string) ([]jaegerWaterfall, error) {
	var resp jaegerResponse
	if err := getJSON(ctx, c.HTTP, u, &resp); err != nil {
		return nil, err
	}
	ws, err := resp.waterfalls()
	if err != nil {
		return nil, err
	}
	if len(ws) == 0 {
		return nil, ErrNotFound
	}
	return ws, nil
}

// The subset of Jaeger's query API JSON that a Waterfall needs.
type jaegerResponse struct {
	Data   []jaegerTrace `json:"data"`
	Errors []struct {
		Code int    `json:"code"`
		Msg  string `json:"msg"`
	} `json:"errors"`
}

type jaegerTrace struct {
	TraceID string       `json:"traceID"`
	Spans   []jaegerSpan `json:"spans"`
}

type jaegerSpan struct {
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime json.Number `json:"startTime"` // microseconds since the epoch
	Duration  json.Number `json:"duration"`  // microseconds
	Tags      []struct {
		Key   string `json:"key"`
		Type  string `json:"type"`
		Value any    `json:"value"`
	} `json:"tags"`
}

// decodeJaeger parses a query API response.
func decodeJaeger(b []byte) ([]jaegerWaterfall, error) {
	var r jaegerResponse
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	return r.waterfalls()
}

func (r jaegerResponse) waterfalls() ([]jaegerWaterfall, error) {
	if len(r.Errors) > 0 && len(r.Data) == 0 {
		if r.Errors[0].Code == 404 {
			return nil, ErrNotFound
		}
		return nil, fmt.Errorf("jaeger: %d %s", r.Errors[0].Code, r.Errors[0].Msg)
	}
	ws := make([]jaegerWaterfall, 0, len(r.Data))
	for _, t := range r.Data {
		w, err := t.waterfall()
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", t.TraceID, err)
		}
		ws = append(ws, w)
	}
	return ws, nil
}

func (t jaegerTrace) waterfall() (jaegerWaterfall, error) {
	w := jaegerWaterfall{Waterfall: Waterfall{TraceID: t.TraceID, Spans: make([]Span, 0, len(t.Spans))}}
	starts := make([]int64, len(t.Spans))
	for i, s := range t.Spans {
		start, err := s.StartTime.Int64()
		if err != nil {
			return jaegerWaterfall{}, fmt.Errorf("span %s: start time: %w", s.SpanID, err)
		}
		starts[i] = start
		if i == 0 || start < w.startUnixUS {
			w.startUnixUS = start
		}
	}
	for i, s := range t.Spans {
		dur, err := s.Duration.Int64()
		if err != nil {
			return jaegerWaterfall{}, fmt.Errorf("span %s: duration: %w", s.SpanID, err)
		}
		ws := Span{
			Name:       s.OperationName,
			SpanID:     s.SpanID,
			StartUS:    float64(starts[i]) - float64(w.startUnixUS),
			DurationUS: float64(dur),
			Attrs:      make(map[string]any, len(s.Tags)),
		}
		for _, ref := range s.References {
			if ref.RefType == "CHILD_OF" {
				ws.ParentID = ref.SpanID
				break
			}
		}
		for _, tag := range s.Tags {
			if jaegerInternalTag(tag.Key) {
				continue
			}
			ws.Attrs[tag.Key] = jaegerValue(tag.Value)
		}
		w.Spans = append(w.Spans, ws)
	}
	sortSpans(w.Spans)
	return w, nil
}

// jaegerInternalTag reports tags that Jaeger or the SDK add about the
// span's transport rather than the work.
func jaegerInternalTag(k string) bool {
	return k == "span.kind" || strings.HasPrefix(k, "internal.") || strings.HasPrefix(k, "otel.scope.")
}

// jaegerValue turns integral JSON numbers into int64, others into float64.
func jaegerValue(v any) any {
	n, ok := v.(json.Number)
	if !ok {
		return v
	}
	if i, err := n.Int64(); err == nil {
		return i
	}
	if f, err := n.Float64(); err == nil {
		return f
	}
	return n.String()
}

func isTraceID(id string) bool {
	if len(id) != 32 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil && strings.Trim(id, "0") != ""
}
