package protocol_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestCheckReadRequestChecksAsTheAPIServerDoes: a read another part of the
// server answers (inbox.list) is checked like the ledger's own: bad subject
// tokens and a body naming another project or agent are refused with every
// violation, and a reply subject that is not an inbox is never answered.
func TestCheckReadRequestChecksAsTheAPIServerDoes(t *testing.T) {
	op := protocol.OpInboxList
	msg := func(subject, reply, body string) *nats.Msg {
		return &nats.Msg{Subject: subject, Reply: reply, Data: []byte(body)}
	}
	c, answer, err := protocol.CheckReadRequest(op, msg("cgledger.v1.p1.a1.inbox.list", "_INBOX.x", `{"project_id":"p1","agent_id":"a1"}`))
	require.NoError(t, err)
	require.True(t, answer)
	require.Equal(t, protocol.Caller{Project: "p1", Actor: "a1"}, c)

	_, answer, err = protocol.CheckReadRequest(op, msg("cgledger.v1.p1.a1.inbox.list", "_INBOX.x", `{"project_id":"p2","agent_id":"a2"}`))
	require.True(t, answer)
	e, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeForbidden, e.Code)
	require.Len(t, e.Violations, 2, "%+v", e.Violations)

	_, answer, err = protocol.CheckReadRequest(op, msg("cgledger.v1.p1.a1.inbox.list", "cg.v1.p1.c1.cmd.agent.w.wakeup", `{"project_id":"p1","agent_id":"a1"}`))
	require.False(t, answer, "never answered on a subject that is not an inbox")
	e, ok = protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "reply", e.Violations[0].Field)

	_, answer, err = protocol.CheckReadRequest(op, msg("cgledger.v1.p1.a1.inbox.list", "", `{}`))
	require.NoError(t, err)
	require.False(t, answer, "no reply subject: nothing to answer")
}

// TestCallerAfterParseAgreesWithCheckRequest: for the operations whose
// caller check waits for their parse (dispatch, report.result), the API
// server's answer (CheckRequestBeforeParse, then the check on what the
// parse read, or on the bytes when it fails) is CheckRequest's, for every
// dispatch and report.result of the request cases, sent as their own
// project and actor and as others'.
func TestCallerAfterParseAgreesWithCheckRequest(t *testing.T) {
	deferred := func(op string, m *nats.Msg) *protocol.Error {
		c, e, _ := protocol.CheckRequestBeforeParse(op, m)
		if e != nil {
			return e
		}
		var vs protocol.Violations
		switch op {
		case protocol.OpDispatch:
			_, d, pvs := protocol.ParseDispatch(protocol.DefaultVersion, m.Header, m.Data)
			if len(pvs) == 0 {
				vs = protocol.CheckDispatchCaller(c, d.Subject.Project, d.Card.ProjectID, d.Identity.AgentID)
			} else {
				vs = protocol.CheckCaller(op, c, m.Header, m.Data)
			}
		case protocol.OpReportResult:
			r, pvs := protocol.ParseReportResult(m.Header, m.Data)
			if len(pvs) == 0 {
				vs = protocol.CheckReportResultCaller(c, r.Report.ProjectID, r.Card.ProjectID)
			} else {
				vs = protocol.CheckCaller(op, c, m.Header, m.Data)
			}
		}
		if len(vs) > 0 {
			return protocol.CallerRefusal(op, vs)
		}
		return nil
	}
	seen := map[string]int{}
	for _, file := range []string{"dispatch.txt", "report_result.txt", "request.txt"} {
		datadriven.RunTest(t, filepath.Join("testdata", "requests", file), func(t *testing.T, td *datadriven.TestData) string {
			op := td.Cmd
			if op == "request" {
				s := arg(td, "subject")
				op = s[strings.LastIndex(s, ".")+1:]
			}
			if !protocol.CallerAfterParse(op) {
				return td.Expected
			}
			h, body := splitRequest(td.Input)
			for _, p := range []string{"p1", "proj-1", "p2"} {
				for _, a := range []string{"a1", "agent-1", "a2", "bad.actor"} {
					m := &nats.Msg{Subject: "cgledger.v1." + p + "." + a + "." + op, Header: h, Data: body}
					_, want, _ := protocol.CheckRequest(op, m)
					require.Equal(t, want, deferred(op, m), "%s as %s/%s", td.Pos, p, a)
					if want != nil {
						seen[string(want.Code)]++
					} else {
						seen["ok"]++
					}
				}
			}
			return td.Expected
		})
	}
	t.Logf("answers: %v", seen)
	require.NotZero(t, seen["ok"])
	require.NotZero(t, seen[string(protocol.CodeForbidden)])
}
