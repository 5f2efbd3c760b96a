package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// setupTracing installs an OpenTelemetry provider that exports spans over
// OTLP/HTTP when the standard OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, configured by the standard
// OTEL_* variables; without them, or with OTEL_TRACES_EXPORTER=none,
// nothing is exported (spans are still made, so reports carry child spans).
// The returned function flushes and stops the exporter.
func setupTracing(ctx context.Context, log *slog.Logger) (func(), error) {
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if endpoint == "" || os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		// No exporter, but real spans: the executor's span of a call is
		// still a child of the command's traceparent with an id of its own,
		// which its report carries (a conformance case checks it), and
		// nothing leaves the process.
		otel.SetTracerProvider(sdktrace.NewTracerProvider())
		return func() {}, nil
	}
	if p := os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "http/protobuf" {
		log.Warn("tracing: only OTLP over HTTP (http/protobuf) is built in; using it", "OTEL_EXPORTER_OTLP_PROTOCOL", p)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter for %s: %w", endpoint, err)
	}
	name := os.Getenv("OTEL_SERVICE_NAME")
	if name == "" {
		name = "cgledger"
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", name)))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	log.Info("tracing: exporting spans over OTLP/HTTP", "endpoint", endpoint, "service", name)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("tracing: flush spans at shutdown", "err", err)
		}
	}, nil
}
