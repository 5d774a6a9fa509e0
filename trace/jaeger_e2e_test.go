package trace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// jaeger is a Jaeger all-in-one process on loopback ports of its own.
type jaeger struct {
	otlpGRPC, otlpHTTP string // host:port
	query              string // base URL of the query API
}

// jaegerConfig is the all-in-one pipeline with memory storage, every
// listener on a port chosen by the test, no metrics endpoint and no traces
// of Jaeger's own (which it would send to localhost:4317), so that several
// runs can share a machine.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
    traces:
      level: none
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: %[3]s
    grpc:
      endpoint: %[4]s
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %[1]s
      http:
        endpoint: %[2]s
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// startJaeger runs the Jaeger binary bin until the end of the test. A
// port taken between choosing and binding it makes Jaeger exit; it is then
// started again on new ports.
func startJaeger(t *testing.T, bin string) jaeger {
	t.Helper()
	var lastErr error
	for range 3 {
		j, err := tryStartJaeger(t, bin)
		if err == nil {
			return j
		}
		lastErr = err
		t.Logf("jaeger did not start, trying new ports: %v", err)
	}
	t.Fatalf("jaeger: %v", lastErr)
	return jaeger{}
}

func tryStartJaeger(t *testing.T, bin string) (jaeger, error) {
	ports, err := freePorts(4)
	if err != nil {
		return jaeger{}, err
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, jaegerConfig, ports[0], ports[1], ports[2], ports[3]), 0o644); err != nil {
		return jaeger{}, err
	}
	var out lockedBuffer
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = dir
	for _, kv := range os.Environ() { // the host's exporter settings are not Jaeger's
		if !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := cmd.Start(); err != nil {
		return jaeger{}, fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { // owned by this test; the cleanup below waits for it
		waitErr = cmd.Wait()
		close(exited)
	}()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	j := jaeger{otlpGRPC: ports[0], otlpHTTP: ports[1], query: "http://" + ports[2]}

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return jaeger{}, fmt.Errorf("exited early (%v):\n%s", waitErr, out.String())
		default:
		}
		if ready(j.query + "/api/services") {
			break
		}
		if time.Now().After(deadline) {
			stop()
			return jaeger{}, fmt.Errorf("query API not ready after 60s:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("jaeger output:\n%s", out.String())
		}
	})
	return j, nil
}

func ready(u string) bool {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(u)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// freePorts returns n loopback addresses whose ports were free a moment ago.
func freePorts(n int) ([]string, error) {
	addrs := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

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
	j := startJaeger(t, bin)

	for _, tc := range []struct {
		protocol, endpoint string
	}{
		{ProtocolGRPC, "http://" + j.otlpGRPC},
		{ProtocolHTTP, "http://" + j.otlpHTTP},
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

			client := JaegerClient{BaseURL: j.query, Service: service, HTTP: &http.Client{Timeout: 5 * time.Second}}
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
