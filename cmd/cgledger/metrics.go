package main

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/protocol"
)

// registerServeMetrics adds what serve knows beyond its packages: the build,
// the NATS connection, and JetStream state read from the server on scrape
// (the embedded server opens no monitoring port an exporter could read).
func registerServeMetrics(reg prometheus.Registerer, nc *nats.Conn, js jetstream.JetStream, labels *toollabels.Labels, streams ...string) {
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "cgledger_build_info",
		Help:        "1, labelled with the build's version, commit and Go version.",
		ConstLabels: prometheus.Labels{"version": version, "commit": commit, "go_version": runtime.Version()},
	})
	build.Set(1)
	reg.MustRegister(build,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "cgledger_nats_connected",
			Help: "1 while serve's NATS connection is up, else 0.",
		}, func() float64 {
			if nc.IsConnected() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "cgledger_nats_reconnects_total",
			Help: "Times serve's NATS connection was re-established.",
		}, func() float64 { return float64(nc.Stats().Reconnects) }),
		&jetStreamCollector{js: js, labels: labels, streams: streams},
	)
}

// jetStreamCollector reports stream sizes and durable consumers' backlogs.
// Ephemeral consumers (the projector's ordered consumer) are left out: their
// names are random, and a label per name would grow without end. Each
// consumer's series carry the tool whose commands it takes (consumerTool),
// so a backlog under a hashed name (a tool service's cgtool-...) reads as
// its tool.
type jetStreamCollector struct {
	js      jetstream.JetStream
	labels  *toollabels.Labels
	streams []string
}

// Tool labels of consumers that serve no one tool.
const (
	// anyToolLabel: the consumer takes commands of any tool (a wildcard
	// in the tool's position), or of several.
	anyToolLabel = "_any"
	// noToolLabel: the consumer takes more than tool commands (the
	// deadline keeper, which also takes the prepares; a reader of the
	// whole stream).
	noToolLabel = "_none"
)

// consumerTool is the tool label of a consumer with these filter subjects:
// the tool they all name (bounded by labels, as every tool label), else
// anyToolLabel or noToolLabel.
func consumerTool(labels *toollabels.Labels, filters []string) string {
	if len(filters) == 0 {
		return noToolLabel // the whole stream
	}
	tool, several := "", false
	for _, f := range filters {
		name, anyTool, ok := protocol.CommandFilterTool(f)
		switch {
		case !ok:
			return noToolLabel
		case anyTool || (tool != "" && name != tool):
			several = true
		default:
			tool = name
		}
	}
	if several {
		return anyToolLabel
	}
	return labels.Label(tool)
}

var consumerLabels = []string{"consumer", "tool"}

var (
	streamMessagesDesc = prometheus.NewDesc("cgledger_stream_messages", "Messages in a JetStream stream of the ledger (the ledger stream, the call-record bucket).", []string{"stream"}, nil)
	streamBytesDesc    = prometheus.NewDesc("cgledger_stream_bytes", "Bytes in a JetStream stream of the ledger.", []string{"stream"}, nil)
	consumerPending    = prometheus.NewDesc("cgledger_consumer_pending_messages", "Commands not yet delivered by a durable consumer of the ledger stream (an executor's or a tool service's backlog), by consumer and tool (the tool its filter subjects name; _any for several or any tool, _none for a consumer of more than tool commands, such as the deadline keeper).", consumerLabels, nil)
	consumerAckPending = prometheus.NewDesc("cgledger_consumer_ack_pending_messages", "Commands delivered and not yet acknowledged (calls running), per durable consumer.", consumerLabels, nil)
	consumerRedeliv    = prometheus.NewDesc("cgledger_consumer_redelivered_messages", "Commands delivered more than once and not yet acknowledged, per durable consumer.", consumerLabels, nil)
	consumerWaiting    = prometheus.NewDesc("cgledger_consumer_waiting_pulls", "Pull requests waiting on a durable consumer: 0 means nobody pulls its commands now (a busy service has none waiting while it works).", consumerLabels, nil)
	consumerIdle       = prometheus.NewDesc("cgledger_consumer_idle_seconds", "Time since a durable consumer last delivered a message or had one acknowledged (or, before either, was created), by the server's clock.", consumerLabels, nil)
	// Only the stream leader answers a stream's info: while a stream has
	// none, its series are absent from the scrape, which is how an alert
	// sees an election without a system-account user.
	streamLeaderDesc  = prometheus.NewDesc("cgledger_stream_leader", "1, labelled with the server leading a JetStream stream of the ledger; absent while the stream has no leader (or cannot be read).", []string{"stream", "leader"}, nil)
	streamCurrentDesc = prometheus.NewDesc("cgledger_stream_replicas_current", "Replicas of a JetStream stream of the ledger that are current, the leader included (3 of 3 on a healthy R3 cluster).", []string{"stream"}, nil)
)

