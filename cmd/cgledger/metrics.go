package main

import (
	"context"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// registerServeMetrics adds what serve knows beyond its packages: the build,
// the NATS connection, and JetStream state read from the server on scrape
// (the embedded server opens no monitoring port an exporter could read).
func registerServeMetrics(reg prometheus.Registerer, nc *nats.Conn, js jetstream.JetStream, streams ...string) {
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
		&jetStreamCollector{js: js, streams: streams},
	)
}

// jetStreamCollector reports stream sizes and durable consumers' backlogs.
// Ephemeral consumers (the projector's ordered consumer) are left out: their
// names are random, and a label per name would grow without end.
type jetStreamCollector struct {
	js      jetstream.JetStream
	streams []string
}

var (
	streamMessagesDesc = prometheus.NewDesc("cgledger_stream_messages", "Messages in a JetStream stream of the ledger (the ledger stream, the call-record bucket).", []string{"stream"}, nil)
	streamBytesDesc    = prometheus.NewDesc("cgledger_stream_bytes", "Bytes in a JetStream stream of the ledger.", []string{"stream"}, nil)
	consumerPending    = prometheus.NewDesc("cgledger_consumer_pending_messages", "Commands not yet delivered by a durable consumer of the ledger stream (an executor's or a tool service's backlog).", []string{"consumer"}, nil)
	consumerAckPending = prometheus.NewDesc("cgledger_consumer_ack_pending_messages", "Commands delivered and not yet acknowledged (calls running), per durable consumer.", []string{"consumer"}, nil)
	consumerRedeliv    = prometheus.NewDesc("cgledger_consumer_redelivered_messages", "Commands delivered more than once and not yet acknowledged, per durable consumer.", []string{"consumer"}, nil)
)

// Describe implements prometheus.Collector.
func (c *jetStreamCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{streamMessagesDesc, streamBytesDesc, consumerPending, consumerAckPending, consumerRedeliv} {
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
		st := s.CachedInfo().State
		ch <- prometheus.MustNewConstMetric(streamMessagesDesc, prometheus.GaugeValue, float64(st.Msgs), name)
		ch <- prometheus.MustNewConstMetric(streamBytesDesc, prometheus.GaugeValue, float64(st.Bytes), name)
		if i != 0 {
			continue // consumers of the ledger stream only
		}
		infos := s.ListConsumers(ctx)
		for info := range infos.Info() {
			if info.Config.Durable == "" {
				continue
			}
			ch <- prometheus.MustNewConstMetric(consumerPending, prometheus.GaugeValue, float64(info.NumPending), info.Name)
			ch <- prometheus.MustNewConstMetric(consumerAckPending, prometheus.GaugeValue, float64(info.NumAckPending), info.Name)
			ch <- prometheus.MustNewConstMetric(consumerRedeliv, prometheus.GaugeValue, float64(info.NumRedelivered), info.Name)
		}
	}
}
