package dashboards

// sel is the label selector every query applies: the chosen instances and,
// for tool series, the chosen tools.
const (
	sel     = `instance=~"$instance"`
	toolSel = `instance=~"$instance", tool=~"$tool"`
)

// SLOOverview is the per-tool availability and latency SLO dashboard.
func SLOOverview() Dashboard {
	var b builder
	b.add("timeseries", "Availability by tool (5m)", "Share of calls resolved success, per tool.", "percentunit",
		[2]string{`1 - ` + ErrorRatio("5m", toolSel), "{{tool}}"})
	b.add("stat", "Error budget left (28d)", "Share of the 28-day error budget not yet spent, against each tool's SLO (slo.success_rate_min, default "+defaultTargetText+").", "percentunit",
		[2]string{`1 - (` + ErrorRatio("28d", toolSel) + `) / on (tool) ` + budget, "{{tool}}"})
	b.add("timeseries", "Burn rate, 1h and 5m", "Error ratio divided by the error budget (1 = spending exactly the budget). Pages above 14.4 on both.", "short",
		[2]string{`cgledger:tool_errors:ratio_rate1h{tool=~"$tool"} / on (tool) ` + budget, "1h {{tool}}"},
		[2]string{`cgledger:tool_errors:ratio_rate5m{tool=~"$tool"} / on (tool) ` + budget, "5m {{tool}}"})
	b.add("timeseries", "Burn rate, 6h and 30m", "Pages above 6 on both.", "short",
		[2]string{`cgledger:tool_errors:ratio_rate6h{tool=~"$tool"} / on (tool) ` + budget, "6h {{tool}}"},
		[2]string{`cgledger:tool_errors:ratio_rate30m{tool=~"$tool"} / on (tool) ` + budget, "30m {{tool}}"})
	b.add("timeseries", "Call latency p95, dispatch to report", "As the agent sees it.", "s",
		[2]string{`histogram_quantile(0.95, sum by (tool, le) (rate(cgledger_call_report_latency_seconds_bucket{` + toolSel + `}[$__rate_interval])))`, "{{tool}}"})
	b.add("timeseries", "Calls by status", "Resolved calls per second.", "reqps",
		[2]string{`sum by (status) (rate(cgledger_executor_calls_total{` + toolSel + `}[$__rate_interval]))`, "{{status}}"})
	return newDashboard("cgledger-slo", "cgledger: SLO overview", "Availability and latency SLOs per tool, error budget and burn rates.", &b)
}

// ToolDrillDown is one tool's rate, errors, latency and concurrency.
func ToolDrillDown() Dashboard {
	var b builder
	b.add("timeseries", "Call rate", "Calls resolved per second.", "reqps",
		[2]string{`sum by (tool) (rate(cgledger_executor_calls_total{` + toolSel + `}[$__rate_interval]))`, "{{tool}}"})
	b.add("timeseries", "Errors by class", "Failed calls per second by taxonomy class.", "reqps",
		[2]string{`sum by (tool, error_class) (rate(cgledger_executor_calls_total{` + toolSel + `, status!="success"}[$__rate_interval]))`, "{{tool}} {{error_class}}"})
	b.add("timeseries", "Latency p50 / p95 / p99", "Executor time from picking up a command to its report.", "s",
		[2]string{`histogram_quantile(0.5, sum by (tool, le) (rate(cgledger_executor_call_duration_seconds_bucket{` + toolSel + `}[$__rate_interval])))`, "p50 {{tool}}"},
		[2]string{`histogram_quantile(0.95, sum by (tool, le) (rate(cgledger_executor_call_duration_seconds_bucket{` + toolSel + `}[$__rate_interval])))`, "p95 {{tool}}"},
		[2]string{`histogram_quantile(0.99, sum by (tool, le) (rate(cgledger_executor_call_duration_seconds_bucket{` + toolSel + `}[$__rate_interval])))`, "p99 {{tool}}"})
	b.add("timeseries", "Attempts, calls and deadline expiries", "Tool attempts (first tries and retries), calls resolved (a call refused before running has no attempt), and calls that hit their deadline.", "reqps",
		[2]string{`sum by (tool) (rate(cgledger_executor_attempts_total{` + toolSel + `}[$__rate_interval]))`, "attempts {{tool}}"},
		[2]string{`sum by (tool) (rate(cgledger_executor_calls_total{` + toolSel + `}[$__rate_interval]))`, "calls {{tool}}"},
		[2]string{`sum by (tool) (rate(cgledger_executor_deadline_expiries_total{` + toolSel + `}[$__rate_interval]))`, "deadlines {{tool}}"})
	b.add("timeseries", "In flight", "Calls running now, per tool (compare with the tool's concurrency_max).", "short",
		[2]string{`sum by (tool) (cgledger_executor_in_flight_calls{` + toolSel + `})`, "{{tool}}"})
	b.add("timeseries", "Backlog of the tool consumers", "Commands waiting and running, per durable consumer.", "short",
		[2]string{`sum by (consumer) (cgledger_consumer_pending_messages{` + sel + `})`, "waiting {{consumer}}"},
		[2]string{`sum by (consumer) (cgledger_consumer_ack_pending_messages{` + sel + `})`, "running {{consumer}}"})
	return newDashboard("cgledger-tool", "cgledger: tool drill-down", "One tool's rate, errors by class, latency, retries, deadlines and concurrency.", &b)
}

