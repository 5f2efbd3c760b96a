// Package bench measures what a tool call costs against raw JetStream on
// the same machine, in one run: the full serve stack (started by the
// caller's ServeFunc, with credentials on) in a temporary directory, and a
// load generator in this process speaking the wire protocol. The
// `cgledger bench` verb parses its flags into a Config and calls Run; see
// BENCHMARKS.md for what the figures mean.
package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cgledger/cgledger/protocol"
)

// Workloads are the names Config.Workloads selects from: the e2e calls
// (built-in echo, echo as side_effectful, an external tool service), the
// ledger's message floor (the messages of an e2e external call on raw
// JetStream alone, floor.go), the MCP front door, the report alone and
// duplicate reports.
var Workloads = []string{"echo", "echo_se", "external", "floor", "mcp", "report", "duplicate"}

// MaxInFlight is the largest in-flight level a run accepts.
const MaxInFlight = 4096

// Config is one bench run. Zero values are the defaults, except Serve,
// which is required.
type Config struct {
	// Duration is the length of each measured run; zero means 2s.
	Duration time.Duration
	// Rounds is the number of rounds per in-flight level (medians are
	// reported); zero means 3.
	Rounds int
	// InFlight is the in-flight levels, each from 1 to MaxInFlight; empty
	// means 1, 16 and 256.
	InFlight []int
	// SyncAlways runs the server with every JetStream write fsynced.
	SyncAlways bool
	// Retention is the serve retention setting (e.g. "1h"), passed to Serve
	// as it is and checked there; empty means none.
	Retention string
	// Rebuild, when above zero, measures the views instead of the call
	// workloads: it records this many calls (about five entries each),
	// then times the projector rebuilding its views from the stream
	// against a raw ordered read of it.
	Rebuild int
	// Workloads selects what is measured, by name (Workloads lists them);
	// empty means every workload. The raw round trip and the protocol
	// limit are measured whenever an e2e workload or the floor is selected.
	Workloads []string
	// CPUProfile, when set, is the file a CPU profile of the whole run
	// (server and load generator) is written to.
	CPUProfile string
	// CPUProfileEach, when set, is a directory that receives one CPU
	// profile per measured cgledger run (not the baselines'), named
	// <workload>-<in flight>-<n>.prof; `go tool pprof` merges several.
	CPUProfileEach string
	// MemProfile, when set with Rebuild, is the file a heap profile is
	// written to once the calls are recorded; with Memory, the directory
	// that receives one heap profile per sample, heap-<calls>.prof.
	MemProfile string
	// Memory, when above zero, measures memory instead of the call
	// workloads: it records this many calls at Rate against a serve whose
	// retention holds about Window of them (Window / Rate seconds), samples
	// RSS and the live heap every twentieth of the run and fits the slope
	// past the window (MemoryReport). Retention must then be empty.
	Memory int
	// Window is the calls the retention window holds, with Memory; zero
	// means Memory / 10. Memory must be at least 3 Windows, so that the
	// fit (from 2 Windows on) has samples.
	Window int
	// Rate is the recording pace in calls per second, with Memory; zero
	// means DefaultMemoryRate.
	Rate float64
	// Progress receives the rebuild's progress lines; nil discards them.
	Progress io.Writer
	// Serve runs the stack under test. Required.
	Serve ServeFunc
}

// ServeFunc runs the full serve stack as opts asks until ctx ends, and
// calls ready once it serves. It returns what serve returns.
type ServeFunc func(ctx context.Context, opts ServeOptions, ready func(Server)) error

// ServeOptions is what a run asks of the stack it measures: data in Dir,
// NATS and HTTP on loopback ports of the system's choosing, credentials
// on.
type ServeOptions struct {
	Dir        string
	SyncAlways bool
	Retention  string
}

