package trace

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Provider owns a TracerProvider, its exporter and its recent-span store.
// Its batching processor runs one goroutine, which Shutdown stops.
type Provider struct {
	tp     *sdktrace.TracerProvider
	store  *Store
	tracer Tracer
}

// Setup builds a Provider from cfg: every recorded span goes to the
// in-memory store, and through a batching processor to the exporter that
// cfg describes, if any. The caller must call Shutdown.
func Setup(ctx context.Context, cfg Config) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	store, err := NewStore(cfg.Store)
	if err != nil {
		return nil, err
	}
	res, err := resource.New(ctx,
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
		resource.WithAttributes(
			attribute.String("service.name", cfg.ServiceName),
			attribute.String("service.instance.id", cfg.NodeName),
			attribute.String("troupe.node", cfg.NodeName),
		),
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("trace: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
		sdktrace.WithSpanProcessor(store),
	}
	exp := cfg.SpanExporter
	if exp == nil && cfg.Export.Enabled() {
		if exp, err = newExporter(ctx, cfg.Export); err != nil {
			return nil, err
		}
	}
	if exp != nil {
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return &Provider{tp: tp, store: store, tracer: NewTracer(tp)}, nil
}

func newExporter(ctx context.Context, e Export) (sdktrace.SpanExporter, error) {
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch e.Protocol {
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(e.Endpoint))
	case ProtocolHTTP:
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(e.Endpoint))
	default:
		err = errors.New("unsupported protocol " + e.Protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("trace: OTLP %s exporter: %w", e.Protocol, err)
	}
	return exp, nil
}

// TracerProvider returns the SDK provider, for instrumentation that takes
// one.
func (p *Provider) TracerProvider() *sdktrace.TracerProvider { return p.tp }

// Tracer returns the Tracer of the troupe span vocabulary.
func (p *Provider) Tracer() Tracer { return p.tracer }

// Store returns the recent-span store.
func (p *Provider) Store() *Store { return p.store }

// ForceFlush exports the spans that have ended and not yet been exported.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if err := p.tp.ForceFlush(ctx); err != nil {
		return fmt.Errorf("trace: flush: %w", err)
	}
	return nil
}

// Shutdown flushes pending spans to the exporter and stops the provider.
// Spans started afterwards record nothing.
func (p *Provider) Shutdown(ctx context.Context) error {
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("trace: shutdown: %w", err)
	}
	return nil
}
