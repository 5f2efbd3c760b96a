package projector

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// MaxOverviewCalls bounds the calls one overview examines: each is one
// state read, so an overview of a busy project answers in bounded time and
// says where it stopped (Overview.NextFrom) instead of reading everything.
const MaxOverviewCalls = 10000

// maxOverviewCalls is MaxOverviewCalls, lowered by tests of truncation.
var maxOverviewCalls = MaxOverviewCalls

// DefaultOverviewBuckets and MaxOverviewBuckets bound the overview's time
// buckets (its memory is buckets x (statuses + tools)).
const (
	DefaultOverviewBuckets = 48
	MaxOverviewBuckets     = 200
)

// Overview is the body of GET /v1/projects/{project}/overview: the calls
// dispatched in a window (by dispatch time, as of the query) counted per
// status and per tool in time buckets, each tool's dispatch-to-report
// durations, and the rejections and duplicates recorded on those calls.
type Overview struct {
	AsOfSeq   uint64 `json:"as_of_seq"`
	ProjectID string `json:"project_id"`
	// From and To are the window the buckets cover: the query's from and
	// to, or, when absent, the first and last examined call's dispatch
	// time. Both are absent when no call was examined.
	From *time.Time `json:"from,omitempty"`
	To   *time.Time `json:"to,omitempty"`
	// Calls is the number of calls examined (at most MaxOverviewCalls).
	Calls int `json:"calls"`
	// Truncated is true when the window holds more calls than one overview
	// examines; NextFrom is then the dispatch time of the first call left
	// out: ask again with from=NextFrom for the rest.
	Truncated bool       `json:"truncated"`
	NextFrom  *time.Time `json:"next_from,omitempty"`
	// BucketMS is the width of each bucket in milliseconds (at least 1).
	BucketMS int64            `json:"bucket_ms"`
	Buckets  []OverviewBucket `json:"buckets"`
	// ByStatus counts the examined calls per status: the result status
	// (success, failed, ...) of a reported call, else its lifecycle state
	// (awaiting_approval, dispatched, ...).
	ByStatus map[string]int `json:"by_status"`
	// Tools is one row per tool, by name.
	Tools []OverviewTool `json:"tools"`
	// Rejections is the sum of the examined calls' rejection counts;
	// RejectionsByCode counts the examined calls with at least one
	// rejection by the code of their latest (last_rejection).
	Rejections       int            `json:"rejections"`
	RejectionsByCode map[string]int `json:"rejections_by_code"`
	Duplicates       int            `json:"duplicates"`
}

// OverviewBucket is one time bucket: the calls dispatched in [Start,
// Start+bucket_ms).
type OverviewBucket struct {
	Start    time.Time      `json:"start"`
	Calls    int            `json:"calls"`
	ByStatus map[string]int `json:"by_status"`
	ByTool   map[string]int `json:"by_tool"`
}

// OverviewTool is a tool's row of an overview. The durations are from
// dispatch to report (dispatched_at to reported_at) of its reported calls,
// in milliseconds, by nearest rank; absent when none was reported.
type OverviewTool struct {
	ToolName   string         `json:"tool_name"`
	Calls      int            `json:"calls"`
	Reported   int            `json:"reported"`
	ByStatus   map[string]int `json:"by_status"`
	P50MS      *float64       `json:"p50_ms,omitempty"`
	P95MS      *float64       `json:"p95_ms,omitempty"`
	MaxMS      *float64       `json:"max_ms,omitempty"`
	Rejections int            `json:"rejections"`
}

// OverviewQuery is what an overview covers: dispatch times in [From, To]
// (zero: unbounded), Buckets time buckets (0: DefaultOverviewBuckets).
type OverviewQuery struct {
	From, To time.Time
	Buckets  int
}

// Violations lists every problem of the query's range and buckets.
func (oq OverviewQuery) Violations() protocol.Violations {
	var vs protocol.Violations
	if !oq.From.IsZero() && !oq.To.IsZero() && oq.To.Before(oq.From) {
		vs.Add("to", protocol.VInvalidValue, "must not be before from")
	}
	if oq.Buckets < 0 || oq.Buckets > MaxOverviewBuckets {
		vs.Add("buckets", protocol.VInvalidValue, "must be between 1 and %d (0 or absent means %d), got %d", MaxOverviewBuckets, DefaultOverviewBuckets, oq.Buckets)
	}
	return vs
}

// overviewStatus is what an overview counts a call as.
func overviewStatus(st *CallState) string {
	if st.Status != "" {
		return st.Status
	}
	return st.State
}

