package ledger_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// TestAPIForeignProjectPrecedenceIsTheSameForEveryOp: on every operation, a
// project the request names that is an identifier other than its API
// subject's is forbidden (that violation alone, before the body's other
// problems); one that is not an identifier names no project and is the
// operation's bad_request. Every forbidden write is recorded under
// cg.<ver>._._.ledger.rejection.forbidden with the subject's project in
// CG-Project-Id, and reads write nothing.
func TestAPIForeignProjectPrecedenceIsTheSameForEveryOp(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	ctx := ctxT(t)
	_, err := e.l.RegisterToolYAML(ctx, project, []byte(strings.ReplaceAll(toolYAML, "probe", "echo")))
	require.NoError(t, err)
	c := newCall("turn-f", "call-f", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	d := newCall("turn-g", "call-g", 1)

	// Each case builds its request naming project p, with something else
	// wrong too where the body allows (so forbidden must win over it).
	type req struct {
		actor string
		h     nats.Header
		body  string
	}
	cardWith := func(card protocol.Card, p string) string {
		card.ProjectID = p
		b, err := json.Marshal(card)
		require.NoError(t, err)
		return string(b)
	}
	call := func(p string) string {
		return `{"project_id":"` + p + `","agent_turn_id":"turn-f","tool_call_id":"call-f"}`
	}
	cases := []struct {
		op    string
		write bool
		field string
		build func(p string) req
	}{
		{protocol.OpCardPut, true, "card.project_id", func(p string) req {
			bad := d.card
			bad.Type = "nonsense"
			return req{"x", nil, cardWith(bad, p)}
		}},
		{protocol.OpDispatch, true, "card.project_id", func(p string) req {
			body := strings.Replace(dispatchBodyFor(d, `{"text":"hi"}`), `"project_id":"`+project+`"`, `"project_id":"`+p+`"`, 1)
			return req{agent, d.identity().Header(), strings.Replace(body, `"after_execution":"suspend"`, `"after_execution":"later"`, 1)}
		}},
		{protocol.OpReport, true, "header.CG-Project-Id", func(p string) req {
			h := reportHeader(c)
			h.Set(protocol.HeaderProjectID, p)
			return req{"echo", h, `{"status":"nonsense","after_execution":"suspend","tool_result_card_id":"` + rc.CardID + `"}`}
		}},
		{protocol.OpToolRegister, true, "header.CG-Project-Id", func(p string) req {
			return req{"ops", nats.Header{protocol.HeaderProjectID: {p}}, "tool_name: echo\nafter_execution: later\n"}
		}},
		{protocol.OpToolRegister, true, "tool.project_id", func(p string) req {
			return req{"ops", nil, "project_id: \"" + p + "\"\n" + strings.ReplaceAll(toolYAML, "suspend", "later")}
		}},
		{protocol.OpDispatch, true, "subject", func(p string) req {
			body := strings.Replace(dispatchBodyFor(d, `{"text":"hi"}`), `cg.v1.`+project+`.`, `cg.v1.`+p+`.`, 1)
			return req{agent, d.identity().Header(), strings.Replace(body, `"after_execution":"suspend"`, `"after_execution":"later"`, 1)}
		}},
		{protocol.OpRosterSet, true, "body.project_id", func(p string) req {
			return req{agent, nil, `{"project_id":"` + p + `","agent_id":"` + agent + `","worker_target":"w.x"}`}
		}},
		{protocol.OpConsume, true, "body.project_id", func(p string) req {
			return req{agent, nil, `{"project_id":"` + p + `","agent_id":"` + agent + `","agent_turn_id":"turn-f"}`}
		}},
		{protocol.OpCancel, true, "body.project_id", func(p string) req {
			return req{agent, nil, `{"project_id":"` + p + `","agent_id":"` + agent + `","agent_turn_id":"turn-f"}`}
		}},
		{protocol.OpResume, true, "body.project_id", func(p string) req {
			return req{"echo", nil, `{"project_id":"` + p + `","agent_turn_id":"turn-f"}`}
		}},
		{protocol.OpCommandReject, true, "body.subject", func(p string) req {
			return req{"echo", nil, `{"subject":"cg.v1.` + p + `.` + channel + `.cmd.tool.echo","error":{"code":"nonsense","message":"no"}}`}
		}},
		{protocol.OpCardGet, false, "body.project_id", func(p string) req {
			return req{"x", nil, `{"project_id":"` + p + `","card_ids":[]}`}
		}},
		{protocol.OpCallGet, false, "body.project_id", func(p string) req { return req{"x", nil, call(p)} }},
		{protocol.OpRosterGet, false, "body.project_id", func(p string) req {
			return req{"x", nil, `{"project_id":"` + p + `"}`}
		}},
		{protocol.OpToolGet, false, "body.project_id", func(p string) req {
			return req{"x", nil, `{"project_id":"` + p + `"}`}
		}},
		{protocol.OpCancelGet, false, "body.project_id", func(p string) req { return req{"x", nil, call(p)} }},
	}
	for _, tc := range cases {
		t.Run(tc.op+"/"+tc.field, func(t *testing.T) {
			// Another project: forbidden, that violation alone.
			r := tc.build("proj-other")
			got := request(t, e.nc, protocol.APISubject(project, r.actor, tc.op), r.h, r.body)
			require.False(t, got.OK)
			require.Equal(t, "forbidden", got.Error.Code, "%+v", got.Error)
			require.Len(t, got.Error.Violations, 1, "%+v", got.Error.Violations)
			require.Equal(t, tc.field, got.Error.Violations[0].Field)
			require.Equal(t, protocol.VForbidden, got.Error.Violations[0].Code)
			if tc.write {
				requireForbiddenEntry(t, e, got.Error.RejectionSeq)
			} else {
				require.Zero(t, got.Error.RejectionSeq, "a read writes no rejection entry")
			}

			// Not an identifier (so different too): the operation's own
			// bad_request, naming that field.
			r = tc.build("_")
			got = request(t, e.nc, protocol.APISubject(project, r.actor, tc.op), r.h, r.body)
			require.False(t, got.OK)
			require.Equal(t, "bad_request", got.Error.Code, "%+v", got.Error)
			var fields []string
			for _, v := range got.Error.Violations {
				fields = append(fields, v.Field+"/"+v.Code)
			}
			require.Contains(t, fields, tc.field+"/"+protocol.VInvalidToken)
		})
	}

	// A call reported or resumed by another tool: forbidden, recorded
	// under _._ like the rest, not under the call's channel.
	t.Run("another tool", func(t *testing.T) {
		got := request(t, e.nc, protocol.APISubject(project, "spoof", protocol.OpReport), reportHeader(c),
			`{"status":"success","after_execution":"suspend","tool_result_card_id":"`+rc.CardID+`"}`)
		require.Equal(t, "forbidden", got.Error.Code, "%+v", got.Error)
		requireForbiddenEntry(t, e, got.Error.RejectionSeq)
		got = request(t, e.nc, protocol.APISubject(project, "spoof", protocol.OpResume), nil, call(project))
		require.Equal(t, "forbidden", got.Error.Code, "%+v", got.Error)
		requireForbiddenEntry(t, e, got.Error.RejectionSeq)
	})

	// A registration naming another project twice, in its header and in its
	// YAML body: both listed, as dispatch lists its subject and its card.
	t.Run("tool.register header and body", func(t *testing.T) {
		got := request(t, e.nc, protocol.APISubject(project, "ops", protocol.OpToolRegister),
			nats.Header{protocol.HeaderProjectID: {"proj-other"}}, "project_id: proj-other\n"+toolYAML)
		require.Equal(t, "forbidden", got.Error.Code, "%+v", got.Error)
		var fields []string
		for _, v := range got.Error.Violations {
			fields = append(fields, v.Field+"/"+v.Code)
		}
		require.ElementsMatch(t, []string{"header.CG-Project-Id/forbidden", "tool.project_id/forbidden"}, fields)
		requireForbiddenEntry(t, e, got.Error.RejectionSeq)
	})
}

// requireForbiddenEntry checks that the rejection entry at seq is a
// forbidden one, under _._, filed in the API subject's project.
func requireForbiddenEntry(t *testing.T, e *env, seq uint64) {
	t.Helper()
	require.NotZero(t, seq, "a refused write is recorded")
	js, err := e.nc.JetStream()
	require.NoError(t, err)
	m, err := js.GetMsg(stream.DefaultName, seq)
	require.NoError(t, err)
	require.Equal(t, "cg.v1._._.ledger.rejection.forbidden", m.Subject)
	require.Equal(t, project, m.Header.Get(protocol.HeaderProjectID))
	require.Empty(t, m.Header.Get(protocol.HeaderChannelID))
}
