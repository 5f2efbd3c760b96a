package ledger

import (
	"context"
	"strings"
	"time"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

var (
	sloSuccessDesc = prometheus.NewDesc("cgledger_tool_slo_success_rate_min",
		"The availability SLO of a registered tool (its definition's slo.success_rate_min); the strictest when projects differ.", []string{"tool"}, nil)
	sloLatencyDesc = prometheus.NewDesc("cgledger_tool_slo_p95_latency_seconds_max",
		"The latency SLO of a registered tool (its definition's slo.p95_latency_ms_max, in seconds); the strictest when projects differ.", []string{"tool"}, nil)
)

// SLOCollector exports the SLO targets of the registered tools, read on
// scrape (from this process's memory where it has them), so alert rules
// hold each tool to its own objective. Tool names are labels: they are
// registered ones (ToolLabels), which only admins write.
func (l *Ledger) SLOCollector() prometheus.Collector { return sloCollector{l} }

type sloCollector struct{ l *Ledger }

// Describe implements prometheus.Collector.
func (c sloCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sloSuccessDesc
	ch <- sloLatencyDesc
}

// Collect implements prometheus.Collector.
func (c sloCollector) Collect(ch chan<- prometheus.Metric) {
	l := c.l
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	info, err := l.stream.Info(ctx, jetstream.WithSubjectFilter(protocol.Root+"."+l.version+".*.tool.*"))
	if err != nil {
		return
	}
	success, latency := map[string]float64{}, map[string]float64{}
	for subj := range info.State.Subjects {
		toks := strings.Split(subj, ".")
		if len(toks) != 5 {
			continue
		}
		st, err := l.toolCached(ctx, toks[2], toks[4])
		if err != nil || st.Definition.SLO == nil {
			continue
		}
		// Just read from the registry: known from now on, whatever this
		// process missed while cut off from NATS.
		l.labels.Add(st.Definition.ToolName)
		name, slo := l.labels.Label(st.Definition.ToolName), st.Definition.SLO
		if slo.SuccessRateMin > 0 {
			success[name] = max(success[name], slo.SuccessRateMin)
		}
		if slo.P95LatencyMSMax > 0 {
			s := float64(slo.P95LatencyMSMax) / 1000
			if cur, ok := latency[name]; !ok || s < cur {
				latency[name] = s
			}
		}
	}
	for name, v := range success {
		ch <- prometheus.MustNewConstMetric(sloSuccessDesc, prometheus.GaugeValue, v, name)
	}
	for name, v := range latency {
		ch <- prometheus.MustNewConstMetric(sloLatencyDesc, prometheus.GaugeValue, v, name)
	}
}
