package dashboards

import (
	"fmt"
	"strconv"
)

// DefaultTarget is the availability SLO the rules hold a tool to when its
// definition sets no slo.success_rate_min: 99% of calls resolved success.
const DefaultTarget = 0.99

// MinCallsInLongWindow is the minimum-traffic guard of the burn-rate
// alerts: a tool pages only when the alert's long window (1h for the fast
// alert, 6h for the slow one) holds at least this many of its calls. Below
// it a single failure is a large share of the calls and says nothing about
// the budget (issue 25: a new tool at 1 call/s with a 99.5% SLO paged on
// its first timeouts).
const MinCallsInLongWindow = 50

// notOther excludes the tool label of names registered in no call's
// project and built in nowhere (toollabels.Other) from every tool
// alert: they are names workers made up, with no tool, project or service
// to act on. The dashboards keep showing _other.
const notOther = `tool!="_other"`

// BudgetPeriod is the error-budget period: the "Error budget left" panel's
// window, and the period the burn-rate factors are shares of (14.4x over
// 1h spends 2% of it; the SRE workbook's 30 days).
const BudgetPeriod = "30d"

// MinRequestsForRejectionSpike is the minimum-traffic guard of
// CgledgerRejectionSpike: the API requests of an instance over 5m.
const MinRequestsForRejectionSpike = 50

// ApprovalsWaitingSeconds is CgledgerApprovalsWaiting's threshold on the
// oldest pending approval's age: half the default approval.timeout_ms (1
// h), so with its 15m "for" the ticket comes while a call held under the
// default timeout still has a quarter of an hour before it expires
// undecided. An hour would never fire under the default timeout: the
// ledger expires the call first.
const ApprovalsWaitingSeconds = 1800

// NotAnsweringCalls is how many of a tool's calls the ledger must end
// itself (deadline timeouts and fail-fast S-TOOL-UNAVAILABLE) within 10m
// for CgledgerToolNotAnswering.
const NotAnsweringCalls = 3

// WaitingSlackSeconds is how much older than its tool's timeout the oldest
// waiting call must be for CgledgerToolCallsWaitingTooLong: the deadline
// keeper ends a call 5 s after its deadline (its grace), so under steady
// load to a dead tool the oldest call is always a few seconds past the
// timeout, which CgledgerToolNotAnswering covers; a minute past it means
// the keeper did not end it.
const WaitingSlackSeconds = 60

// DiskHistoryMinSeconds is how much of its hour of history
// CgledgerDiskFillingUp needs before it judges a trend: predict_linear over
// a few samples (Prometheus or serve just started) extrapolates noise over
// four hours.
const DiskHistoryMinSeconds = 1800

// Gauge lookbacks. A scrape that fails (serve restarting) marks every
// series of the target stale at once, so an instant selector of a gauge
// goes empty for the length of the outage and an alert on it resolves and,
// after the restart, pages again with a new start. Every gauge in a rule
// is read over a range instead; a range of a minute or more outlives a
// 20-30 s outage.
const (
	// gaugeLookback reads the gauges an alert's condition is about.
	gaugeLookback = "1m"
	// configLookback reads the gauges that are configuration (SLO targets,
	// timeouts, the disk reserve): they change seldom, so a longer range
	// costs nothing and keeps them through longer outages.
	configLookback = "10m"
)

const (
	defaultTargetText = "99%"
	// budget is each tool's error budget, 1 - its target, as PromQL (a
	// recording rule).
	budget = "cgledger:tool_error_budget:ratio"
)

// budgetExpr computes the budget: the tool's own target where its
// definition sets one, else DefaultTarget for every tool serve knows (the
// timeout gauge is exported for every registered tool and built-in) or has
// counted a call of (_other). All read over configLookback, so the budget
// does not go empty while serve restarts.
var budgetExpr = `1 - (max by (tool) (max_over_time(cgledger_tool_slo_success_min_ratio[` + configLookback + `])) or on (tool) ` +
	`(group by (tool) (max_over_time(cgledger_tool_timeout_seconds[` + configLookback + `])) or group by (tool) (max_over_time(cgledger_tool_calls_total[` + configLookback + `]))) * ` +
	strconv.FormatFloat(DefaultTarget, 'g', -1, 64) + `)`

