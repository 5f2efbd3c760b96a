package projector

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// WaitingConfig configures the collector of the waiting-call gauges.
type WaitingConfig struct {
	// Label maps a tool name to its label value, given whether the name
	// was registered in the call's own project when the ledger pinned the
	// call's tool (CallTool). Serve passes toollabels.Labels.CallLabel: a
	// name registered only in another project, or made up by a worker,
	// becomes "_other" unless it is built in, so it never becomes a series
	// and never counts as another project's tool. Nil keeps names as they
	// are.
	Label func(name string, registered bool) string
	// Known lists the tool labels emitted even when none of their calls
	// waits (as 0), so a query has data before a tool's first call. Nil
	// emits only tools with waiting calls.
	Known func() []string
	// Ready, when set, gates the gauges: while it is false (the views are
	// being rebuilt or caught up at start, or the projector is stopped)
	// none is emitted, since views behind the ledger hold calls that are
	// reported in entries not applied yet and would count them overdue.
	Ready func() bool
	// Grace is how long past its deadline a waiting call counts as
	// overdue: serve passes the ledger's deadline grace, the time the
	// deadline keeper waits before it ends a call, so a tool with
	// calls timing out steadily shows none overdue while the keeper keeps
	// up. Zero counts a call overdue from its deadline.
	Grace time.Duration
	// CacheFor is how long one computation answers scrapes (several
	// Prometheus servers scrape every replica). Zero means a second.
	CacheFor time.Duration
	// Logger receives the errors of a computation (its scrape then has no
	// waiting-call gauges). Nil discards them.
	Logger *slog.Logger
	// Now is the clock (tests). Nil means time.Now.
	Now func() time.Time
}

// WaitingCollector exports the views' waiting calls per tool label:
// cgledger_tool_calls_waiting, cgledger_tool_oldest_waiting_call_age_seconds
// and cgledger_tool_calls_overdue (docs/operations.md#metrics). They come
// from the views, not from a process's memory, so every serve replica that
// runs the projector role reports the same numbers, across restarts of any
// process. Each scrape older than CacheFor reads the open rows once
// (Store.WaitingCalls).
type WaitingCollector struct {
	store *Store
	cfg   WaitingConfig

	waiting, oldest, overdue *prometheus.Desc

	mu     sync.Mutex
	at     time.Time
	cached []prometheus.Metric
}

// NewWaitingCollector returns the collector of store's waiting calls.
func NewWaitingCollector(store *Store, cfg WaitingConfig) *WaitingCollector {
	cfg = cfg.withDefaults()
	tool := []string{"tool"}
	return &WaitingCollector{
		store: store, cfg: cfg,
		waiting: prometheus.NewDesc("cgledger_tool_calls_waiting",
			"Calls dispatched to the tool and not yet reported, as the views have applied the ledger.", tool, nil),
		oldest: prometheus.NewDesc("cgledger_tool_oldest_waiting_call_age_seconds",
			"Now minus the dispatch time of the tool's oldest waiting call (0 when none waits).", tool, nil),
		overdue: prometheus.NewDesc("cgledger_tool_calls_overdue",
			"Waiting calls of the tool whose deadline_unix_ms plus the ledger's deadline grace has passed: the deadline keeper ends a call then, so a lasting non-zero value means it cannot.", tool, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *WaitingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.waiting
	ch <- c.oldest
	ch <- c.overdue
}

// Collect implements prometheus.Collector.
func (c *WaitingCollector) Collect(ch chan<- prometheus.Metric) {
	if c.cfg.Ready != nil && !c.cfg.Ready() {
		return
	}
	for _, m := range c.metrics() {
		ch <- m
	}
}

// metrics answers from the cache while it is fresh; concurrent scrapes
// wait for one computation.
func (c *WaitingCollector) metrics() []prometheus.Metric {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	if c.cached != nil && now.Sub(c.at) < c.cfg.CacheFor && !now.Before(c.at) {
		return c.cached
	}
	byName, err := c.store.WaitingCalls(now.Add(-c.cfg.Grace))
	if err != nil {
		c.cfg.Logger.Warn("waiting-call gauges", "err", err)
		c.cached = nil
		return nil
	}
	byLabel := map[string]WaitingCalls{}
	if c.cfg.Known != nil {
		for _, l := range c.cfg.Known() {
			byLabel[l] = WaitingCalls{}
		}
	}
	for tool, w := range byName {
		l := c.cfg.Label(tool.Name, tool.Registered)
		agg := byLabel[l]
		if agg.Waiting == 0 || w.OldestDispatch.Before(agg.OldestDispatch) {
			agg.OldestDispatch = w.OldestDispatch
		}
		agg.Waiting += w.Waiting
		agg.Overdue += w.Overdue
		byLabel[l] = agg
	}
	out := make([]prometheus.Metric, 0, 3*len(byLabel))
	for l, w := range byLabel {
		var age float64
		if w.Waiting > 0 {
			age = max(0, now.Sub(w.OldestDispatch).Seconds())
		}
		out = append(out,
			prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(w.Waiting), l),
			prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age, l),
			prometheus.MustNewConstMetric(c.overdue, prometheus.GaugeValue, float64(w.Overdue), l))
	}
	c.cached, c.at = out, now
	return out
}
