package executor_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestAnExecutorInAnotherProcessRunsOnTheClient: an executor whose ledger
// is a client.Client makes every read and write over the API, and calls come
// out as they do in process: a call answered with its result card, a call
// canceled before it ran answered canceled without running, and a command
// that does not validate recorded as refused with every violation.
func TestAnExecutorInAnotherProcessRunsOnTheClient(t *testing.T) {
	r := newRemoteRig(t, executor.Config{}, nil)

	c := r.dispatch(t, callOpts{tool: "echo", args: `{"text":"over the wire"}`})
	rec, tr, card := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, rec.Claim.Status)
	require.JSONEq(t, `{"text":"over the wire"}`, string(tr.Result))
	require.Equal(t, "cgledger.executor", card.Card.AuthorID)

	// Canceled before the executor sees it: the executor reads the
	// cancellation (cancel.get) and answers without running the tool.
	r.ex.Stop(ledgertest.Ctx(t))
	canceled := r.dispatch(t, callOpts{tool: "echo", args: `{"text":"never"}`})
	_, err := r.L.Cancel(ledgertest.Ctx(t), protocol.CancelRequest{ProjectID: canceled.Project, AgentID: canceled.Agent,
		AgentTurnID: canceled.Turn, ToolCallID: canceled.ID})
	require.NoError(t, err)
	js, err := r.NC.JetStream()
	require.NoError(t, err)
	_, err = js.PublishMsg(&nats.Msg{Subject: "cg.v1.proj.main.cmd.tool.echo", Data: []byte(`{"args":{"x":1}}`)})
	require.NoError(t, err)
	r.start(t, executor.Config{Registerer: prometheusNoop()}, nil)

	rec, _, _ = r.result(t, canceled)
	require.Equal(t, protocol.StatusCanceled, rec.Claim.Status)
	require.Eventually(t, func() bool { return r.commandRejections(t) == 1 }, time.Minute, 20*time.Millisecond)
	for _, e := range r.entriesOfKind(t, protocol.KindRejection) {
		var re protocol.RejectionEntry
		require.NoError(t, json.Unmarshal(e.Data, &re))
		if re.Op != protocol.OpCommand {
			continue
		}
		require.Equal(t, protocol.CodeBadRequest, re.Code)
		require.GreaterOrEqual(t, len(re.Violations), 4, "every violation: %+v", re.Violations)
		require.Equal(t, "echo", nats.Header(e.Headers).Get(protocol.HeaderActor), "recorded over the API, as the command's tool")
	}
}
