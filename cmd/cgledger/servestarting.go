package main

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/mcpfront"
)

// The steps /readyz names (its "step" member) while serve is not ready for
// a reason of its own life cycle rather than a fault: the start-up parts
// (startingStep, restoringStep), the projector's catch-up with the stream
// at start (a rebuild included), and the shutdown.
const (
	startingStep     = "starting"
	restoringStep    = "restoring_views"
	catchingUpStep   = "catching_up"
	shuttingDownStep = "shutting_down"
)

// startingRetryAfter is the Retry-After of the 503 answered while serve
// starts, in seconds.
const startingRetryAfter = 1

// handlerSlot holds the handler HTTP serves: the start-up one, then serve's
// whole router once every part it answers from runs.
type handlerSlot struct{ h http.Handler }

// startingHTTPComponent serves HTTP from the start, before the views are
// restored or opened and before the cluster answers: /healthz says the
// process is alive, /readyz answers 503 naming the step serve is at,
// /metrics serves the registry as it fills and /v1/openapi.json the API's
// description; every other request is
// answered 503 (problem "starting") rather than left waiting, since no view
// or ledger is there to answer it. servingComponent puts the whole router
// in its place. Its stop closes what a start that failed (or was stopped
// by a signal) left serving; a full shutdown has already shut it down
// (httpComponent).
type startingHTTPComponent struct {
	st   *serveState
	done chan struct{}
}

// Start builds the registry and serves the start-up handler.
func (c *startingHTTPComponent) Start(context.Context) error {
	st := c.st
	st.reg = prometheus.NewRegistry()
	st.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if st.serverTLS != nil {
		st.ln = tls.NewListener(st.ln, st.serverTLS)
	}
	st.handler.Store(&handlerSlot{h: startingHandler(st)})
	st.hs = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st.handler.Load().h.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 5 * time.Second}
	c.done = make(chan struct{})
	go func() {
		defer close(c.done)
		if err := st.hs.Serve(st.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			st.log.Error("http server", "err", err)
		}
	}()
	st.log.Info("http answers "+startingPathsText+" while serve starts", "http", st.httpURL())
	return nil
}

// Stop closes the server (at once: after a full shutdown there is nothing
// left to finish).
func (c *startingHTTPComponent) Stop(context.Context) error {
	_ = c.st.hs.Close()
	<-c.done
	return nil
}

// httpURL is where serve's HTTP listens.
func (st *serveState) httpURL() string {
	if st.serverTLS != nil {
		return "https://" + st.ln.Addr().String()
	}
	return "http://" + st.ln.Addr().String()
}

// startingPaths are the paths served while serve starts (GET), and
// startingPathsText names them for the log and the problem detail.
var startingPaths = []string{"/healthz", "/readyz", "/metrics", "/v1/openapi.json"}

var startingPathsText = strings.Join(startingPaths[:len(startingPaths)-1], ", ") + " and " + startingPaths[len(startingPaths)-1]

// startingHandler is what HTTP answers while serve starts: the open
// endpoints behind the same authentication policy and origin check as the
// whole router, and 503 "starting" for the rest.
func startingHandler(st *serveState) http.Handler {
	router := httpapi.New(httpapi.Config{
		// Alive: the process answers. The NATS connection, once made, is
		// checked as the whole router does.
		Healthy: func() bool {
			nc := st.conn.Load()
			return nc == nil || nc.IsConnected()
		},
		Readiness: func(*http.Request) (map[string]any, bool) {
			step, _ := st.startStep.Load().(string)
			reason := "restoring views from a snapshot"
			if step != restoringStep {
				step = startingStep
				part, _ := st.startPart.Load().(string)
				reason = "starting: " + part
			}
			return map[string]any{"status": "not ready", "reason": reason, "step": step, "roles": st.s.Roles}, false
		},
		Metrics: promhttp.HandlerFor(st.reg, promhttp.HandlerOpts{}),
	})
	mux := http.NewServeMux()
	for _, p := range startingPaths {
		mux.Handle("GET "+p, router)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", strconv.Itoa(startingRetryAfter))
		problem.Write(w, problem.New(http.StatusServiceUnavailable, problem.CodeStarting,
			"cgledger serve is starting (see /readyz): only "+startingPathsText+" answer until it serves", nil))
	})
	var h http.Handler = mux
	if st.sa != nil {
		h = st.sa.policy.Wrap(h)
	}
	return mcpfront.OriginGuard(h)
}
