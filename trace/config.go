package trace

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Exporter names, as OTEL_TRACES_EXPORTER spells them.
const (
	ExporterNone = "none"
	ExporterOTLP = "otlp"
)

// OTLP protocols, as OTEL_EXPORTER_OTLP_PROTOCOL spells them.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// Config configures Setup.
type Config struct {
	// ServiceName is the resource's service.name. It takes precedence over
	// OTEL_SERVICE_NAME.
	ServiceName string
	// NodeName names the troupe node; it becomes the resource attributes
	// troupe.node and service.instance.id.
	NodeName string
	// SampleRatio is the fraction of new traces recorded, in [0, 1]. Spans
	// whose parent was sampled elsewhere follow their parent's decision.
	SampleRatio float64
	// Export says where spans go besides the in-memory store.
	Export Export
	// SpanExporter, when not nil, replaces the exporter that Export
	// describes; spans reach it through the batching processor.
	SpanExporter sdktrace.SpanExporter
	// Store bounds the in-memory store of recent traces.
	Store StoreConfig
}

// DefaultConfig returns a Config that records every trace into the store
// and exports nothing.
func DefaultConfig() Config {
	return Config{
		ServiceName: "troupe",
		NodeName:    "local",
		SampleRatio: 1,
		Export:      Export{Exporter: ExporterNone},
		Store:       DefaultStoreConfig(),
	}
}

// Validate reports whether c is usable.
func (c Config) Validate() error {
	if c.ServiceName == "" {
		return errors.New("trace: service name is empty")
	}
	if c.SampleRatio < 0 || c.SampleRatio > 1 {
		return fmt.Errorf("trace: sample ratio %v is outside [0, 1]", c.SampleRatio)
	}
	if err := c.Export.Validate(); err != nil {
		return err
	}
	return c.Store.Validate()
}

// Export describes an OTLP exporter. The zero Export exports nothing.
type Export struct {
	// Exporter is ExporterNone (or empty) or ExporterOTLP.
	Exporter string
	// Protocol is ProtocolGRPC or ProtocolHTTP.
	Protocol string
	// Endpoint is an http or https URL: for gRPC the collector's address
	// (http://localhost:4317), for HTTP the full traces URL
	// (http://localhost:4318/v1/traces). The scheme http means no TLS.
	Endpoint string
}

// Enabled reports whether e exports spans.
func (e Export) Enabled() bool { return e.Exporter == ExporterOTLP }

// Validate reports whether e is usable.
func (e Export) Validate() error {
	switch e.Exporter {
	case "", ExporterNone:
		return nil
	case ExporterOTLP:
	default:
		return fmt.Errorf("trace: unsupported exporter %q (want %q or %q)", e.Exporter, ExporterOTLP, ExporterNone)
	}
	if e.Protocol != ProtocolGRPC && e.Protocol != ProtocolHTTP {
		return fmt.Errorf("trace: unsupported OTLP protocol %q (want %q or %q)", e.Protocol, ProtocolGRPC, ProtocolHTTP)
	}
	u, err := url.Parse(e.Endpoint)
	if err != nil {
		return fmt.Errorf("trace: OTLP endpoint: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("trace: OTLP endpoint %q is not an http or https URL", e.Endpoint)
	}
	return nil
}

// ExportFromEnv reads the standard OpenTelemetry variables through lookup
// (os.LookupEnv in a program) and returns the Export they describe:
//
//   - OTEL_SDK_DISABLED=true exports nothing;
//   - OTEL_TRACES_EXPORTER is "none" or "otlp"; when unset, spans are
//     exported only if an endpoint variable is set;
//   - OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL,
//     is "grpc" or "http/protobuf" (the default);
//   - OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as it is; else
//     OTEL_EXPORTER_OTLP_ENDPOINT, with /v1/traces appended for HTTP; else
//     the protocol's default on localhost.
//
// The exporter itself reads the other OTEL_EXPORTER_OTLP_* variables
// (headers, certificates, compression, timeout) from the environment.
func ExportFromEnv(lookup func(string) (string, bool)) (Export, error) {
	get := func(k string) string {
		v, _ := lookup(k)
		return strings.TrimSpace(v)
	}
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return Export{Exporter: ExporterNone}, nil
	}
	tracesEndpoint := get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	endpoint := get("OTEL_EXPORTER_OTLP_ENDPOINT")

	e := Export{Exporter: ExporterNone}
	switch names := get("OTEL_TRACES_EXPORTER"); names {
	case "":
		if tracesEndpoint != "" || endpoint != "" {
			e.Exporter = ExporterOTLP
		}
	default:
		for _, n := range strings.Split(names, ",") {
			switch n = strings.TrimSpace(n); n {
			case ExporterOTLP:
				e.Exporter = ExporterOTLP
			case ExporterNone, "":
			default:
				return Export{}, fmt.Errorf("trace: OTEL_TRACES_EXPORTER: unsupported exporter %q", n)
			}
		}
	}
	if !e.Enabled() {
		return e, nil
	}

	e.Protocol = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if e.Protocol == "" {
		e.Protocol = get("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if e.Protocol == "" {
		e.Protocol = ProtocolHTTP
	}
	switch {
	case tracesEndpoint != "":
		e.Endpoint = tracesEndpoint
	case endpoint != "" && e.Protocol == ProtocolHTTP:
		e.Endpoint = strings.TrimRight(endpoint, "/") + "/v1/traces"
	case endpoint != "":
		e.Endpoint = endpoint
	case e.Protocol == ProtocolGRPC:
		e.Endpoint = "http://localhost:4317"
	default:
		e.Endpoint = "http://localhost:4318/v1/traces"
	}
	if err := e.Validate(); err != nil {
		return Export{}, err
	}
	return e, nil
}
