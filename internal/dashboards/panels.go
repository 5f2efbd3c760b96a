package dashboards

import "fmt"

// sel is the label selector every query applies: the chosen instances and,
// for tool series, the chosen tools.
const (
	sel     = `instance=~"$instance"`
	toolSel = `instance=~"$instance", tool=~"$tool"`
)

// rate is the per-second rate of counter, summed by the labels by.
func rate(counter, selector, by string) string {
	return fmt.Sprintf(`sum by (%s) (rate(%s{%s}[$__rate_interval]))`, by, counter, selector)
}

// quantile is the q quantile of histogram, by the labels by.
func quantile(q, histogram, selector, by string) string {
	return fmt.Sprintf(`histogram_quantile(%s, sum by (%s, le) (rate(%s_bucket{%s}[$__rate_interval])))`, q, by, histogram, selector)
}

// gaugeMax is a gauge, the largest across instances: every serve of a
// cluster reads the same views and consumers, so summing would count them
// once per instance.
func gaugeMax(gauge, selector, by string) string {
	return fmt.Sprintf(`max by (%s) (%s{%s})`, by, gauge, selector)
}

// consumerSum is a consumer gauge summed over a tool's consumers, each
// counted once whatever the number of serve instances reading it.
func consumerSum(gauge string) string {
	return fmt.Sprintf(`sum by (tool) (max by (tool, consumer) (%s{%s}))`, gauge, toolSel)
}

// budgetLeftPanel is the error-budget stat's expression (rules_test.yml
// tests it with Grafana's variables replaced).
var budgetLeftPanel = BudgetLeft(BudgetPeriod, toolSel)

// BudgetLeftPanelExpr is the query of the SLO overview's "Error budget left
// (30d)" panel.
func BudgetLeftPanelExpr() string { return budgetLeftPanel }

// SLOOverview is the per-tool availability and latency SLO dashboard, from
// the ledger's side: every tool, whoever serves it.
func SLOOverview() Dashboard {
	var b builder
	b.add("timeseries", "Availability by tool (5m)", "Share of calls resolved success, per tool (reports the ledger accepted: every tool, built-in or external).", "percentunit",
		[2]string{`1 - (` + ErrorRatio("5m", toolSel) + `)`, "{{tool}}"})
	b.stat("Error budget left ("+BudgetPeriod+")", "Share of the 30-day error budget not yet spent (the period the burn-rate alerts are shares of: 14.4x over 1h spends 2% of it), against each tool's SLO (slo.success_rate_min, default "+defaultTargetText+"); 0 once spent.", "percentunit",
		steps("red", 0.25, "yellow", 0.5, "green"),
		[2]string{budgetLeftPanel, "{{tool}}"})
	b.bounds(0, 1)
	b.add("timeseries", "Burn rate, 1h and 5m", fmt.Sprintf("Error ratio divided by the error budget (1 = spending exactly the budget). Pages above 14.4 on both for 2m, with at least %d calls in the hour.", MinCallsInLongWindow), "short",
		[2]string{`cgledger:tool_errors:ratio_rate1h{tool=~"$tool"} / on (tool) ` + budget, "1h {{tool}}"},
		[2]string{`cgledger:tool_errors:ratio_rate5m{tool=~"$tool"} / on (tool) ` + budget, "5m {{tool}}"})
	b.add("timeseries", "Burn rate, 6h and 30m", fmt.Sprintf("Pages above 6 on both for 15m, with at least %d calls in 6h.", MinCallsInLongWindow), "short",
		[2]string{`cgledger:tool_errors:ratio_rate6h{tool=~"$tool"} / on (tool) ` + budget, "6h {{tool}}"},
		[2]string{`cgledger:tool_errors:ratio_rate30m{tool=~"$tool"} / on (tool) ` + budget, "30m {{tool}}"})
	b.add("timeseries", "Call latency p95, dispatch to report", "As the agent sees it, against the tool's latency SLO where it has one.", "s",
		[2]string{quantile("0.95", "cgledger_call_report_latency_seconds", toolSel, "tool"), "p95 {{tool}}"},
		[2]string{gaugeMax("cgledger_tool_slo_p95_latency_max_seconds", toolSel, "tool"), "SLO {{tool}}"})
	b.add("timeseries", "Calls by status", "Reports accepted per second, by status.", "reqps",
		[2]string{rate("cgledger_tool_calls_total", toolSel, "status"), "{{status}}"})
	b.stat("Calls waiting", "Calls dispatched and not yet reported, per tool (from the views).", "short",
		steps("green", 100, "yellow", 1000, "red"),
		[2]string{gaugeMax("cgledger_tool_calls_waiting", toolSel, "tool"), "{{tool}}"})
	b.stat("Calls overdue", "Waiting calls past their deadline: the ledger's deadline keeper should end them within 5 s.", "short",
		steps("green", 1, "red"),
		[2]string{gaugeMax("cgledger_tool_calls_overdue", toolSel, "tool"), "{{tool}}"})
	return newDashboard("cgledger-slo", "cgledger: SLO overview", "Availability and latency SLOs per tool (every tool, whoever serves it), error budget, burn rates, waiting and overdue calls.", &b)
}

