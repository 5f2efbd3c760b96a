package e2e

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/cgledger/cgledger/internal/servetest"
)

// otlpReceiver is an OTLP/HTTP trace receiver on loopback that keeps every
// span it is sent.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var msg coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range msg.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				r.spans = append(r.spans, ss.GetSpans()...)
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// span returns the first received span of a trace with that name.
func (r *otlpReceiver) span(traceID []byte, name string) *tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.spans {
		if bytes.Equal(s.GetTraceId(), traceID) && s.GetName() == name {
			return s
		}
	}
	return nil
}

// TestTracesLeaveTheProcess runs serve with the standard OTLP variables set
// and a call whose worker sends a traceparent: the dispatch, the tool run and
// the report arrive at an OTLP receiver as one trace, the dispatch and the
// tool children of the worker's span and the report a child of the tool's.
func TestTracesLeaveTheProcess(t *testing.T) {
	recv := newOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.srv.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	_, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"traced"}`, "--turn", "tr-1", "--call-id", "c1")
	require.Equal(t, 0, code)

	// cgledger call derives the trace id from the call's identity.
	sum := sha256.Sum256([]byte("demo\x00tr-1\x00c1"))
	traceID := sum[:16]
	var dispatch, tool, report *tracepb.Span
	require.Eventually(t, func() bool {
		dispatch, tool, report = recv.span(traceID, "cgledger.dispatch"), recv.span(traceID, "cgledger.tool echo"), recv.span(traceID, "cgledger.report")
		return dispatch != nil && tool != nil && report != nil
	}, time.Minute, 20*time.Millisecond, "spans of trace %s reach the receiver", hex.EncodeToString(traceID))
	require.NotEmpty(t, dispatch.GetParentSpanId(), "the dispatch continues the worker's trace")
	require.Equal(t, dispatch.GetParentSpanId(), tool.GetParentSpanId(), "the tool runs as a child of the worker's span, as the command carries it")
	require.Equal(t, tool.GetSpanId(), report.GetParentSpanId(), "the report is a child of the tool's span")
}