// ErrorRatio is the share of a tool's calls not resolved success over
// window, for the series selected by selector, from the ledger's count of
// accepted reports (every tool, whoever serves it).
// A tool with no failed call has no failure series: "or ... * 0" makes its
// ratio 0 rather than absent.
func ErrorRatio(window, selector string) string {
	total := fmt.Sprintf(`sum by (tool) (rate(cgledger_tool_calls_total{%s}[%s]))`, selector, window)
	return fmt.Sprintf(`(sum by (tool) (rate(cgledger_tool_calls_total{%s, status!="success"}[%s])) or %s * 0) / %s`,
		selector, window, total, total)
}

// BudgetLeft is the share of a tool's error budget not yet spent over
// window, floored at 0: an overspent budget reads 0, not -19,900%.
func BudgetLeft(window, selector string) string {
	return `clamp_min(1 - (` + ErrorRatio(window, selector) + `) / on (tool) ` + budget + `, 0)`
}

// RuleFile is a Prometheus rule file.
type RuleFile struct {
	Groups []RuleGroup `yaml:"groups"`
}

// RuleGroup is a named group of rules.
type RuleGroup struct {
	Name  string `yaml:"name"`
	Rules []Rule `yaml:"rules"`
}

// Rule is a recording rule (Record) or an alert (Alert).
type Rule struct {
	Record      string            `yaml:"record,omitempty"`
	Alert       string            `yaml:"alert,omitempty"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

// errorWindows are the windows of the multi-window, multi-burn-rate alerts
// (the SRE workbook's: 1h with 5m, 6h with 30m).
var errorWindows = []string{"5m", "30m", "1h", "6h"}

// trafficWindows are the windows whose call counts guard the alerts: the
// burn alerts' long windows and the latency SLO's 30m.
var trafficWindows = []string{"30m", "1h", "6h"}

// runbook is the docs/operations.md anchor of an alert's section.
func runbook(alert string) string {
	return "docs/operations.md#" + toAnchor(alert)
}

// toAnchor is GitHub's anchor of a heading that is just the alert's name.
func toAnchor(alert string) string {
	b := []byte(alert)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// alert builds an alert whose description ends with its runbook section.
func alert(name, expr, forDur, severity, summary, description string) Rule {
	return Rule{Alert: name, Expr: expr, For: forDur, Labels: map[string]string{"severity": severity},
		Annotations: map[string]string{"summary": summary, "description": description + " Runbook: " + runbook(name) + "."}}
}

// Rules returns cgledger's recording rules and alerts.
func Rules() RuleFile {
	var rec []Rule
	for _, w := range errorWindows {
		rec = append(rec, Rule{Record: "cgledger:tool_errors:ratio_rate" + w, Expr: ErrorRatio(w, `job=~".+"`)})
	}
	for _, w := range trafficWindows {
		rec = append(rec, Rule{Record: "cgledger:tool_calls:increase" + w, Expr: fmt.Sprintf(`sum by (tool) (increase(cgledger_tool_calls_total[%s]))`, w)})
	}
	rec = append(rec, Rule{Record: budget, Expr: budgetExpr})
	burn := func(name, long, short, factor, forDur string) Rule {
		return alert(name,
			// The guard is read over 5m: while serve restarts, increase()
			// stops extrapolating to the window's end, and a tool just over
			// the guard would fall under it for the outage and page again
			// after it.
			fmt.Sprintf("cgledger:tool_errors:ratio_rate%s{%s} > on (tool) (%s * %s) and on (tool) cgledger:tool_errors:ratio_rate%s > on (tool) (%s * %s) and on (tool) max_over_time(cgledger:tool_calls:increase%s[5m]) >= %d",
				long, notOther, factor, budget, short, factor, budget, long, MinCallsInLongWindow),
			forDur, "page",
			"Tool {{ $labels.tool }} is burning its error budget "+factor+"x too fast",
			fmt.Sprintf("Over %s and %s, more than %s times the error rate its SLO allows (slo.success_rate_min, default %s), with at least %d calls in %s.",
				long, short, factor, defaultTargetText, MinCallsInLongWindow, long))
	}
	// notAnswered is a tool's calls the ledger ended itself in 10m: each
	// counter where the other has no series yet counts as 0 on its side.
	dt := `sum by (tool) (increase(cgledger_ledger_deadline_timeouts_total{` + notOther + `}[10m]))`
	un := `sum by (tool) (increase(cgledger_ledger_tool_unavailable_total{` + notOther + `}[10m]))`
	notAnswered := fmt.Sprintf(`(%s or %s * 0) + on (tool) (%s or %s * 0)`, dt, un, un, dt)
	lb := func(fn, metric, by, window string) string {
		return fmt.Sprintf(`max by (%s) (%s(%s[%s]))`, by, fn, metric, window)
	}
	reserve := lb("max_over_time", "cgledger_data_reserve_bytes", "instance", configLookback)
	alerts := []Rule{
		alert("CgledgerServeDown", `up{job="cgledger"} == 0`, "1m", "page",
			"Prometheus cannot scrape cgledger serve {{ $labels.instance }}",
			"The scrape of {{ $labels.instance }} has failed for a minute: serve is down, restarting in a loop, or unreachable."),
		alert("CgledgerServeAbsent", `absent(up{job="cgledger"})`, "5m", "page",
			"No cgledger serve is scraped at all",
			"Prometheus has no target in job cgledger: its service discovery or configuration lost serve."),
		burn("CgledgerToolErrorBudgetBurnFast", "1h", "5m", "14.4", "2m"),
		burn("CgledgerToolErrorBudgetBurnSlow", "6h", "30m", "6", "15m"),
		// The same minimum-traffic guard as the burn alerts, read over 5m
		// for the same reason: the p95 of a handful of calls is one slow
		// call.
		alert("CgledgerToolLatencySLO",
			"histogram_quantile(0.95, sum by (tool, le) (rate(cgledger_call_report_latency_seconds_bucket{"+notOther+"}[30m]))) > on (tool) "+lb("max_over_time", "cgledger_tool_slo_p95_latency_max_seconds", "tool", configLookback)+
				fmt.Sprintf(" and on (tool) max_over_time(cgledger:tool_calls:increase30m[5m]) >= %d", MinCallsInLongWindow),
			"15m", "ticket",
			"Tool {{ $labels.tool }} is slower than its SLO: p95 over 30m above slo.p95_latency_ms_max",
			fmt.Sprintf("Dispatch to accepted report, as the agent sees it, over 30m, with at least %d calls in the 30m.", MinCallsInLongWindow)),
		alert("CgledgerToolNotAnswering", notAnswered+fmt.Sprintf(" >= %d", NotAnsweringCalls), "2m", "page",
			"No service answers tool {{ $labels.tool }}: the ledger ended {{ $value }} of its calls itself in 10m",
			"Deadline timeouts (no report by the deadline) and fail-fast S-TOOL-UNAVAILABLE (nobody pulls the tool): its service is dead, absent or stuck."),
		alert("CgledgerToolCallsOverdue", lb("min_over_time", "cgledger_tool_calls_overdue{"+notOther+"}", "tool", gaugeLookback)+" > 0", "2m", "page",
			"Calls to tool {{ $labels.tool }} are still waiting past their deadline",
			"The views hold calls whose deadline has passed and that the ledger's deadline keeper has not ended: it cannot append, or does not run."),
		alert("CgledgerToolCallsWaitingTooLong",
			lb("min_over_time", "cgledger_tool_oldest_waiting_call_age_seconds{"+notOther+"}", "tool", gaugeLookback)+" > on (tool) ("+lb("max_over_time", "cgledger_tool_timeout_seconds", "tool", configLookback)+fmt.Sprintf(" + %d)", WaitingSlackSeconds),
			"2m", "ticket",
			"The oldest waiting call to tool {{ $labels.tool }} is older than the tool's timeout plus a minute",
			"A call dispatched longer ago than the tool's timeout plus a minute has no report yet, though the deadline keeper ends calls 5 s after their deadline."),
		// A ticket, not a page: a held call nobody decides expires by
		// itself (the worker gets P-PRECOND-APPROVAL-EXPIRED), so nothing
		// is stuck, but people are not watching the queue.
		alert("CgledgerApprovalsWaiting",
			lb("min_over_time", "cgledger_approvals_oldest_pending_age_seconds{"+notOther+"}", "tool", gaugeLookback)+fmt.Sprintf(" > %d", ApprovalsWaitingSeconds),
			"15m", "ticket",
			"A call to tool {{ $labels.tool }} has waited {{ $value | humanizeDuration }} for an approver",
			"The oldest held call of the tool has had no approve or deny for over 30 minutes, for 15 minutes: approvers are not watching the queue, or the tool's approvers list names nobody who holds a credential. Undecided calls expire at the tool's approval.timeout_ms (default 1 h)."),
		alert("CgledgerConsumerStranded",
			lb("min_over_time", "cgledger_consumer_pending_messages", "consumer, tool", gaugeLookback)+" > 0 and on (consumer, tool) "+
				lb("max_over_time", "cgledger_consumer_waiting_pulls", "consumer, tool", gaugeLookback)+" == 0 and on (consumer, tool) "+
				lb("min_over_time", "cgledger_consumer_idle_seconds", "consumer, tool", gaugeLookback)+" > 300",
			"5m", "ticket",
			"Commands for tool {{ $labels.tool }} wait on consumer {{ $labels.consumer }} and nobody pulls them",
			"The consumer has undelivered commands, no pull request waiting, and no delivery or ack for over 5 minutes: the executor or tool service that pulls it is gone."),
		alert("CgledgerRejectionSpike",
			// The value is the refused share, as the runbook reads it.
			fmt.Sprintf("sum by (instance) (rate(cgledger_ledger_rejections_total[5m])) / sum by (instance) (rate(cgledger_api_requests_total[5m])) > 0.2 and on (instance) sum by (instance) (increase(cgledger_api_requests_total[5m])) >= %d", MinRequestsForRejectionSpike),
			"10m", "ticket",
			"{{ $value | humanizePercentage }} of the ledger API requests of {{ $labels.instance }} are refused (more than a fifth)",
			fmt.Sprintf("Over 5m, with at least %d requests.", MinRequestsForRejectionSpike)),
		alert("CgledgerNotReady",
			lb("max_over_time", "cgledger_storage_degraded", "instance", gaugeLookback)+" == 1 or "+lb("min_over_time", "cgledger_nats_connected", "instance", gaugeLookback)+" == 0",
			"2m", "page",
			"{{ $labels.instance }} cannot write (storage degraded or NATS disconnected); /readyz says why",
			"Storage degraded or serve's NATS connection down for 2 minutes."),
		alert("CgledgerDiskFillingUp",
			"max by (instance) (predict_linear(cgledger_data_free_bytes[1h], 4 * 3600)) < on (instance) "+reserve+
				fmt.Sprintf(" and on (instance) max by (instance) (time() - min_over_time(timestamp(cgledger_data_free_bytes)[1h:1m])) > %d", DiskHistoryMinSeconds),
			"15m", "ticket",
			"The data directory of {{ $labels.instance }} will reach its reserve within 4 hours",
			"At the last hour's rate (judged once 30 minutes of it are known), free space falls to the disk reserve (below which serve refuses writes) within 4 hours."),
		alert("CgledgerDiskNearlyFull",
			lb("max_over_time", "cgledger_data_free_bytes", "instance", gaugeLookback)+" < on (instance) 2 * "+reserve,
			"5m", "page",
			"The data directory of {{ $labels.instance }} has less than twice its reserve free",
			"Once free space reaches the reserve, serve refuses writes (storage degraded)."),
		alert("CgledgerProjectorStalled", lb("min_over_time", "cgledger_projector_stalled", "instance", gaugeLookback)+" == 1", "1m", "page",
			"The projector of {{ $labels.instance }} is stopped on an entry it cannot apply",
			"Views are frozen. See docs/views.md#operator-recovery."),
		alert("CgledgerProjectorLagging", lb("min_over_time", "cgledger_projector_lag_seconds", "instance", gaugeLookback)+" > 60", "5m", "ticket",
			"The views of {{ $labels.instance }} are more than a minute behind the ledger",
			"The oldest entry not yet applied has been older than 60 s for 5 minutes."),
		alert("CgledgerProjectorErrors", "sum by (instance, reason) (increase(cgledger_projector_errors_total[10m])) > 0", "5m", "ticket",
			"The projector of {{ $labels.instance }} hits {{ $labels.reason }} errors",
			"The projector counted errors of this reason in the last 10 minutes, for 5 minutes."),
		alert("CgledgerNATSReconnecting", "sum by (instance) (increase(cgledger_nats_reconnects_total[15m])) >= 3", "", "ticket",
			"The NATS connection of {{ $labels.instance }} reconnected {{ $value }} times in 15m",
			"Each reconnect is an outage of serve's writes; three in 15 minutes is a flapping connection or server."),
		// The lost-entries counter is a level (the markers on disk, counted
		// again at start), not a rate: it pages while any exist. Read over a
		// range so a restart does not resolve and re-page it.
		alert("CgledgerArchiveLostHistory", lb("max_over_time", "cgledger_archive_lost_entries_total", "instance", gaugeLookback)+" > 0", "", "page",
			"{{ $labels.instance }}: {{ $value }} ledger entries expired before they were archived",
			"The archive in <data>/archive records them in lost-*.json."),
	}
	// One group: Prometheus evaluates a group's rules in order, so each
	// alert reads the recording rules of the same evaluation. Groups run
	// independently (and promtool evaluates them in random order), so in
	// two groups an alert would read the rules one evaluation late, or not.
	return RuleFile{Groups: []RuleGroup{{Name: "cgledger", Rules: append(rec, alerts...)}}}
}
