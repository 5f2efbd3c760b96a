package executor_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

const helperEnv = "CGLEDGER_EXECUTOR_HELPER_URL"

// TestHelperExecutorProcess is not a test: it is the executor process the
// crash test starts and kills with SIGKILL.
func TestHelperExecutorProcess(t *testing.T) {
	url := os.Getenv(helperEnv)
	if url == "" {
		return
	}
	maxDeliver, _ := strconv.Atoi(os.Getenv("CGLEDGER_EXECUTOR_HELPER_MAXDELIVER"))
	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Println("connect failed:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	l, err := ledger.Open(ctx, nc, ledger.Config{})
	if err != nil {
		fmt.Println("open ledger failed:", err)
		os.Exit(2)
	}
	ex, err := executor.New(l, nc, executor.Config{AckWait: time.Second, MaxDeliver: maxDeliver})
	if err != nil {
		os.Exit(2)
	}
	stall := executor.ToolFunc(func(ctx context.Context, call *executor.Call) executor.Outcome {
		fmt.Println("started", call.ToolCallID)
		<-ctx.Done()
		return executor.Success("never reached")
	})
	if err := ex.Register("stall", stall, def("stall", protocol.DeterminismIdempotent, protocol.RetryPolicy{}, 4)); err != nil {
		os.Exit(2)
	}
	if err := ex.Start(ctx); err != nil {
		fmt.Println("start failed:", err)
		os.Exit(2)
	}
	select {} // until killed
}

// startHelper runs the executor in a child process and waits until it has
// started running callID.
func startHelper(t *testing.T, url string, maxDeliver int, callID string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperExecutorProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+url, "CGLEDGER_EXECUTOR_HELPER_MAXDELIVER="+strconv.Itoa(maxDeliver))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	started := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "started ") {
				started <- strings.TrimPrefix(sc.Text(), "started ")
				return
			}
		}
		close(started)
	}()
	select {
	case id, ok := <-started:
		require.True(t, ok, "helper executor exited before running the call")
		require.Equal(t, callID, id)
	case <-time.After(60 * time.Second):
		t.Fatal("helper executor never started the call")
	}
	return cmd
}

func TestKilledExecutorMidCallStillResolvesOnce(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxDeliver int
		status     string
		taxonomy   string
	}{
		{"redelivered_and_run_again", 5, protocol.StatusSuccess, ""},
		{"last_delivery_becomes_terminal_failure", 2, protocol.StatusFailed, executor.CodeRedelivered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &rig{Env: ledgertest.New(t), reg: prometheus.NewRegistry()}
			_, err := r.L.SetRoster(ledgertest.Ctx(t), protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "worker"})
			require.NoError(t, err)
			c := r.dispatch(t, callOpts{tool: "stall"})
			helper := startHelper(t, r.Srv.URL(), tc.maxDeliver, c.ID)
			require.NoError(t, helper.Process.Kill(), "SIGKILL mid-call")
			_ = helper.Wait()

			finisher := executor.ToolFunc(func(context.Context, *executor.Call) executor.Outcome { return executor.Success("finished") })
			r.start(t, executor.Config{AckWait: time.Second, MaxDeliver: tc.maxDeliver}, map[string]impl{
				"stall": {finisher, def("stall", protocol.DeterminismIdempotent, protocol.RetryPolicy{}, 4)},
			})
			_, tr, _ := r.result(t, c)
			require.Equal(t, tc.status, tr.Status)
			if tc.taxonomy != "" {
				require.Equal(t, tc.taxonomy, errDetail(t, tr).TaxonomyCode)
			}
			require.Len(t, r.entriesOfKind(t, protocol.KindReport), 1, "exactly one report")
			require.GreaterOrEqual(t, counterSum(t, r, "cgledger_executor_redeliveries_total"), 1.0)
		})
	}
}
