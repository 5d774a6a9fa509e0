package trace

import (
	"context"
	"errors"
	"github.com/troupe/troupe/trace/tracetest"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestJaegerEndToEnd exports a request's spans to a real Jaeger over OTLP
// gRPC and over OTLP HTTP, each configured as the OTEL_* variables would,
// and reads them back through the query API until every per-token span of
// the request has arrived.
func TestJaegerEndToEnd(t *testing.T) {
	bin := os.Getenv("TROUPE_JAEGER")
	if bin == "" {
		t.Skip("TROUPE_JAEGER is unset: run `make test`, which builds Jaeger from trace/testdata/jaeger " +
			"into $HOME/.cache/troupe/tools, or build it there with " +
			"`go build -o jaeger github.com/jaegertracing/jaeger/cmd/jaeger` and set TROUPE_JAEGER to the binary")
	}
	j := tracetest.StartJaeger(t, bin)

	for _, tc := range []struct {
		protocol, endpoint string
	}{
		{ProtocolGRPC, "http://" + j.OTLPGRPC},
		{ProtocolHTTP, "http://" + j.OTLPHTTP},
	} {
		t.Run(strings.ReplaceAll(tc.protocol, "/", "-"), func(t *testing.T) {
			t.Parallel()
			service := "troupe-e2e-" + strings.ReplaceAll(tc.protocol, "/", "-")
			requestID := "e2e-" + strings.ReplaceAll(tc.protocol, "/", "-")
			exp, err := ExportFromEnv(env(map[string]string{
				"OTEL_TRACES_EXPORTER":        "otlp",
				"OTEL_EXPORTER_OTLP_PROTOCOL": tc.protocol,
				"OTEL_EXPORTER_OTLP_ENDPOINT": tc.endpoint,
			}))
			if err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.ServiceName = service
			cfg.Export = exp
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			p, err := Setup(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			const tokens = 4
			traceID := runRequest(p.Tracer(), requestID, tokens)
			local, _ := p.Store().Trace(traceID)
			if err := p.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown (flush to jaeger): %v", err)
			}

			client := JaegerClient{BaseURL: j.Query, Service: service, HTTP: &http.Client{Timeout: 5 * time.Second}}
			var w Waterfall
			for {
				w, err = client.Request(ctx, requestID)
				if err == nil && len(w.Spans) == len(local.Spans) {
					break
				}
				if err != nil && !errors.Is(err, ErrNotFound) {
					t.Fatalf("jaeger query: %v", err)
				}
				select {
				case <-ctx.Done():
					t.Fatalf("jaeger has %d of %d spans of request %s after waiting: %v", len(w.Spans), len(local.Spans), requestID, err)
				case <-time.After(100 * time.Millisecond):
				}
			}
			client.HTTP.(*http.Client).CloseIdleConnections()

			if w.TraceID != traceID.String() {
				t.Errorf("jaeger trace id %s, want %s", w.TraceID, traceID)
			}
			sameStructure(t, w, local)
			rows := Breakdown(w)
			if len(rows) != tokens {
				t.Fatalf("breakdown has %d rows, want %d", len(rows), tokens)
			}
			for i, r := range rows {
				if r.Seq != int64(i) || r.TokenID != 100+int64(i) || len(r.Shards) != 2 {
					t.Errorf("row %d: seq %d token %d shards %d", i, r.Seq, r.TokenID, len(r.Shards))
				}
			}
			byID, err := client.Fetch(ctx, traceID.String())
			if err != nil {
				t.Fatalf("fetch by trace id: %v", err)
			}
			sameStructure(t, byID, local)
			client.HTTP.(*http.Client).CloseIdleConnections()
		})
	}
}

// sameStructure checks that got has the spans of want, with the same
// names, parents and attributes (numbers compared as integers).
func sameStructure(t *testing.T, got, want Waterfall) {
	t.Helper()
	gotByID := map[string]Span{}
	for _, s := range got.Spans {
		gotByID[s.SpanID] = s
	}
	if len(got.Spans) != len(want.Spans) {
		t.Errorf("got %d spans, want %d", len(got.Spans), len(want.Spans))
	}
	for _, w := range want.Spans {
		g, ok := gotByID[w.SpanID]
		if !ok {
			t.Errorf("span %s %s missing", w.Name, w.SpanID)
			continue
		}
		if g.Name != w.Name || g.ParentID != w.ParentID {
			t.Errorf("span %s: got %s under %q, want %s under %q", w.SpanID, g.Name, g.ParentID, w.Name, w.ParentID)
		}
		for k, v := range w.Attrs {
			switch v.(type) {
			case int64:
				gi, ok := g.Int(k)
				wi, _ := w.Int(k)
				if !ok || gi != wi {
					t.Errorf("span %s attr %s = %v, want %v", w.Name, k, g.Attrs[k], v)
				}
			default:
				if g.Attrs[k] != v {
					t.Errorf("span %s attr %s = %v, want %v", w.Name, k, g.Attrs[k], v)
				}
			}
		}
	}
}