// LedgerHealth is the ledger's own health: API, appends, refusals, backlog,
// projector and stream.
func LedgerHealth() Dashboard {
	var b builder
	b.add("timeseries", "API requests by operation", "Answered requests per second.", "reqps",
		[2]string{`sum by (op) (rate(cgledger_api_requests_total{` + sel + `}[$__rate_interval]))`, "{{op}}"})
	b.add("timeseries", "API latency p99 by operation", "", "s",
		[2]string{`histogram_quantile(0.99, sum by (op, le) (rate(cgledger_api_request_duration_seconds_bucket{` + sel + `}[$__rate_interval])))`, "{{op}}"})
	b.add("timeseries", "Appends by kind", "Entries appended per second.", "reqps",
		[2]string{`sum by (kind) (rate(cgledger_ledger_appends_total{` + sel + `}[$__rate_interval]))`, "{{kind}}"})
	b.add("timeseries", "Append latency p99 by kind", "Publish to JetStream acknowledgement.", "s",
		[2]string{`histogram_quantile(0.99, sum by (kind, le) (rate(cgledger_ledger_append_duration_seconds_bucket{` + sel + `}[$__rate_interval])))`, "{{kind}}"})
	b.add("timeseries", "Duplicates and rejections", "Duplicate dispatches and reports; refusals by reason.", "reqps",
		[2]string{`sum(rate(cgledger_ledger_duplicate_dispatches_total{` + sel + `}[$__rate_interval]))`, "duplicate dispatches"},
		[2]string{`sum(rate(cgledger_ledger_duplicate_reports_total{` + sel + `}[$__rate_interval]))`, "duplicate reports"},
		[2]string{`sum by (reason) (rate(cgledger_ledger_rejections_total{` + sel + `}[$__rate_interval]))`, "rejected {{reason}}"})
	b.add("timeseries", "Projector lag", "Entries not yet applied and the age of the oldest.", "s",
		[2]string{`max(cgledger_projector_lag_seconds{` + sel + `})`, "seconds"},
		[2]string{`max(cgledger_projector_lag_entries{` + sel + `})`, "entries"})
	b.add("stat", "Projector stalled", "1 while stopped on an entry it cannot apply (docs/views.md).", "short",
		[2]string{`max(cgledger_projector_stalled{` + sel + `})`, "stalled"})
	b.add("timeseries", "Stream size", "Messages and bytes of the ledger stream and the call-record bucket.", "bytes",
		[2]string{`sum by (stream) (cgledger_stream_bytes{` + sel + `})`, "{{stream}}"})
	b.add("stat", "Storage degraded", "1 while the data directory takes no writes (docs/durability.md).", "short",
		[2]string{`max(cgledger_storage_degraded{` + sel + `})`, "degraded"})
	return newDashboard("cgledger-ledger", "cgledger: ledger health", "API and append rates and latency, duplicates and rejections, backlog, projector lag and stalls, stream size.", &b)
}

// All returns every dashboard by file name.
func All() map[string]Dashboard {
	return map[string]Dashboard{
		"slo-overview.json":   SLOOverview(),
		"tool-drilldown.json": ToolDrillDown(),
		"ledger-health.json":  LedgerHealth(),
	}
}
