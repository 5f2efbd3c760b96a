package projector

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	applied   prometheus.Counter
	appliedTo prometheus.Gauge
	commit    prometheus.Histogram
	errors    *prometheus.CounterVec
	stalled   prometheus.Gauge

	unrecognized prometheus.Counter
	skipped      prometheus.Counter

	apiRequests *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		applied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_projector_entries_applied_total",
			Help: "Ledger entries applied to the views (its rate is the apply rate).",
		}),
		appliedTo: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cgledger_projector_applied_sequence",
			Help: "Last ledger sequence applied to the views.",
		}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cgledger_projector_batch_commit_duration_seconds",
			Help:    "Time to commit one batch of applied entries and the checkpoint to Pebble.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_projector_errors_total",
			Help: "Projector errors by reason: gap and corrupt stop the projector; nats errors are retried.",
		}, []string{"reason"}),
		stalled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cgledger_projector_stalled",
			Help: "1 while the projector is stopped on a gap or a corrupt entry, else 0.",
		}),
		unrecognized: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_projector_unrecognized_entries_total",
			Help: "Stream messages recorded as unrecognized (not ledger entries) since the process started, counting re-applies after a rebuild.",
		}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cgledger_projector_skipped_entries_total",
			Help: "Entries recorded as skipped because a skip entry named them, since the process started, counting re-applies after a rebuild.",
		}),
		apiRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cgledger_projector_api_requests_total",
			Help: "API requests the views answered (inbox.list), by op and code: ok, stale (answered while the views lagged the ledger past the wait), or the protocol error code.",
		}, []string{"op", "code"}),
	}
	// Every reason has a series from the start, at 0: a series that
	// appears at its first error hides that error from increase(), and an
	// absent family reads on a dashboard as a metric that does not exist.
	for _, reason := range []string{"nats", "store", "gap", "corrupt"} {
		m.errors.WithLabelValues(reason)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.applied, m.appliedTo, m.commit, m.errors, m.stalled, m.unrecognized, m.skipped, m.apiRequests} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
