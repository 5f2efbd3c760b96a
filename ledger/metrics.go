package ledger

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the ledger's Prometheus series. They live on a registry passed
// in by the caller, never the global one, so tests and embedders stay isolated.
type metrics struct {
	appends        *prometheus.CounterVec
	appendLatency  *prometheus.HistogramVec
	rejections     *prometheus.CounterVec
	duplicates     prometheus.Counter
	writesRefused  prometheus.Counter
	staleEpochs    prometheus.Counter
	conflicts      prometheus.Counter
	wakeups        prometheus.Counter
	wakeupsSkipped prometheus.Counter
	reports        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
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
		staleEpochs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_ledger_stale_epochs_total",
			Help: "Reports refused because turn_epoch was not the call's dispatch epoch.",
		}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_ledger_conflicts_total",
			Help: "Reports, dispatches or card puts refused because a different value already exists.",
		}),
		wakeups: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_ledger_wakeups_total",
			Help: "Wakeups published on cmd.agent.<worker_target>.wakeup (JetStream-deduplicated retries excluded).",
		}),
		wakeupsSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_ledger_wakeups_skipped_total",
			Help: "Accepted reports whose agent had no roster entry, so no wakeup could be routed.",
		}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_ledger_reports_accepted_total",
			Help: "Reports appended to the ledger (exactly one per call), by status.",
		}, []string{"status"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.appends, m.appendLatency, m.rejections, m.writesRefused, m.duplicates, m.staleEpochs, m.conflicts, m.wakeups, m.wakeupsSkipped, m.reports} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
