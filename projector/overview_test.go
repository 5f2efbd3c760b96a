package projector_test

import (
	"net/http/httptest"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/projector"
)

// TestHTTPOverview checks the overview against the calls listing it
// summarizes: the same calls counted per status and tool, in buckets that
// add up, each tool's percentiles of dispatch-to-report durations, the
// rejections and duplicates on the calls; as of an earlier sequence; cut at
// the bound with where to continue; and a bad query with every violation.
func TestHTTPOverview(t *testing.T) {
	_, _, q := scenarioViews(t)
	srv := httptest.NewServer(httpapi.Audit(q, httpapi.AuditConfig{}))
	t.Cleanup(srv.Close)
	base := srv.URL + "/v1/projects/proj"

	var calls projector.Page[projector.CallState]
	require.Equal(t, 200, getJSON(t, base+"/calls?limit=1000", &calls))
	require.Empty(t, calls.NextCursor)
	var dispatched []projector.CallState
	for _, c := range calls.Items {
		if c.DispatchedAt != nil {
			dispatched = append(dispatched, c)
		}
	}
	require.NotEmpty(t, dispatched)

	var ov projector.Overview
	require.Equal(t, 200, getJSON(t, base+"/overview?buckets=7", &ov))
	require.Equal(t, calls.AsOfSeq, ov.AsOfSeq)
	require.Equal(t, len(dispatched), ov.Calls)
	require.False(t, ov.Truncated)
	require.Nil(t, ov.NextFrom)
	require.Equal(t, *dispatched[0].DispatchedAt, *ov.From)
	require.Equal(t, *dispatched[len(dispatched)-1].DispatchedAt, *ov.To)
	require.LessOrEqual(t, len(ov.Buckets), 7)
	require.GreaterOrEqual(t, ov.BucketMS, int64(1))

	status := func(c projector.CallState) string {
		if c.Status != "" {
			return c.Status
		}
		return c.State
	}
	byStatus := map[string]int{}
	type tool struct {
		calls, reported, rejections int
		ms                          []float64
	}
	tools := map[string]*tool{}
	rejections, duplicates := 0, 0
	byCode := map[string]int{}
	for _, c := range dispatched {
		byStatus[status(c)]++
		tl := tools[c.ToolName]
		if tl == nil {
			tl = &tool{}
			tools[c.ToolName] = tl
		}
		tl.calls++
		tl.rejections += c.Rejections
		if c.ReportedAt != nil {
			tl.reported++
			tl.ms = append(tl.ms, float64(c.ReportedAt.Sub(*c.DispatchedAt))/float64(time.Millisecond))
		}
		rejections += c.Rejections
		duplicates += c.Duplicates
		if c.LastRejection != "" {
			byCode[c.LastRejection]++
		}
	}
	require.Equal(t, byStatus, ov.ByStatus)
	require.Equal(t, rejections, ov.Rejections)
	require.Positive(t, ov.Rejections, "the scenario has rejections on dispatched calls")
	require.Equal(t, byCode, ov.RejectionsByCode)
	require.Equal(t, duplicates, ov.Duplicates)
	require.Len(t, ov.Tools, len(tools))
	for i, row := range ov.Tools {
		if i > 0 {
			require.Less(t, ov.Tools[i-1].ToolName, row.ToolName, "tools by name")
		}
		want := tools[row.ToolName]
		require.NotNil(t, want, row.ToolName)
		require.Equal(t, want.calls, row.Calls, row.ToolName)
		require.Equal(t, want.reported, row.Reported, row.ToolName)
		require.Equal(t, want.rejections, row.Rejections, row.ToolName)
		if len(want.ms) == 0 {
			require.Nil(t, row.P50MS, row.ToolName)
			continue
		}
		sort.Float64s(want.ms)
		rank := func(p int) float64 { return want.ms[(p*len(want.ms)+99)/100-1] }
		require.InDelta(t, rank(50), *row.P50MS, 1e-9, row.ToolName)
		require.InDelta(t, rank(95), *row.P95MS, 1e-9, row.ToolName)
		require.InDelta(t, want.ms[len(want.ms)-1], *row.MaxMS, 1e-9, row.ToolName)
	}
	sum, perTool := 0, map[string]int{}
	for i, b := range ov.Buckets {
		sum += b.Calls
		n := 0
		for _, c := range b.ByStatus {
			n += c
		}
		require.Equal(t, b.Calls, n, "bucket %d by status", i)
		for k, c := range b.ByTool {
			perTool[k] += c
		}
		require.Equal(t, ov.From.Add(time.Duration(i)*time.Duration(ov.BucketMS)*time.Millisecond), b.Start)
	}
	require.Equal(t, ov.Calls, sum)
	for name, tl := range tools {
		require.Equal(t, tl.calls, perTool[name], name)
	}

	// As of the first call's dispatch: only the calls dispatched by then.
	var early projector.Overview
	require.Equal(t, 200, getJSON(t, base+"/overview?as_of_seq="+itoa(dispatched[0].DispatchedSeq), &early))
	require.Equal(t, dispatched[0].DispatchedSeq, early.AsOfSeq)
	require.Equal(t, 1, early.Calls)

	// A window: only the calls dispatched in it.
	var window projector.Overview
	from := dispatched[1].DispatchedAt.Format(time.RFC3339Nano)
	require.Equal(t, 200, getJSON(t, base+"/overview?from="+from, &window))
	require.Equal(t, len(dispatched)-1, window.Calls)

	// Cut at the bound: where the rest starts.
	restore := projector.SetMaxOverviewCalls(2)
	var cut projector.Overview
	require.Equal(t, 200, getJSON(t, base+"/overview", &cut))
	restore()
	require.Equal(t, 2, cut.Calls)
	require.True(t, cut.Truncated)
	require.Equal(t, *dispatched[2].DispatchedAt, *cut.NextFrom)

	// Every problem of the query at once.
	var eb errBody
	require.Equal(t, 400, getJSON(t, base+"/overview?buckets=abc&from=2026-11-22T10:00:00Z&to=2026-11-21T10:00:00Z&as_of_seq=x", &eb))
	var fields []string
	for _, v := range eb.Error.Violations {
		fields = append(fields, v.Field+":"+v.Code)
	}
	require.ElementsMatch(t, []string{"as_of_seq:invalid_value", "buckets:invalid_value", "to:invalid_value"}, fields)
	require.Equal(t, 400, getJSON(t, base+"/overview?buckets=201", &eb))
	require.Equal(t, "buckets", eb.Error.Violations[0].Field)
	var empty projector.Overview
	require.Equal(t, 200, getJSON(t, srv.URL+"/v1/projects/nobody/overview", &empty))
	require.Zero(t, empty.Calls)
	require.Empty(t, empty.Buckets)
}