// ToolDrillDown is one tool's outcomes, latency, waiting calls and
// backlog from the ledger's side (every tool), then what only the executor
// sees of the built-in tools.
func ToolDrillDown() Dashboard {
	var b builder
	b.add("timeseries", "Outcomes by status and error code", "Reports accepted per second (every tool, whoever serves it), by status and the result card's error code.", "reqps",
		[2]string{rate("cgledger_tool_calls_total", toolSel, "tool, status, error_code"), "{{tool}} {{status}} {{error_code}}"})
	b.add("timeseries", "Dispatches and reports", "Calls dispatched and reports accepted per second.", "reqps",
		[2]string{rate("cgledger_tool_dispatches_total", toolSel, "tool"), "dispatched {{tool}}"},
		[2]string{rate("cgledger_tool_calls_total", toolSel, "tool"), "reported {{tool}}"})
	b.add("timeseries", "Latency p50 / p95 / p99, dispatch to report", "As the agent sees it: dispatch to the accepted report, every tool.", "s",
		[2]string{quantile("0.5", "cgledger_call_report_latency_seconds", toolSel, "tool"), "p50 {{tool}}"},
		[2]string{quantile("0.95", "cgledger_call_report_latency_seconds", toolSel, "tool"), "p95 {{tool}}"},
		[2]string{quantile("0.99", "cgledger_call_report_latency_seconds", toolSel, "tool"), "p99 {{tool}}"})
	b.add("timeseries", "Calls waiting and overdue", "Dispatched and not yet reported; of those, past their deadline (the deadline keeper should end them within 5 s).", "short",
		[2]string{gaugeMax("cgledger_tool_calls_waiting", toolSel, "tool"), "waiting {{tool}}"},
		[2]string{gaugeMax("cgledger_tool_calls_overdue", toolSel, "tool"), "overdue {{tool}}"})
	b.add("timeseries", "Oldest waiting call age", "Now minus the dispatch time of the oldest call without a report, against the tool's timeout.", "s",
		[2]string{gaugeMax("cgledger_tool_oldest_waiting_call_age_seconds", toolSel, "tool"), "oldest {{tool}}"},
		[2]string{gaugeMax("cgledger_tool_timeout_seconds", toolSel, "tool"), "timeout {{tool}}"})
	b.add("timeseries", "Approvals pending and oldest pending age", "Held calls with no decision yet, and now minus the held time of the oldest (from the views). An age near the tool's approval.timeout_ms means calls expire undecided: nobody watches the queue (docs/approvals.md).", "short",
		[2]string{gaugeMax("cgledger_approvals_pending", toolSel, "tool"), "pending {{tool}}"},
		[2]string{gaugeMax("cgledger_approvals_oldest_pending_age_seconds", toolSel, "tool"), "oldest pending age (s) {{tool}}"})
	b.add("timeseries", "Deadline timeouts, unavailable, late reports", "Calls the ledger ended itself at their deadline (no service answered), calls refused S-TOOL-UNAVAILABLE at dispatch (nobody pulls the tool), and reports refused as late.", "reqps",
		[2]string{rate("cgledger_ledger_deadline_timeouts_total", toolSel, "tool"), "deadline timeouts {{tool}}"},
		[2]string{rate("cgledger_ledger_tool_unavailable_total", toolSel, "tool"), "unavailable {{tool}}"},
		[2]string{rate("cgledger_ledger_late_reports_total", toolSel, "tool"), "late reports {{tool}}"})
	b.add("timeseries", "Consumer backlog by tool", "Commands not yet delivered, delivered and not acknowledged (running), and delivered more than once, summed over the tool's consumers. _any: a consumer for several tools.", "short",
		[2]string{consumerSum("cgledger_consumer_pending_messages"), "waiting {{tool}}"},
		[2]string{consumerSum("cgledger_consumer_ack_pending_messages"), "running {{tool}}"},
		[2]string{consumerSum("cgledger_consumer_redelivered_messages"), "redelivered {{tool}}"})
	b.add("timeseries", "Consumer pulls waiting and idle time", "Pull requests waiting (0: nobody pulls the tool now) and the time since the consumer last delivered or was acknowledged.", "short",
		[2]string{consumerSum("cgledger_consumer_waiting_pulls"), "pulls waiting {{tool}}"},
		[2]string{`max by (tool) (cgledger_consumer_idle_seconds{` + toolSel + `})`, "idle seconds {{tool}}"})
	b.add("timeseries", "Wakeup latency p95", "Accepted report to its wakeup stored (or recorded as skipped).", "s",
		[2]string{quantile("0.95", "cgledger_call_wakeup_latency_seconds", toolSel, "tool"), "{{tool}}"})
	b.add("timeseries", "Built-in tools only: executor latency p50 / p95 / p99", "The executor's time from picking up a command to its report (built-in tools only; external tools have no executor).", "s",
		[2]string{quantile("0.5", "cgledger_executor_call_duration_seconds", toolSel, "tool"), "p50 {{tool}}"},
		[2]string{quantile("0.95", "cgledger_executor_call_duration_seconds", toolSel, "tool"), "p95 {{tool}}"},
		[2]string{quantile("0.99", "cgledger_executor_call_duration_seconds", toolSel, "tool"), "p99 {{tool}}"})
	b.add("timeseries", "Built-in tools only: attempts, retries and deadline expiries", "Tool attempts (first tries and retries), retries (attempts minus calls resolved), calls that hit their deadline in the executor.", "reqps",
		[2]string{rate("cgledger_executor_attempts_total", toolSel, "tool"), "attempts {{tool}}"},
		[2]string{`clamp_min(` + rate("cgledger_executor_attempts_total", toolSel, "tool") + ` - on (tool) ` + rate("cgledger_executor_calls_total", toolSel, "tool") + `, 0)`, "retries {{tool}}"},
		[2]string{rate("cgledger_executor_deadline_expiries_total", toolSel, "tool"), "deadlines {{tool}}"})
	b.add("timeseries", "Built-in tools only: in flight", "Calls the executor runs now, per tool (compare with the tool's concurrency_max).", "short",
		[2]string{`sum by (tool) (cgledger_executor_in_flight_calls{` + toolSel + `})`, "{{tool}}"})
	b.add("timeseries", "Built-in tools only: executor redeliveries, rejected commands, transient failures", "Commands delivered again (crash, nak, ack timeout), commands answered with a rejection entry by reason, and commands handed back because a ledger read or write failed.", "reqps",
		[2]string{rate("cgledger_executor_redeliveries_total", sel, "impl"), "redelivered {{impl}}"},
		[2]string{rate("cgledger_executor_commands_rejected_total", sel, "reason"), "rejected {{reason}}"},
		[2]string{`sum(rate(cgledger_executor_transient_failures_total{` + sel + `}[$__rate_interval]))`, "transient failures"})
	return newDashboard("cgledger-tool", "cgledger: tool drill-down", "One tool's outcomes, latency, waiting and overdue calls, deadline timeouts and backlog (every tool), then the executor's view of built-in tools.", &b)
}