// Overview answers a project's overview. It walks the project's index of
// calls by dispatch time from oq.From, reading each call's state as of the
// query, and stops after MaxOverviewCalls calls: the cost is that many
// state reads and one duration per reported call in memory.
func (q *Queries) Overview(project string, oq OverviewQuery, at AsOf) (*Overview, error) {
	var vs protocol.Violations
	if !protocol.ValidIdentifier(project) {
		vs.Add("project_id", protocol.VInvalidToken, "must be an identifier, got %q", project)
	}
	vs = append(vs, oq.Violations()...)
	if len(vs) > 0 {
		return nil, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid overview query", Violations: vs}
	}
	if oq.Buckets == 0 {
		oq.Buckets = DefaultOverviewBuckets
	}
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()

	// The calls are read first (at most MaxOverviewCalls), then bucketed:
	// the window's ends are known only once read when from or to is absent.
	var states []CallState
	var nextFrom *time.Time
	_, err = q.callsByDispatch(v, project, CallFilter{From: oq.From, To: oq.To}, func(st *CallState) bool {
		if len(states) == maxOverviewCalls {
			t := *st.DispatchedAt
			nextFrom = &t
			return false
		}
		states = append(states, *st)
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("projector: overview: %w", err)
	}
	out := &Overview{AsOfSeq: v.seq, ProjectID: project, Calls: len(states), Truncated: nextFrom != nil, NextFrom: nextFrom,
		Buckets: []OverviewBucket{}, ByStatus: map[string]int{}, Tools: []OverviewTool{}, RejectionsByCode: map[string]int{}}
	from, to := oq.From, oq.To
	if len(states) > 0 {
		if from.IsZero() {
			from = *states[0].DispatchedAt
		}
		if to.IsZero() || nextFrom != nil {
			to = *states[len(states)-1].DispatchedAt
		}
	}
	if from.IsZero() || to.IsZero() {
		out.BucketMS = 1
		return out, nil
	}
	out.From, out.To = &from, &to
	span := to.Sub(from) + time.Nanosecond
	width := (span + time.Duration(oq.Buckets) - 1) / time.Duration(oq.Buckets)
	width = ((width + time.Millisecond - 1) / time.Millisecond) * time.Millisecond
	out.BucketMS = int64(width / time.Millisecond)
	n := int((span + width - 1) / width)
	for i := range n {
		out.Buckets = append(out.Buckets, OverviewBucket{Start: from.Add(time.Duration(i) * width), ByStatus: map[string]int{}, ByTool: map[string]int{}})
	}
	tools := map[string]*OverviewTool{}
	durations := map[string][]float64{}
	for i := range states {
		st := &states[i]
		status := overviewStatus(st)
		tool := st.ToolName
		b := &out.Buckets[min(int(st.DispatchedAt.Sub(from)/width), n-1)]
		b.Calls++
		b.ByStatus[status]++
		b.ByTool[tool]++
		out.ByStatus[status]++
		out.Rejections += st.Rejections
		out.Duplicates += st.Duplicates
		if st.LastRejection != "" {
			out.RejectionsByCode[st.LastRejection]++
		}
		t := tools[tool]
		if t == nil {
			t = &OverviewTool{ToolName: tool, ByStatus: map[string]int{}}
			tools[tool] = t
		}
		t.Calls++
		t.ByStatus[status]++
		t.Rejections += st.Rejections
		if st.ReportedAt != nil {
			t.Reported++
			durations[tool] = append(durations[tool], float64(st.ReportedAt.Sub(*st.DispatchedAt))/float64(time.Millisecond))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(tools)) {
		t := tools[name]
		if d := durations[name]; len(d) > 0 {
			sort.Float64s(d)
			t.P50MS, t.P95MS, t.MaxMS = nearestRank(d, 50), nearestRank(d, 95), &d[len(d)-1]
		}
		out.Tools = append(out.Tools, *t)
	}
	return out, nil
}

// nearestRank is the p-th percentile of sorted d by nearest rank.
func nearestRank(d []float64, p int) *float64 {
	i := (p*len(d) + 99) / 100
	v := d[max(i, 1)-1]
	return &v
}

// callsByDispatch walks the project's calls in dispatch-time order within
// f.From and f.To (the all-calls index; other fields of f are ignored),
// calling fn with each call's state as of v until it returns false.
func (q *Queries) callsByDispatch(v *view, project string, f CallFilter, fn func(st *CallState) bool) (int, error) {
	idx := key(tagIndex, project, dimAll)
	p := idx.prefix()
	var lower, toKey []byte
	if !f.From.IsZero() {
		lower = slices.Clip(idx).t(f.From)
	}
	if !f.To.IsZero() {
		toKey = slices.Clip(idx).t(f.To.Add(time.Nanosecond))
	}
	examined := 0
	err := scan(v.snap, p, lower, func(k, _ []byte) (bool, error) {
		if toKey != nil && bytes.Compare(k, toKey) >= 0 {
			return false, nil
		}
		rest := k[len(p):]
		if len(rest) < 8+1+8+1 {
			return false, fmt.Errorf("malformed index key %q", k)
		}
		if trailingU64(rest[:17]) > v.seq {
			return true, nil
		}
		parts := splitTurnCall(rest[18:])
		if parts == nil {
			return false, fmt.Errorf("malformed index key %q", k)
		}
		st, err := loadState(v.snap, project, parts[0], parts[1], v.seq)
		if err != nil || st == nil || st.DispatchedAt == nil {
			return err == nil, err
		}
		examined++
		return fn(st), nil
	})
	return examined, err
}

func splitTurnCall(b []byte) []string {
	for i, c := range b {
		if c == 0 {
			return []string{string(b[:i]), string(b[i+1:])}
		}
	}
	return nil
}
