package ledger

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cgledger/cgledger/protocol"
)

var (
	toolTimeoutDesc = prometheus.NewDesc("cgledger_tool_timeout_seconds",
		"The default time budget of a call to a tool (its definition's limits.timeout_ms_default, else the protocol's 30 s), for every tool registered in any project and every built-in (the executor's and the PMO's); the largest when projects differ. Dashboards list the tools from it.", []string{"tool"}, nil)
	sloSuccessDesc = prometheus.NewDesc("cgledger_tool_slo_success_min_ratio",
		"The availability SLO of a registered tool (its definition's slo.success_rate_min); the strictest when projects differ.", []string{"tool"}, nil)
	sloLatencyDesc = prometheus.NewDesc("cgledger_tool_slo_p95_latency_max_seconds",
		"The latency SLO of a registered tool (its definition's slo.p95_latency_ms_max, in seconds); the strictest when projects differ.", []string{"tool"}, nil)
)

// ToolCollector exports what the registry says of each tool, read on
// scrape (from this process's memory where it has them): every tool's
// timeout, so dashboards and rules know every tool before its first call
// and how long its calls may wait, and the SLO targets of the tools that
// set them, so alert rules hold each tool to its own objective. Tool names
// are labels: they are registered ones (ToolLabels), which only admins
// write, and the built-ins.
func (l *Ledger) ToolCollector() prometheus.Collector { return toolCollector{l} }

type toolCollector struct{ l *Ledger }

// Describe implements prometheus.Collector.
func (c toolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- toolTimeoutDesc
	ch <- sloSuccessDesc
	ch <- sloLatencyDesc
}

// Collect implements prometheus.Collector. With the registry unreadable,
// the built-ins are still exported: their definitions are this process's.
func (c toolCollector) Collect(ch chan<- prometheus.Metric) {
	l := c.l
	timeout, success, latency := map[string]float64{}, map[string]float64{}, map[string]float64{}
	addTimeout := func(d *protocol.ToolDefinition) {
		ms := d.Limits.TimeoutMSDefault
		if ms <= 0 {
			ms = protocol.DefaultTimeoutMS
		}
		name := l.labels.Label(d.ToolName)
		timeout[name] = max(timeout[name], float64(ms)/1000)
	}
	for _, d := range l.builtin {
		l.labels.Add(d.ToolName)
		addTimeout(d)
	}
	// The PMO built-ins have no definition: their calls get the
	// protocol's default budget (protocol.CallTimeout).
	for _, name := range protocol.ReservedToolNames {
		addTimeout(&protocol.ToolDefinition{ToolName: name})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	info, err := l.stream.Info(ctx, jetstream.WithSubjectFilter(protocol.ToolEntriesFilter(l.version)))
	if err == nil {
		for subj := range info.State.Subjects {
			sub, err := protocol.ParseSubject(subj)
			if err != nil || sub.Kind != protocol.SubjectTool {
				continue
			}
			st, err := l.toolCached(ctx, sub.Project, sub.Tool)
			if err != nil {
				continue
			}
			// Just read from the registry: known from now on, whatever
			// this process missed while cut off from NATS.
			l.labels.Add(st.Definition.ToolName)
			addTimeout(&st.Definition)
			slo := st.Definition.SLO
			if slo == nil {
				continue
			}
			name := l.labels.Label(st.Definition.ToolName)
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
	}
	for _, g := range []struct {
		desc   *prometheus.Desc
		values map[string]float64
	}{{toolTimeoutDesc, timeout}, {sloSuccessDesc, success}, {sloLatencyDesc, latency}} {
		for name, v := range g.values {
			ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, v, name)
		}
	}
}
