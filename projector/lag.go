package projector

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// lagCollector reads the projector's lag from the stream on every scrape,
// so the lag is current exactly when it matters: while the projector is
// stalled or slow, when it commits nothing.
type lagCollector struct {
	p       *Projector
	entries *prometheus.Desc
	seconds *prometheus.Desc
}

func newLagCollector(p *Projector) *lagCollector {
	return &lagCollector{
		p: p,
		entries: prometheus.NewDesc("cgledger_projector_lag_entries",
			"Ledger stream last sequence minus the applied sequence, read from the stream at scrape time.", nil, nil),
		seconds: prometheus.NewDesc("cgledger_projector_lag_seconds",
			"Age of the oldest entry not yet applied (0 when caught up), read from the stream at scrape time.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.entries
	ch <- c.seconds
}

// Collect implements prometheus.Collector. A scrape that cannot reach the
// stream reports nothing rather than a made-up lag.
func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := c.p.js.Stream(ctx, c.p.cfg.Stream)
	if err != nil {
		return
	}
	last := s.CachedInfo().State.LastSeq
	applied := c.p.Applied()
	var lag uint64
	if last > applied {
		lag = last - applied
	}
	age := 0.0
	if lag > 0 {
		if m, err := s.GetMsg(ctx, applied+1); err == nil {
			age = max(0, time.Since(m.Time).Seconds())
		}
	}
	ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(lag))
	ch <- prometheus.MustNewConstMetric(c.seconds, prometheus.GaugeValue, age)
}
