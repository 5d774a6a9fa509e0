package trace

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestExportFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		want    Export
		wantErr bool
	}{
		{"nothing", nil, Export{Exporter: ExporterNone}, false},
		{"endpoint implies otlp over http",
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"},
			Export{ExporterOTLP, ProtocolHTTP, "http://c:4318/v1/traces"}, false},
		{"grpc endpoint as is",
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			Export{ExporterOTLP, ProtocolGRPC, "http://c:4317"}, false},
		{"traces endpoint wins and is used as is",
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://b:2/custom"},
			Export{ExporterOTLP, ProtocolHTTP, "https://b:2/custom"}, false},
		{"traces protocol wins",
			map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_TRACES_EXPORTER": "otlp"},
			Export{ExporterOTLP, ProtocolGRPC, "http://localhost:4317"}, false},
		{"otlp with defaults",
			map[string]string{"OTEL_TRACES_EXPORTER": "otlp"},
			Export{ExporterOTLP, ProtocolHTTP, "http://localhost:4318/v1/traces"}, false},
		{"none despite endpoint",
			map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
			Export{Exporter: ExporterNone}, false},
		{"disabled",
			map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "otlp"},
			Export{Exporter: ExporterNone}, false},
		{"list with otlp", map[string]string{"OTEL_TRACES_EXPORTER": "none, otlp"},
			Export{ExporterOTLP, ProtocolHTTP, "http://localhost:4318/v1/traces"}, false},
		{"unsupported exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, Export{}, true},
		{"unsupported protocol", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, Export{}, true},
		{"endpoint without scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, Export{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ExportFromEnv(env(tc.env))
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	for name, mutate := range map[string]func(*Config){
		"no service":  func(c *Config) { c.ServiceName = "" },
		"ratio":       func(c *Config) { c.SampleRatio = 1.5 },
		"bad export":  func(c *Config) { c.Export = Export{Exporter: "otlp", Protocol: "grpc", Endpoint: "::"} },
		"bad store":   func(c *Config) { c.Store.Traces = 0 },
		"no protocol": func(c *Config) { c.Export = Export{Exporter: "otlp", Endpoint: "http://x"} },
	} {
		c := DefaultConfig()
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate succeeded, want an error", name)
		}
		if _, err := Setup(context.Background(), c); err == nil {
			t.Errorf("%s: Setup succeeded, want an error", name)
		}
	}
}

func TestSetupResource(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.ServiceName = "troupe-test"
	cfg.NodeName = "node-7"
	p, err := Setup(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())

	rec := &lastSpan{}
	p.TracerProvider().RegisterSpanProcessor(rec)
	_, span := p.Tracer().StartSample(context.Background())
	span.End()
	if rec.span == nil {
		t.Fatal("no span recorded")
	}
	attrs := map[attribute.Key]string{}
	for _, kv := range rec.span.Resource().Attributes() {
		attrs[kv.Key] = kv.Value.Emit()
	}
	if attrs["service.name"] != "troupe-test" || attrs["troupe.node"] != "node-7" || attrs["service.instance.id"] != "node-7" {
		t.Errorf("resource %v lacks the configured service and node", attrs)
	}
}

func TestSampleRatioZero(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.SampleRatio = 0
	p, err := Setup(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	runRequest(p.Tracer(), "unsampled", 2)
	if traces, spans := p.Store().Len(); traces != 0 || spans != 0 {
		t.Errorf("store holds %d traces, %d spans of an unsampled request, want none", traces, spans)
	}
}
