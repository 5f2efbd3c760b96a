package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/violationtest"
)

func noServe(context.Context, ServeOptions, func(Server)) error { return nil }

func TestConfigValidate(t *testing.T) {
	require.NoError(t, Config{Serve: noServe}.Validate(), "zero values are the defaults")
	err := Config{Duration: -1, Rounds: -1, InFlight: []int{1, 0, MaxInFlight + 1}, Rebuild: -1, Workloads: []string{"echo", "nope", ""}}.Validate()
	require.Equal(t, []string{"Duration", "Rounds", "InFlight[1]", "InFlight[2]", "Rebuild", "Workloads[1]", "Workloads[2]", "Serve"}, violationtest.ConfigFields(t, err))
}

func TestRunRefusesAnInvalidConfig(t *testing.T) {
	_, err := Run(context.Background(), Config{Rounds: -1, Serve: noServe})
	require.Equal(t, []string{"Rounds"}, violationtest.ConfigFields(t, err))
}

func TestDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	require.Equal(t, "2s", c.Duration.String())
	require.Equal(t, 3, c.Rounds)
	require.Equal(t, []int{1, 16, 256}, c.InFlight)
	require.NotNil(t, c.Progress)
	require.Equal(t, Workloads, c.Workloads, "every workload")
}

func TestMedianAndRatios(t *testing.T) {
	cg := []Result{{Calls: 10, PerSecond: 100, P99Ms: 4, Errors: 1}, {Calls: 20, PerSecond: 300, P99Ms: 2}, {Calls: 30, PerSecond: 200, P99Ms: 6}}
	rw := []Result{{Calls: 5, PerSecond: 400, P99Ms: 1, ResultsInFlight: 3}, {Calls: 5, PerSecond: 800, P99Ms: 2, ResultsInFlight: 7}, {Calls: 5, PerSecond: 1000, P99Ms: 3}}
	r := row("e2e echo", 16, cg, rw)
	require.Equal(t, 60, r.CgLedger.Calls, "calls add up over the rounds")
	require.Equal(t, 1, r.CgLedger.Errors)
	require.Equal(t, 200.0, r.CgLedger.PerSecond, "the median")
	require.Equal(t, 7, r.Raw.ResultsInFlight, "the most over the rounds")
	require.InDelta(t, 0.25, r.Ratio, 1e-12)
	require.InDelta(t, 2.0, r.P99Ratio, 1e-12)
	require.Nil(t, r.Limit)
	r.CgLedger.CPUMicros = 600
	r = withLimit(r, []Result{{PerSecond: 400, P99Ms: 8, CPUMicros: 200}})
	require.NotNil(t, r.Limit)
	require.InDelta(t, 0.5, r.LimitRatio, 1e-12)
	require.InDelta(t, 0.5, r.LimitP99Ratio, 1e-12)
	require.InDelta(t, 3.0, r.LimitCPURatio, 1e-12)
	// A zero baseline leaves the ratio out rather than dividing by it.
	require.Zero(t, row("x", 1, cg, []Result{{}}).Ratio)
}

func TestWriteText(t *testing.T) {
	r := Report{Duration: "2s", Rounds: 3, Rows: []Row{
		withLimit(row("e2e echo", 16, []Result{{PerSecond: 1000, P50Ms: 1, P99Ms: 2, CPUMicros: 300, LedgerMsgs: 9, CommitsPer: 0.5}}, []Result{{PerSecond: 4000, P50Ms: 0.5, P99Ms: 1, CPUMicros: 50}}), []Result{{PerSecond: 2000, P99Ms: 1, CPUMicros: 100}}),
		row("report", 16, []Result{{PerSecond: 10}}, []Result{{PerSecond: 20}}),
	}}
	var b bytes.Buffer
	require.NoError(t, r.WriteText(&b))
	lines := strings.Split(b.String(), "\n")
	require.Equal(t, `cgledger bench: 3 rounds of 2s, sync_always=false retention="" (medians; raw = the workload's raw baseline, limit = the protocol's own limit;`, lines[0])
	require.Equal(t, "workload         flight |       cg/s   p50 ms   p99 ms    cpu us    msgs commits |      raw/s   p50 ms   p99 ms    cpu us |    limit/s   p50 ms   p99 ms    cpu us |   ratio   p99 x ratio lim p99 x lim cpu x lim", lines[4])
	require.Equal(t, "e2e echo             16 |       1000     1.00     2.00       300     9.0    0.50 |       4000     0.50     1.00        50 |       2000     0.00     1.00       100 |   0.250     2.0     0.500       2.0       3.0", lines[5])
	require.Equal(t, "report               16 |         10     0.00     0.00         0     0.0    0.00 |         20     0.00     0.00         0 |          -        -        -         - |   0.500     0.0         -         -         -", lines[6])
}

