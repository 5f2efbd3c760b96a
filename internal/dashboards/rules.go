package dashboards

import "fmt"

// DefaultTarget is the availability SLO the rules hold a tool to when its
// definition sets no slo.success_rate_min: 99% of calls resolved success.
const DefaultTarget = 0.99

const (
	defaultTargetText = "99%"
	// budget is each tool's error budget, 1 - its target, as PromQL (a
	// recording rule).
	budget = "cgledger:tool_error_budget:ratio"
	// budgetExpr computes it: the tool's own target where its definition
	// sets one (exported by serve), else DefaultTarget. Counters never
	// give NaN, so they carry the tool label for the default.
	budgetExpr = `1 - (max by (tool) (cgledger_tool_slo_success_rate_min) or on (tool) (max by (tool) (cgledger_executor_calls_total) * 0 + 0.99))`
)

// ErrorRatio is the share of a tool's calls not resolved success over
// window, for the series selected by selector.
// A tool with no failed call has no failure series: "or ... * 0" makes its
// ratio 0 rather than absent.
func ErrorRatio(window, selector string) string {
	total := fmt.Sprintf(`sum by (tool) (rate(cgledger_executor_calls_total{%s}[%s]))`, selector, window)
	return fmt.Sprintf(`(sum by (tool) (rate(cgledger_executor_calls_total{%s, status!="success"}[%s])) or %s * 0) / %s`,
		selector, window, total, total)
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

// Rules returns cgledger's recording rules and alerts.
func Rules() RuleFile {
	var rec []Rule
	for _, w := range errorWindows {
		rec = append(rec, Rule{Record: "cgledger:tool_errors:ratio_rate" + w, Expr: ErrorRatio(w, `job=~".+"`)})
	}
	rec = append(rec, Rule{Record: budget, Expr: budgetExpr})
	burn := func(name, long, short, factor, severity string) Rule {
		return Rule{Alert: name,
			Expr: fmt.Sprintf("cgledger:tool_errors:ratio_rate%s > on (tool) (%s * %s) and cgledger:tool_errors:ratio_rate%s > on (tool) (%s * %s)",
				long, factor, budget, short, factor, budget),
			Labels: map[string]string{"severity": severity},
			Annotations: map[string]string{
				"summary":     "Tool {{ $labels.tool }} is burning its error budget " + factor + "x too fast",
				"description": "Over " + long + " and " + short + ", more than " + factor + " times the error rate its SLO allows (slo.success_rate_min, default " + defaultTargetText + "). See docs/operations.md#alerts.",
			}}
	}
	alerts := []Rule{
		burn("CgledgerToolErrorBudgetBurnFast", "1h", "5m", "14.4", "page"),
		burn("CgledgerToolErrorBudgetBurnSlow", "6h", "30m", "6", "page"),
		{Alert: "CgledgerToolLatencySLO", Expr: "histogram_quantile(0.95, sum by (tool, le) (rate(cgledger_executor_call_duration_seconds_bucket[30m]))) > on (tool) max by (tool) (cgledger_tool_slo_p95_latency_seconds_max)", For: "15m",
			Labels:      map[string]string{"severity": "ticket"},
			Annotations: map[string]string{"summary": "Tool {{ $labels.tool }} is slower than its SLO: p95 over 30m above slo.p95_latency_ms_max"}},
		{Alert: "CgledgerProjectorStalled", Expr: "max by (instance) (cgledger_projector_stalled) == 1", For: "1m",
			Labels:      map[string]string{"severity": "page"},
			Annotations: map[string]string{"summary": "The projector of {{ $labels.instance }} is stopped on an entry it cannot apply", "description": "Views are frozen. See docs/views.md#operator-recovery."}},
		{Alert: "CgledgerProjectorLagging", Expr: "max by (instance) (cgledger_projector_lag_seconds) > 60", For: "5m",
			Labels:      map[string]string{"severity": "ticket"},
			Annotations: map[string]string{"summary": "The views of {{ $labels.instance }} are more than a minute behind the ledger"}},
		{Alert: "CgledgerConsumerBacklogGrowing", Expr: "max by (instance, consumer) (cgledger_consumer_pending_messages) > 100 and max by (instance, consumer) (deriv(cgledger_consumer_pending_messages[10m])) > 0", For: "10m",
			Labels:      map[string]string{"severity": "ticket"},
			Annotations: map[string]string{"summary": "Commands pile up on consumer {{ $labels.consumer }}: its executors or tool service do not keep up"}},
		{Alert: "CgledgerRejectionSpike", Expr: "sum by (instance) (rate(cgledger_ledger_rejections_total[5m])) > 0.2 * sum by (instance) (rate(cgledger_api_requests_total[5m]))", For: "10m",
			Labels:      map[string]string{"severity": "ticket"},
			Annotations: map[string]string{"summary": "More than a fifth of the ledger API requests of {{ $labels.instance }} are refused"}},
		{Alert: "CgledgerNotReady", Expr: "max by (instance) (cgledger_storage_degraded) == 1 or min by (instance) (cgledger_nats_connected) == 0", For: "2m",
			Labels:      map[string]string{"severity": "page"},
			Annotations: map[string]string{"summary": "{{ $labels.instance }} cannot write (storage degraded or NATS disconnected); /readyz says why"}},
		{Alert: "CgledgerArchiveLostHistory", Expr: "max by (instance) (cgledger_archive_lost_entries_total) > 0",
			Labels: map[string]string{"severity": "page"},
			Annotations: map[string]string{"summary": "{{ $labels.instance }}: {{ $value }} ledger entries expired before they were archived",
				"description": "The archive in <data>/archive records them in lost-*.json. See docs/operations.md#alerts."}},
	}
	return RuleFile{Groups: []RuleGroup{
		{Name: "cgledger-slo-recording", Rules: rec},
		{Name: "cgledger-alerts", Rules: alerts},
	}}
}
