package ledger

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/protocol"
)

// metrics are the ledger's Prometheus series. They live on a registry passed
// in by the caller, never the global one, so tests and embedders stay isolated.
type metrics struct {
	appends       *prometheus.CounterVec
	appendLatency *prometheus.HistogramVec
	rejections    *prometheus.CounterVec
	duplicates    prometheus.Counter
	writesRefused prometheus.Counter
	dupDispatches prometheus.Counter
	// toolUnavailable counts calls answered S-TOOL-UNAVAILABLE, by tool.
	toolUnavailable *prometheus.CounterVec
	apiRequests     *prometheus.CounterVec
	apiDuration     *prometheus.HistogramVec
	callLatency     *prometheus.HistogramVec
	wakeupLatency   *prometheus.HistogramVec
	wakeups         prometheus.Counter
	wakeupsSkipped  prometheus.Counter
	sweptReports    prometheus.Counter
	reports         *prometheus.CounterVec
	attemptOutcome  *prometheus.CounterVec
	decisions       *prometheus.CounterVec
	timeouts        *prometheus.CounterVec
	lateReports     *prometheus.CounterVec
	// toolCalls counts stored report entries by tool, status and error
	// code: every tool's outcome, whoever served or ended the call.
	toolCalls *prometheus.CounterVec
	// dispatches counts calls whose command entry was stored, by tool.
	dispatches *prometheus.CounterVec
	// approvals counts the decisions of held calls this process stored
	// (one per call), by tool and decision.
	approvals *prometheus.CounterVec
	// operatorActions counts operator actions (docs/operations.md,
	// "Operator actions") by action (the op) and outcome (ok, refused).
	operatorActions *prometheus.CounterVec
	// toolPaused is 1 for a tool this process last saw paused, 0 for one
	// it saw resumed.
	toolPaused *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, labels *toollabels.Labels) (*metrics, error) {
	m := &metrics{
		appends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_ledger_appends_total",
			Help: "Entries appended to the ledger stream, by entry kind.",
		}, []string{"kind"}),
		appendLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cgledger_ledger_append_duration_seconds",
			Help:    "Time from publish to JetStream acknowledgement of a ledger append, by entry kind.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"kind"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_ledger_rejections_total",
			Help: "Requests refused and recorded as rejection entries, by reason (protocol error code) and operation.",
		}, []string{"reason", "op"}),
		writesRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_ledger_writes_refused_total",
			Help: "Writes refused before reaching the server because the data directory's file system is nearly full (serve's write guard); nothing was stored.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_ledger_duplicate_reports_total",
			Help: "Reports answered with the original outcome because the call was already reported.",
		}),
		dupDispatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_ledger_duplicate_dispatches_total",
			Help: "Dispatches answered with the original outcome (duplicate: true) because the call was already dispatched.",
		}),
		toolUnavailable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_ledger_tool_unavailable_total",
			Help: "Calls the ledger answered failed with S-TOOL-UNAVAILABLE at dispatch because no tool service had pulled the tool's commands within its health.fail_fast_after_ms, by tool (bounded as for report latency).",
		}, []string{"tool"}),
		apiRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_api_requests_total",
			Help: "Ledger API requests answered, by operation and outcome: ok, or the protocol error code (internal: not completed, retry).",
		}, []string{"op", "code"}),
		apiDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cgledger_api_request_duration_seconds",
			Help:    "Time from receiving a ledger API request to sending its answer, by operation.",
			Buckets: toollabels.LatencyBuckets,
		}, []string{"op"}),
		callLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cgledger_call_report_latency_seconds",
			Help:    "Time from a call's dispatch to its accepted report, as the agent sees it, by tool (a registered or built-in tool name; any other name as \"_other\") and tool_version (the version of the definition the call pinned at dispatch: empty when it has none, \"_other\" for one this process has not seen registered).",
			Buckets: toollabels.LatencyBuckets,
		}, []string{"tool", "tool_version"}),
		wakeupLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cgledger_call_wakeup_latency_seconds",
			Help:    "Time from an accepted report's append to its wakeup being stored (or recorded as skipped), by tool (bounded as for report latency).",
			Buckets: toollabels.LatencyBuckets,
		}, []string{"tool"}),
		wakeups: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_ledger_wakeups_total",
			Help: "Wakeups published on cmd.agent.<worker_target>.wakeup (JetStream-deduplicated retries excluded).",
		}),
		wakeupsSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_ledger_wakeups_skipped_total",
			Help: "Accepted reports whose agent had no roster entry, so no wakeup could be routed.",
		}),
		sweptReports: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_ledger_reports_swept_total",
			Help: "Stored reports whose writer stopped before their wakeup, finished by the ledger's sweep (at start or on its timer).",
		}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_ledger_reports_accepted_total",
			Help: "Reports appended to the ledger (exactly one per call), by status.",
		}, []string{"status"}),
		attemptOutcome: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_ledger_attempt_outcomes_total",
			Help: "Accepted reports that resolved an attempt of a side_effectful tool left open by a crash, by attempt_outcome: reconciled, or outcome_unknown (failed with S-TOOL-OUTCOME-UNKNOWN, never retried).",
		}, []string{"outcome"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_ledger_two_phase_decisions_total",
			Help: "Decisions stored for prepared calls (exactly one per call), by decision (commit, abort) and decided_by (worker, commit_deadline).",
		}, []string{"decision", "decided_by"}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_ledger_deadline_timeouts_total",
			Help: "Calls the ledger itself ended timeout (R-TIMEOUT-002) because no report was accepted by their deadline, by tool (bounded as for report latency).",
		}, []string{"tool"}),
		lateReports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_ledger_late_reports_total",
			Help: "Reports refused as late (conflict, violation late): their call had reached its deadline and the ledger recorded its timeout, by tool (bounded as for report latency).",
		}, []string{"tool"}),
		toolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_tool_calls_total",
			Help: "Calls' outcomes: report entries this process stored (one per call, whoever reported: a tool service, an executor, the ledger at the deadline or failing fast), by tool (bounded as for report latency), status and error_code (the result card's error.code when it is a recommended code, \"none\" when the card has no error, \"_other\" else).",
		}, []string{"tool", "status", "error_code"}),
		dispatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_tool_dispatches_total",
			Help: "Calls dispatched: command entries this process stored (repeated dispatches excluded), by tool (bounded as for report latency).",
		}, []string{"tool"}),
		toolPaused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cgledger_tool_paused",
			Help: "1 while a tool is paused (its dispatches are held), 0 once resumed, as this process last read its pause subject.",
		}, []string{"tool"}),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_approvals_total",
			Help: "Decisions of calls held for approval: approval entries this process stored (exactly one per call), by tool (bounded as for report latency) and decision (approved, denied, expired, canceled).",
		}, []string{"tool", "decision"}),
		operatorActions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_operator_actions_total",
			Help: "Operator actions this process answered (call.cancel, call.resolve, call.redrive, tool.pause, tool.resume), by action and outcome: ok (recorded, or found recorded) or refused (a rejection entry says why).",
		}, []string{"action", "outcome"}),
	}
	// Every operator action's series exists from the start, at 0, so a
	// rate or an alert on it has a series before the first action.
	for _, o := range protocol.Operations {
		if o.OperatorAction {
			m.operatorActions.WithLabelValues(o.Name, "ok")
			m.operatorActions.WithLabelValues(o.Name, "refused")
		}
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.appends, m.appendLatency, m.rejections, m.writesRefused, m.duplicates, m.dupDispatches, m.apiRequests, m.apiDuration, m.callLatency, m.wakeupLatency, m.wakeups, m.wakeupsSkipped, m.sweptReports, m.reports, m.attemptOutcome, m.decisions, m.approvals, m.operatorActions, m.toolPaused,
		everyToolCallOutcome{labels: labels, vec: m.toolCalls},
		everyKnownTool{labels: labels, vecs: []*prometheus.CounterVec{m.toolUnavailable, m.timeouts, m.lateReports, m.dispatches}}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Error code labels of cgledger_tool_calls_total beyond the recommended
// codes (protocol.RecommendedErrorCodes): a result with no error, and any
// code a tool made up (a label of its own would let tools grow the series
// without end).
const (
	NoErrorCodeLabel    = "none"
	OtherErrorCodeLabel = "_other"
)

// ErrorCodeLabel is the error_code label of a result card's error code
// ("" when the card has no error).
func ErrorCodeLabel(code string) string {
	switch {
	case code == "":
		return NoErrorCodeLabel
	case protocol.RecommendedErrorCode(code):
		return code
	}
	return OtherErrorCodeLabel
}

// everyKnownTool collects counters labelled by tool alone with a series for
// every known tool, at 0 until its first event. A series that appears at its
// first event hides that event from increase() and rate(), so an alert on a
// few deadline timeouts would read 0 for the first of them.
type everyKnownTool struct {
	labels *toollabels.Labels
	vecs   []*prometheus.CounterVec
}

// Describe implements prometheus.Collector.
func (c everyKnownTool) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vecs {
		v.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (c everyKnownTool) Collect(ch chan<- prometheus.Metric) {
	names := append(c.labels.Names(), toollabels.Other)
	for _, v := range c.vecs {
		for _, n := range names {
			v.WithLabelValues(n)
		}
		v.Collect(ch)
	}
}