func TestFloorCopiesAnEntryForAnotherCall(t *testing.T) {
	read := nats.Header{"CG-Tool-Call-Id": {"call-7"}, "Nats-Msg-Id": {"report.bench.turn-0.call-7"}, "CG-Time": {"2026-11-27T01:45:08Z"},
		"Nats-Expected-Last-Subject-Sequence-Subject": {"cg.v1.bench.pause.bext"},
		"Nats-Stream": {"CG_LEDGER"}, "Nats-Sequence": {"8"}, "Nats-Subject": {"cg.v1.x"}, "Nats-Time-Stamp": {"t"}}
	tmpl := &nats.Msg{Header: storedHeaders(read), Data: []byte(`{"tool_call_id":"call-7"}`)}
	require.Equal(t, nats.Header{"CG-Tool-Call-Id": {"call-7"}, "Nats-Msg-Id": {"report.bench.turn-0.call-7"}, "CG-Time": {"2026-11-27T01:45:08Z"},
		"Nats-Expected-Last-Subject-Sequence-Subject": {"floor.pause"}}, tmpl.Header, "as stored, the pause check on the floor's stream")
	f := &floorWorkload{t: floorTemplates{id: "call-7"}}
	m := f.withID(tmpl, "floor.rep.call-12", "call-12")
	require.Equal(t, "floor.rep.call-12", m.Subject)
	require.Equal(t, "call-12", m.Header.Get("CG-Tool-Call-Id"))
	require.Equal(t, "report.bench.turn-0.call-12", m.Header.Get("Nats-Msg-Id"), "a message id of its own, or the stream drops it as a duplicate")
	require.Equal(t, "2026-11-27T01:45:08Z", m.Header.Get("CG-Time"))
	require.Equal(t, "call-7", tmpl.Header.Get("CG-Tool-Call-Id"), "the template is unchanged")
	require.Equal(t, tmpl.Data, m.Data)
}

func TestWriteTextFloors(t *testing.T) {
	rb := withFloor(row("rebuild 10 entries", 0, []Result{{PerSecond: 800, P50Ms: 12, CPUMicros: 40}}, []Result{{PerSecond: 4000, P50Ms: 2.5, CPUMicros: 6}}),
		[]Result{{PerSecond: 900, P50Ms: 11, CPUMicros: 30}, {PerSecond: 1000, P50Ms: 10, CPUMicros: 31}, {PerSecond: 1100, P50Ms: 9, CPUMicros: 32}})
	require.InDelta(t, 0.8, rb.FloorRatio, 1e-12, "against the floors' median")
	r := Report{Rounds: 3, Rows: []Row{rb}}
	var b bytes.Buffer
	require.NoError(t, r.WriteText(&b))
	lines := strings.Split(b.String(), "\n")
	require.Equal(t, "workload                 |       cg/s    p50 ms  cpu us |      raw/s    p50 ms  cpu us |    floor/s    p50 ms  cpu us |   x raw x floor", lines[3])
	require.Equal(t, "rebuild 10 entries       |        800        12   40.00 |       4000         2    6.00 |       1000        10   31.00 |   0.200   0.800", lines[4])
	j, err := json.Marshal(r)
	require.NoError(t, err)
	require.Contains(t, string(j), `"floor":{"calls":0,"per_second":1000,`)
	require.Contains(t, string(j), `"ratio_floor":0.8`)
}
