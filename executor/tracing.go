package executor

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// headerCarrier lets OpenTelemetry's propagators read and write NATS headers.
type headerCarrier nats.Header

// Get implements propagation.TextMapCarrier, matching names case-insensitively.
func (c headerCarrier) Get(key string) string {
	for k, v := range c {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// Set implements propagation.TextMapCarrier.
func (c headerCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

// Keys implements propagation.TextMapCarrier.
func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

var propagator = propagation.TraceContext{}

// startSpan starts the call's span as a child of the command's traceparent.
func startSpan(ctx context.Context, tp trace.TracerProvider, h nats.Header, name string) (context.Context, trace.Span) {
	ctx = propagator.Extract(ctx, headerCarrier(h))
	return tp.Tracer("github.com/cgledger/cgledger/executor").Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer))
}

// injectTrace writes the span's traceparent (and tracestate) for the report.
func injectTrace(ctx context.Context) (traceparent, tracestate string) {
	h := nats.Header{}
	propagator.Inject(ctx, headerCarrier(h))
	return h.Get("traceparent"), h.Get("tracestate")
}