// Describe implements prometheus.Collector.
func (c *jetStreamCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{streamMessagesDesc, streamBytesDesc, consumerPending, consumerAckPending, consumerRedeliv, consumerWaiting, consumerIdle, streamLeaderDesc, streamCurrentDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. What cannot be read in time is
// left out of the scrape rather than reported as zero.
func (c *jetStreamCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for i, name := range c.streams {
		s, err := c.js.Stream(ctx, name)
		if err != nil {
			continue
		}
		si := s.CachedInfo()
		st := si.State
		ch <- prometheus.MustNewConstMetric(streamMessagesDesc, prometheus.GaugeValue, float64(st.Msgs), name)
		ch <- prometheus.MustNewConstMetric(streamBytesDesc, prometheus.GaugeValue, float64(st.Bytes), name)
		if cl := si.Cluster; cl != nil && cl.Leader != "" {
			ch <- prometheus.MustNewConstMetric(streamLeaderDesc, prometheus.GaugeValue, 1, name, cl.Leader)
			current := 1
			for _, r := range cl.Replicas {
				if r.Current && !r.Offline {
					current++
				}
			}
			ch <- prometheus.MustNewConstMetric(streamCurrentDesc, prometheus.GaugeValue, float64(current), name)
		}
		if i != 0 {
			continue // consumers of the ledger stream only
		}
		infos := s.ListConsumers(ctx)
		for info := range infos.Info() {
			if info.Config.Durable == "" {
				continue
			}
			filters := info.Config.FilterSubjects
			if info.Config.FilterSubject != "" {
				filters = append(filters, info.Config.FilterSubject)
			}
			tool := consumerTool(c.labels, filters)
			ch <- prometheus.MustNewConstMetric(consumerPending, prometheus.GaugeValue, float64(info.NumPending), info.Name, tool)
			ch <- prometheus.MustNewConstMetric(consumerAckPending, prometheus.GaugeValue, float64(info.NumAckPending), info.Name, tool)
			ch <- prometheus.MustNewConstMetric(consumerRedeliv, prometheus.GaugeValue, float64(info.NumRedelivered), info.Name, tool)
			ch <- prometheus.MustNewConstMetric(consumerWaiting, prometheus.GaugeValue, float64(info.NumWaiting), info.Name, tool)
			ch <- prometheus.MustNewConstMetric(consumerIdle, prometheus.GaugeValue, consumerIdleSeconds(info), info.Name, tool)
		}
	}
}

// consumerIdleSeconds is how long a consumer has been idle: from the
// latest of its last delivery, its last acknowledgement and its creation
// to the time the server gathered the info (both the server's clock, so a
// skewed serve clock does not shift it).
func consumerIdleSeconds(info *jetstream.ConsumerInfo) float64 {
	last := info.Created
	for _, t := range []*time.Time{info.Delivered.Last, info.AckFloor.Last} {
		if t != nil && t.After(last) {
			last = *t
		}
	}
	now := info.TimeStamp
	if now.IsZero() {
		now = time.Now()
	}
	return max(now.Sub(last).Seconds(), 0)
}

// instrumentHTTP counts and times every HTTP request by the route pattern it
// matched (a bounded set: never the path with its ids) and status code. It
// wraps the whole handler, authentication included, so refused requests
// count too.
func instrumentHTTP(reg prometheus.Registerer, mux *http.ServeMux, next http.Handler) http.Handler {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cgledger_http_requests_total",
		Help: "HTTP requests answered (audit API, tool registry, health, metrics), by method and top-level route (GET /v1/, POST /projects/, GET /readyz, ...) and status code.",
	}, []string{"route", "code"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cgledger_http_request_duration_seconds",
		Help:    "Time to answer an HTTP request, by route pattern.",
		Buckets: toollabels.LatencyBuckets,
	}, []string{"route"})
	reg.MustRegister(requests, duration)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		// The top-level pattern: the audit API and the tool registry are
		// sub-routers mounted at /v1/ and /projects/, so the method is
		// added (from the standard set: clients choose it) to tell reads
		// from writes.
		_, route := mux.Handler(r)
		switch {
		case route == "" || route == "/":
			// "/" is the catch-all that answers 404 or 405 as problems.
			route = "unmatched"
		case !strings.Contains(route, " "):
			route = httpMethod(r.Method) + " " + route
		}
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(sw, r)
		requests.WithLabelValues(route, strconv.Itoa(sw.code)).Inc()
		duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

// statusWriter remembers the status code a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	code int
}

// WriteHeader implements http.ResponseWriter.
func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// Flush passes streaming (the export) through.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// httpMethod bounds the method label to the standard methods.
func httpMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return m
	}
	return "OTHER"
}