// LedgerHealth is the ledger's own health: serve, API and HTTP, appends,
// refusals, wakeups, projector, storage and NATS.
func LedgerHealth() Dashboard {
	var b builder
	b.stat("Serve up", "1 while Prometheus scrapes serve (job cgledger).", "short", goodAtOne,
		[2]string{`up{job="cgledger", ` + sel + `}`, "{{instance}}"})
	b.stat("NATS connected", "1 while serve's NATS connection is up.", "short", goodAtOne,
		[2]string{`min by (instance) (cgledger_nats_connected{` + sel + `})`, "{{instance}}"})
	b.add("timeseries", "API requests by operation and code", "Answered ledger API requests per second.", "reqps",
		[2]string{rate("cgledger_api_requests_total", sel, "op, code"), "{{op}} {{code}}"})
	b.add("timeseries", "API latency p99 by operation", "", "s",
		[2]string{quantile("0.99", "cgledger_api_request_duration_seconds", sel, "op"), "{{op}}"})
	b.add("timeseries", "HTTP requests by route and code", "Audit API, tool registry, health and metrics; refusals by authentication show as 401.", "reqps",
		[2]string{rate("cgledger_http_requests_total", sel, "route, code"), "{{route}} {{code}}"})
	b.add("timeseries", "HTTP latency p50 / p99 by route", "", "s",
		[2]string{quantile("0.5", "cgledger_http_request_duration_seconds", sel, "route"), "p50 {{route}}"},
		[2]string{quantile("0.99", "cgledger_http_request_duration_seconds", sel, "route"), "p99 {{route}}"})
	b.add("timeseries", "Appends by kind", "Entries appended per second.", "reqps",
		[2]string{rate("cgledger_ledger_appends_total", sel, "kind"), "{{kind}}"})
	b.add("timeseries", "Append latency p99 by kind", "Publish to JetStream acknowledgement.", "s",
		[2]string{quantile("0.99", "cgledger_ledger_append_duration_seconds", sel, "kind"), "{{kind}}"})
	b.add("timeseries", "Duplicates, rejections and refused writes", "Duplicate dispatches and reports; refusals by reason; writes refused because storage is degraded.", "reqps",
		[2]string{`sum(rate(cgledger_ledger_duplicate_dispatches_total{` + sel + `}[$__rate_interval]))`, "duplicate dispatches"},
		[2]string{`sum(rate(cgledger_ledger_duplicate_reports_total{` + sel + `}[$__rate_interval]))`, "duplicate reports"},
		[2]string{rate("cgledger_ledger_rejections_total", sel, "reason"), "rejected {{reason}}"},
		[2]string{`sum(rate(cgledger_ledger_writes_refused_total{` + sel + `}[$__rate_interval]))`, "writes refused"})
	b.add("timeseries", "Wakeups and skipped wakeups", "Wakeups published, and reports whose agent had no roster entry.", "reqps",
		[2]string{`sum(rate(cgledger_ledger_wakeups_total{` + sel + `}[$__rate_interval]))`, "wakeups"},
		[2]string{`sum(rate(cgledger_ledger_wakeups_skipped_total{` + sel + `}[$__rate_interval]))`, "skipped"})
	b.add("timeseries", "Wakeup latency p95 by tool", "Accepted report to its wakeup stored.", "s",
		[2]string{quantile("0.95", "cgledger_call_wakeup_latency_seconds", sel, "tool"), "{{tool}}"})
	b.add("timeseries", "Consumer redeliveries by tool", "Commands delivered more than once and not yet acknowledged, summed over each tool's consumers.", "short",
		[2]string{`sum by (tool) (max by (tool, consumer) (cgledger_consumer_redelivered_messages{` + sel + `}))`, "{{tool}}"})
	b.add("timeseries", "Projector lag (seconds)", "Age of the oldest entry not yet applied (0 when caught up).", "s",
		[2]string{`max by (instance) (cgledger_projector_lag_seconds{` + sel + `})`, "{{instance}}"})
	b.add("timeseries", "Projector lag (entries)", "Entries appended and not yet applied.", "short",
		[2]string{`max by (instance) (cgledger_projector_lag_entries{` + sel + `})`, "{{instance}}"})
	b.add("timeseries", "Projector errors by reason", "gap, corrupt, store, nats.", "short",
		[2]string{`sum by (reason) (increase(cgledger_projector_errors_total{` + sel + `}[$__rate_interval]))`, "{{reason}}"})
	b.stat("Projector stalled", "1 while stopped on an entry it cannot apply (docs/views.md).", "short", badAtOne,
		[2]string{`max(cgledger_projector_stalled{` + sel + `})`, "stalled"})
	b.add("timeseries", "Data directory free against the reserve", "Free space on the data directory's file system; below the reserve serve refuses writes.", "bytes",
		[2]string{`min by (instance) (cgledger_data_free_bytes{` + sel + `})`, "free {{instance}}"},
		[2]string{`max by (instance) (cgledger_data_reserve_bytes{` + sel + `})`, "reserve {{instance}}"})
	b.stat("Storage degraded", "1 while the data directory takes no writes (docs/durability.md).", "short", badAtOne,
		[2]string{`max(cgledger_storage_degraded{` + sel + `})`, "degraded"})
	b.add("timeseries", "NATS reconnects", "Reconnects of serve's NATS connection in each interval.", "short",
		[2]string{`sum by (instance) (increase(cgledger_nats_reconnects_total{` + sel + `}[$__rate_interval]))`, "{{instance}}"})
	b.add("timeseries", "Stream size", "Bytes of the ledger stream and the call-record bucket.", "bytes",
		[2]string{`max by (stream) (cgledger_stream_bytes{` + sel + `})`, "{{stream}}"})
	return newDashboard("cgledger-ledger", "cgledger: ledger health", "Serve and NATS up, API and HTTP rates and latency, appends, refusals, wakeups, consumer redeliveries, projector lag and errors, disk free against the reserve, stream size.", &b)
}

// All returns every dashboard by file name.
func All() map[string]Dashboard {
	return map[string]Dashboard{
		"slo-overview.json":   SLOOverview(),
		"tool-drilldown.json": ToolDrillDown(),
		"ledger-health.json":  LedgerHealth(),
	}
}
