package trace

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// receiver collects the span names of OTLP export requests.
type receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu      sync.Mutex
	names   []string
	service string
}

func (r *receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				r.service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.names = append(r.names, s.GetName())
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *receiver) got() (names []string, service string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.names...), r.service
}

// exportOne sets up a Provider from env, traces a request of 3 tokens and
// shuts the provider down, which must flush every span to the receiver.
func exportOne(t *testing.T, vars map[string]string, rcv *receiver) {
	t.Helper()
	exp, err := ExportFromEnv(env(vars))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.ServiceName = "troupe-export-test"
	cfg.Export = exp
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := Setup(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runRequest(p.Tracer(), "exported", 3)
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	names, service := rcv.got()
	if len(names) != 3+4+2*5 {
		t.Errorf("receiver got %d spans, want %d: %v", len(names), 3+4+2*5, names)
	}
	if service != "troupe-export-test" {
		t.Errorf("receiver got service %q, want troupe-export-test", service)
	}
}

func TestExportOTLPHTTP(t *testing.T) {
	t.Parallel()
	rcv := &receiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "unexpected "+r.URL.Path, http.StatusNotFound)
			return
		}
		body, err := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp, _ := rcv.Export(r.Context(), &req)
		b, _ := proto.Marshal(resp)
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	exportOne(t, map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL,
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
	}, rcv)
}

func TestExportOTLPGRPC(t *testing.T) {
	t.Parallel()
	rcv := &receiver{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, rcv)
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }() // owned by gs; Stop below ends it
	t.Cleanup(func() {
		gs.Stop()
		if err := <-done; err != nil {
			t.Errorf("grpc serve: %v", err)
		}
	})
	exportOne(t, map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + lis.Addr().String(),
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
	}, rcv)
}

func TestSetupSpanExporter(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	cfg := DefaultConfig()
	cfg.SpanExporter = exp
	ctx := context.Background()
	p, err := Setup(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runRequest(p.Tracer(), "flushed", 2)
	if err := p.ForceFlush(ctx); err != nil {
		t.Fatalf("ForceFlush: %v", err)
	}
	if got, want := len(exp.GetSpans()), 3+4+5; got != want {
		t.Errorf("after ForceFlush the exporter has %d spans, want %d", got, want)
	}
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// After Shutdown spans are neither exported nor stored.
	_, span := p.Tracer().StartSample(ctx)
	span.End()
	if span.IsRecording() {
		t.Error("span started after Shutdown is recording")
	}
}
