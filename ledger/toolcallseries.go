package ledger

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/protocol"
)

// ToolCallOutcomes are the (status, error_code) pairs of
// cgledger_tool_calls_total a call can end with: the series the ledger
// creates at 0 for every known tool label (ToolLabels.Names and
// toollabels.Other) before the tool's first call. A series that appears at
// its first value hides that value from rate() and increase(): six
// timeouts in one scrape would read as none, and a tool whose calls all
// fail would have no availability at all. Other pairs (a timeout a tool
// reported with another code, say) still count; they appear at their first
// value.
var ToolCallOutcomes = [][2]string{
	{protocol.StatusSuccess, NoErrorCodeLabel},
	{protocol.StatusPartial, NoErrorCodeLabel},
	{protocol.StatusFailed, protocol.ErrorCodeBadRequest},
	{protocol.StatusFailed, protocol.ErrorCodeAuthFailed},
	{protocol.StatusFailed, protocol.ErrorCodeUpstreamUnavailable},
	{protocol.StatusFailed, protocol.ErrorCodeInternal},
	{protocol.StatusFailed, protocol.ErrorCodeToolTimeout},
	{protocol.StatusFailed, OtherErrorCodeLabel},
	{protocol.StatusTimeout, protocol.ErrorCodeToolTimeout},
	{protocol.StatusCanceled, protocol.ErrorCodeCanceled},
}

// everyToolCallOutcome collects cgledger_tool_calls_total with a series
// at 0 for every known tool label and ToolCallOutcomes pair, the way
// everyKnownTool does for the counters labelled by tool alone.
type everyToolCallOutcome struct {
	labels *toollabels.Labels
	vec    *prometheus.CounterVec
}

// Describe implements prometheus.Collector.
func (c everyToolCallOutcome) Describe(ch chan<- *prometheus.Desc) { c.vec.Describe(ch) }

// Collect implements prometheus.Collector.
func (c everyToolCallOutcome) Collect(ch chan<- prometheus.Metric) {
	for _, n := range append(c.labels.Names(), toollabels.Other) {
		for _, o := range ToolCallOutcomes {
			c.vec.WithLabelValues(n, o[0], o[1])
		}
	}
	c.vec.Collect(ch)
}