// Server is where the stack under test serves.
type Server struct {
	// NATS and HTTP are the client URL and the HTTP base URL.
	NATS, HTTP string
	// Embedded is the embedded nats-server, whose account statistics count
	// the ledger's messages; nil leaves that figure out.
	Embedded *server.Server
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass; Run
// calls it.
func (c Config) Validate() error {
	var vs protocol.Violations
	if c.Duration < 0 {
		vs.Add("Duration", protocol.VInvalidValue, "must not be negative (zero means the default), got %v", c.Duration)
	}
	if c.Rounds < 0 {
		vs.Add("Rounds", protocol.VInvalidValue, "must not be negative (zero means the default), got %d", c.Rounds)
	}
	for i, n := range c.InFlight {
		if n < 1 || n > MaxInFlight {
			vs.Add(fmt.Sprintf("InFlight[%d]", i), protocol.VInvalidValue, "must be from 1 to %d, got %d", MaxInFlight, n)
		}
	}
	if c.Rebuild < 0 {
		vs.Add("Rebuild", protocol.VInvalidValue, "must be a number of calls, got %d", c.Rebuild)
	}
	if c.Memory < 0 {
		vs.Add("Memory", protocol.VInvalidValue, "must be a number of calls, got %d", c.Memory)
	}
	if c.Memory > 0 && c.Rebuild > 0 {
		vs.Add("Memory", protocol.VInvalidValue, "measures memory instead of the rebuild: not both")
	}
	if c.Memory > 0 && c.Retention != "" {
		vs.Add("Retention", protocol.VInvalidValue, "is derived from Window and Rate with Memory: leave it empty, got %q", c.Retention)
	}
	if c.Window < 0 || (c.Window > 0 && c.Memory == 0) || (c.Memory > 0 && c.Window > 0 && c.Memory < 3*c.Window) {
		vs.Add("Window", protocol.VInvalidValue, "must be a number of calls with Memory, at most a third of it (got %d of %d)", c.Window, c.Memory)
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) || (c.Rate > 0 && c.Memory == 0) {
		vs.Add("Rate", protocol.VInvalidValue, "must be a number of calls per second with Memory, got %v", c.Rate)
	}
	for i, w := range c.Workloads {
		if !slices.Contains(Workloads, w) {
			vs.Add(fmt.Sprintf("Workloads[%d]", i), protocol.VInvalidValue, "must be one of %s, got %q", strings.Join(Workloads, ", "), w)
		}
	}
	if c.Serve == nil {
		vs.Add("Serve", protocol.VInvalidValue, "is required")
	}
	return protocol.BadRequest("bench config", vs)
}

// withDefaults fills the zero values.
func (c Config) withDefaults() Config {
	if c.Duration == 0 {
		c.Duration = 2 * time.Second
	}
	if c.Rounds == 0 {
		c.Rounds = 3
	}
	if len(c.InFlight) == 0 {
		c.InFlight = []int{1, 16, 256}
	}
	if len(c.Workloads) == 0 {
		c.Workloads = Workloads
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Memory > 0 {
		if c.Window == 0 {
			c.Window = max(c.Memory/10, 1)
		}
		if c.Rate == 0 {
			c.Rate = DefaultMemoryRate
		}
		c.Retention = memoryRetention(c.Window, c.Rate).String()
	}
	return c
}

// Report is a run's settings and its rows. Its JSON is what
// `cgledger bench --json` prints.
type Report struct {
	Duration   string `json:"duration"`
	Retention  string `json:"retention"`
	Rounds     int    `json:"rounds"`
	Rows       []Row  `json:"rows"`
	SyncAlways bool   `json:"sync_always"`
	// Memory is a Config.Memory run's result (then Rows is empty).
	Memory *MemoryReport `json:"memory,omitempty"`
}

// WriteText writes the report as the table `cgledger bench` prints.
func (r Report) WriteText(w io.Writer) error {
	if r.Memory != nil {
		return r.Memory.WriteText(w)
	}
	if slices.ContainsFunc(r.Rows, func(r Row) bool { return r.Floor != nil }) {
		return r.writeFloors(w)
	}
	if _, err := fmt.Fprintf(w, "cgledger bench: %d rounds of %s, sync_always=%v retention=%q (medians; raw = the workload's raw baseline, limit = the protocol's own limit;\nratio = cgledger / raw, p99 x = cgledger p99 / raw p99, ratio lim = cgledger / limit,\np99 x lim / cpu x lim = cgledger p99 / CPU per call against the limit's)\n\n", r.Rounds, r.Duration, r.SyncAlways, r.Retention); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "%-16s %6s | %10s %8s %8s %9s %7s %7s | %10s %8s %8s %9s | %10s %8s %8s %9s | %7s %7s %9s %9s %9s\n",
		"workload", "flight", "cg/s", "p50 ms", "p99 ms", "cpu us", "msgs", "commits", "raw/s", "p50 ms", "p99 ms", "cpu us",
		"limit/s", "p50 ms", "p99 ms", "cpu us", "ratio", "p99 x", "ratio lim", "p99 x lim", "cpu x lim"); err != nil {
		return err
	}
	for _, r := range r.Rows {
		limit, limitRatio := fmt.Sprintf("%10s %8s %8s %9s", "-", "-", "-", "-"), fmt.Sprintf("%9s %9s %9s", "-", "-", "-")
		if r.Limit != nil {
			limit = fmt.Sprintf("%10.0f %8.2f %8.2f %9.0f", r.Limit.PerSecond, r.Limit.P50Ms, r.Limit.P99Ms, r.Limit.CPUMicros)
			limitRatio = fmt.Sprintf("%9.3f %9.1f %9.1f", r.LimitRatio, r.LimitP99Ratio, r.LimitCPURatio)
		}
		if _, err := fmt.Fprintf(w, "%-16s %6d | %10.0f %8.2f %8.2f %9.0f %7.1f %7.2f | %10.0f %8.2f %8.2f %9.0f | %s | %7.3f %7.1f %s\n",
			r.Workload, r.InFlight, r.CgLedger.PerSecond, r.CgLedger.P50Ms, r.CgLedger.P99Ms, r.CgLedger.CPUMicros, r.CgLedger.LedgerMsgs, r.CgLedger.CommitsPer,
			r.Raw.PerSecond, r.Raw.P50Ms, r.Raw.P99Ms, r.Raw.CPUMicros, limit, r.Ratio, r.P99Ratio, limitRatio); err != nil {
			return err
		}
	}
	return nil
}

// Result is one measured run.
type Result struct {
	Calls      int     `json:"calls"`
	PerSecond  float64 `json:"per_second"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	CPUMicros  float64 `json:"cpu_us_per_call"`
	LedgerMsgs float64 `json:"ledger_msgs_per_call,omitempty"`
	CommitsPer float64 `json:"projector_commits_per_call,omitempty"`
	Errors     int     `json:"errors"`
	// ResultsInFlight is, for the raw round trip, the most results its
	// service had published and not yet seen acknowledged at once (the
	// largest over the rounds): above 1, the baseline is pipelined. It can
	// pass the in-flight level: a caller moves on when its result arrives,
	// which can be before the service has seen the result's ack.
	ResultsInFlight int `json:"max_results_in_flight,omitempty"`
}

// Row is the medians of one workload at one in-flight level.
type Row struct {
	Workload string  `json:"workload"`
	InFlight int     `json:"in_flight"`
	CgLedger Result  `json:"cgledger"`
	Raw      Result  `json:"raw"`
	Ratio    float64 `json:"ratio_per_second"`
	P99Ratio float64 `json:"ratio_p99"`
	// Limit is the protocol's own limit, a conformant call on raw
	// JetStream alone, for the workloads that are whole calls.
	Limit         *Result `json:"protocol_limit,omitempty"`
	LimitRatio    float64 `json:"ratio_protocol_limit,omitempty"`
	LimitP99Ratio float64 `json:"ratio_p99_protocol_limit,omitempty"`
	// LimitCPURatio is the CPU per call against the protocol limit's.
	LimitCPURatio float64 `json:"ratio_cpu_protocol_limit,omitempty"`
	// Floor is, for the rows of --rebuild (rebuild, replay), the same work
	// done from entries held in memory, measured in the same run: the
	// projector applying them without NATS for a rebuild; that and storing
	// them raw in a fresh server, side by side, for a replay. FloorRatio is
	// cgledger / floor in entries per second.
	Floor      *Result `json:"floor,omitempty"`
	FloorRatio float64 `json:"ratio_floor,omitempty"`
}

// withFloor adds the floor's medians and the ratio to it.
func withFloor(r Row, floor []Result) Row {
	f := median(floor)
	r.Floor = &f
	if f.PerSecond > 0 {
		r.FloorRatio = r.CgLedger.PerSecond / f.PerSecond
	}
	return r
}

// writeFloors writes the rows of --rebuild: each against the raw ordered
// read of the stream and against its own floor.
func (r Report) writeFloors(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "cgledger bench --rebuild: %d rounds (medians; raw = a raw ordered read of the whole stream, floor = the same work from entries in memory;\nx raw = cg/s / raw/s, x floor = cg/s / floor/s; p50 ms is one whole run; cpu us is process CPU per entry)\n\n", r.Rounds); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "%-24s | %10s %9s %7s | %10s %9s %7s | %10s %9s %7s | %7s %7s\n",
		"workload", "cg/s", "p50 ms", "cpu us", "raw/s", "p50 ms", "cpu us", "floor/s", "p50 ms", "cpu us", "x raw", "x floor"); err != nil {
		return err
	}
	for _, r := range r.Rows {
		floor, ratio := fmt.Sprintf("%10s %9s %7s", "-", "-", "-"), "      -"
		if r.Floor != nil {
			floor = fmt.Sprintf("%10.0f %9.0f %7.2f", r.Floor.PerSecond, r.Floor.P50Ms, r.Floor.CPUMicros)
			ratio = fmt.Sprintf("%7.3f", r.FloorRatio)
		}
		if _, err := fmt.Fprintf(w, "%-24s | %10.0f %9.0f %7.2f | %10.0f %9.0f %7.2f | %s | %7.3f %s\n",
			r.Workload, r.CgLedger.PerSecond, r.CgLedger.P50Ms, r.CgLedger.CPUMicros,
			r.Raw.PerSecond, r.Raw.P50Ms, r.Raw.CPUMicros, floor, r.Ratio, ratio); err != nil {
			return err
		}
	}
	return nil
}
