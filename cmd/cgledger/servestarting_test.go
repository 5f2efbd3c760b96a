package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/stretchr/testify/require"
)

// TestStartingHandlerAnswersProbesOnly: while serve starts, /healthz is
// 200, /readyz 503 naming the part or the restore, /metrics serves the
// registry, and anything else is 503 problem "starting" with Retry-After.
func TestStartingHandlerAnswersProbesOnly(t *testing.T) {
	s := defaultSettings()
	st := &serveState{s: s, reg: prometheus.NewRegistry()}
	st.reg.MustRegister(collectors.NewGoCollector())
	st.startPart.Store("view store")
	h := startingHandler(st)
	get := func(path string) (*httptest.ResponseRecorder, map[string]any) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		var body map[string]any
		if rec.Header().Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" && rec.Body.Len() > 0 && rec.Body.Bytes()[0] == '{' {
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
		}
		return rec, body
	}

	rec, body := get("/healthz")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "ok", body["status"])

	rec, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "not ready", body["status"])
	require.Equal(t, startingStep, body["step"])
	require.Equal(t, "starting: view store", body["reason"])

	st.startStep.Store(restoringStep)
	rec, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, restoringStep, body["step"])
	require.Equal(t, "restoring views from a snapshot", body["reason"])

	rec, _ = get("/metrics")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Contains(t, rec.Body.String(), "go_goroutines")

	for _, path := range []string{"/v1/digest", "/projects/demo/tools", "/ui/", "/mcp/demo/alice"} {
		rec, body = get(path)
		require.Equal(t, http.StatusServiceUnavailable, rec.Code, path)
		require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"), path)
		require.Equal(t, "1", rec.Header().Get("Retry-After"), path)
		require.Equal(t, "starting", body["code"], path)
	}
}
