package executor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/protocol"
)

type metrics struct {
	calls       *prometheus.CounterVec
	attempts    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	inFlight    *prometheus.GaugeVec
	deadlines   *prometheus.CounterVec
	redelivered *prometheus.CounterVec
	rejected    *prometheus.CounterVec
	retries     prometheus.Counter
	intents     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_executor_calls_total",
			Help: "Tool calls resolved by this executor, by tool, final L0 status, error class (taxonomy class, \"none\" on success) and tool_version (the version of the definition the call pinned; empty when it has none, \"_other\" for one not registered).",
		}, []string{"tool", "status", "error_class", "tool_version"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_executor_attempts_total",
			Help: "Tool attempts run (first tries and retries), by tool.",
		}, []string{"tool"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cgledger_executor_call_duration_seconds",
			Help:    "Time from picking up a command to its report, by tool.",
			Buckets: toollabels.LatencyBuckets,
		}, []string{"tool"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cgledger_executor_in_flight_calls",
			Help: "Calls currently running, by tool.",
		}, []string{"tool"}),
		deadlines: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_executor_deadline_expiries_total",
			Help: "Calls that reached their deadline and resolved as timeout, by tool.",
		}, []string{"tool"}),
		intents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_executor_side_effect_attempts_total",
			Help: "Attempts of side_effectful tools, by tool and what became of the attempt record: started (recorded, then run), reconciled (an open attempt found done), not_done (an open attempt found not done), outcome_unknown (an open attempt nothing could resolve: failed with S-TOOL-OUTCOME-UNKNOWN).",
		}, []string{"tool", "outcome"}),
		redelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_executor_redeliveries_total",
			Help: "Commands delivered more than once (after a crash, a nak or an ack timeout), by implementation.",
		}, []string{"impl"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_executor_commands_rejected_total",
			Help: "Commands answered with a rejection entry instead of a report, by reason.",
		}, []string{"reason"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_executor_transient_failures_total",
			Help: "Commands handed back for redelivery because a ledger read or write failed (a full or read-only disk, a lost leader); a rising rate means calls are waiting on storage.",
		}),
	}
	// A command that does not follow the protocol is rejected bad_request:
	// its series exists from the start, so the first one counts in
	// increase() and the dashboard's panel has data.
	m.rejected.WithLabelValues(string(protocol.CodeBadRequest))
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.calls, m.attempts, m.duration, m.inFlight, m.deadlines, m.redelivered, m.rejected, m.retries, m.intents} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
