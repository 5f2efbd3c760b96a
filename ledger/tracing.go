package ledger

import (
	"context"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracer makes the ledger's spans with OpenTelemetry's global provider: a
// no-op unless the program installs one (serve does when OTLP export is
// configured).
func tracer() trace.Tracer { return otel.Tracer("github.com/cgledger/cgledger/ledger") }

// startRequestSpan starts the span of one ledger operation as a child of
// the traceparent the request carries (if any).
func startRequestSpan(ctx context.Context, h nats.Header, name string) (context.Context, trace.Span) {
	return startTraceSpan(ctx, protocol.HeaderGet(h, protocol.HeaderTraceparent), protocol.HeaderGet(h, protocol.HeaderTracestate), name)
}

// startTraceSpan is startRequestSpan for a request already parsed: its
// traceparent and tracestate.
func startTraceSpan(ctx context.Context, traceparent, tracestate, name string) (context.Context, trace.Span) {
	carrier := propagation.HeaderCarrier{}
	if traceparent != "" {
		carrier.Set("traceparent", traceparent)
		if tracestate != "" {
			carrier.Set("tracestate", tracestate)
		}
	}
	ctx = propagation.TraceContext{}.Extract(ctx, carrier)
	return tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
}

// endSpan ends a request's span, marking a refusal or failure with its
// protocol code.
func endSpan(span trace.Span, err error) {
	if err != nil {
		code := string(protocol.CodeInternal)
		if e, ok := protocol.AsError(err); ok {
			code = string(e.Code)
		}
		span.SetAttributes(attribute.String("cgledger.code", code))
		span.SetStatus(codes.Error, code)
	}
	span.End()
}
