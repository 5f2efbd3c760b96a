package projector

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ApprovalsCollector exports the views' undecided approvals per tool label:
// cgledger_approvals_pending and cgledger_approvals_oldest_pending_age_seconds
// (docs/approvals.md#metrics). Like WaitingCollector they come from the
// views, so every serve replica that runs the projector role reports the
// same numbers, across restarts; each scrape older than CacheFor reads the
// apt rows once (Store.PendingApprovals).
type ApprovalsCollector struct {
	store *Store
	cfg   WaitingConfig

	pending, oldest *prometheus.Desc

	mu     sync.Mutex
	at     time.Time
	cached []prometheus.Metric
}

// NewApprovalsCollector returns the collector of store's undecided
// approvals. cfg is the waiting-call gauges' (its Grace is not used):
// Label bounds the tool label values, Known are emitted at 0, Ready gates
// every gauge while the views catch up.
func NewApprovalsCollector(store *Store, cfg WaitingConfig) *ApprovalsCollector {
	cfg = cfg.withDefaults()
	tool := []string{"tool"}
	return &ApprovalsCollector{
		store: store, cfg: cfg,
		pending: prometheus.NewDesc("cgledger_approvals_pending",
			"Calls of the tool held for approval with no decision yet, as the views have applied the ledger.", tool, nil),
		oldest: prometheus.NewDesc("cgledger_approvals_oldest_pending_age_seconds",
			"Now minus the held time of the tool's oldest call waiting for a decision (0 when none waits).", tool, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ApprovalsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.oldest
}

// Collect implements prometheus.Collector.
func (c *ApprovalsCollector) Collect(ch chan<- prometheus.Metric) {
	if c.cfg.Ready != nil && !c.cfg.Ready() {
		return
	}
	for _, m := range c.metrics() {
		ch <- m
	}
}

// metrics answers from the cache while it is fresh; concurrent scrapes
// wait for one computation.
func (c *ApprovalsCollector) metrics() []prometheus.Metric {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	if c.cached != nil && now.Sub(c.at) < c.cfg.CacheFor && !now.Before(c.at) {
		return c.cached
	}
	byName, err := c.store.PendingApprovals()
	if err != nil {
		c.cfg.Logger.Warn("approval gauges", "err", err)
		c.cached = nil
		return nil
	}
	byLabel := map[string]PendingApprovals{}
	if c.cfg.Known != nil {
		for _, l := range c.cfg.Known() {
			byLabel[l] = PendingApprovals{}
		}
	}
	for tool, p := range byName {
		l := c.cfg.Label(tool.Name, tool.Registered)
		agg := byLabel[l]
		if agg.Pending == 0 || p.OldestHeld.Before(agg.OldestHeld) {
			agg.OldestHeld = p.OldestHeld
		}
		agg.Pending += p.Pending
		byLabel[l] = agg
	}
	out := make([]prometheus.Metric, 0, 2*len(byLabel))
	for l, p := range byLabel {
		var age float64
		if p.Pending > 0 {
			age = max(0, now.Sub(p.OldestHeld).Seconds())
		}
		out = append(out,
			prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(p.Pending), l),
			prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age, l))
	}
	c.cached, c.at = out, now
	return out
}

// withDefaults fills a WaitingConfig's zero fields.
func (cfg WaitingConfig) withDefaults() WaitingConfig {
	if cfg.CacheFor <= 0 {
		cfg.CacheFor = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Label == nil {
		cfg.Label = func(s string, _ bool) string { return s }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}
