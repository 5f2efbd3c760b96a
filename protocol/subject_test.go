package protocol_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cgledger/cgledger/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requireSubjectError asserts that err is a bad_request *protocol.Error whose
// violations all name the "subject" field and carry exactly wantCodes (in the
// order they were found).
func requireSubjectError(t *testing.T, err error, wantCodes ...string) {
	t.Helper()
	require.Error(t, err)
	var e *protocol.Error
	require.True(t, errors.As(err, &e), "error %v (%T) is not a *protocol.Error", err, err)
	assert.Equal(t, protocol.CodeBadRequest, e.Code)
	assert.True(t, errors.Is(err, protocol.ErrBadRequest), "errors.Is(err, ErrBadRequest)")
	require.Len(t, e.Violations, len(wantCodes), "violations: %+v", e.Violations)
	got := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		assert.Equal(t, "subject", v.Field, "violation %d: %+v", i, v)
		assert.NotEmpty(t, v.Message, "violation %d: %+v", i, v)
		got[i] = v.Code
	}
	assert.Equal(t, wantCodes, got, "violation codes: %+v", e.Violations)
}

func TestSubjectBuildParseRoundTrip(t *testing.T) {
	long := strings.Repeat("x", protocol.MaxIdentifierLen)
	tests := []struct {
		name  string
		built string
		text  string
		want  protocol.Subject
	}{
		{
			name:  "tool command, one target token",
			built: protocol.ToolCommandSubject("v1", "proj-1", "chan-1", "echo"),
			text:  "cg.v1.proj-1.chan-1.cmd.tool.echo",
			want:  protocol.Subject{Kind: protocol.SubjectToolCommand, Version: "v1", Project: "proj-1", Channel: "chan-1", Target: []string{"echo"}},
		},
		{
			name:  "tool command, several target tokens",
			built: protocol.ToolCommandSubject("v2", "p", "c", "svc", "fn", "x_y-z"),
			text:  "cg.v2.p.c.cmd.tool.svc.fn.x_y-z",
			want:  protocol.Subject{Kind: protocol.SubjectToolCommand, Version: "v2", Project: "p", Channel: "c", Target: []string{"svc", "fn", "x_y-z"}},
		},
		{
			name:  "tool command whose target tokens look like grammar keywords",
			built: protocol.ToolCommandSubject("v1", "p", "c", "sys", "pmo", "internal", "x"),
			text:  "cg.v1.p.c.cmd.tool.sys.pmo.internal.x",
			want:  protocol.Subject{Kind: protocol.SubjectToolCommand, Version: "v1", Project: "p", Channel: "c", Target: []string{"sys", "pmo", "internal", "x"}},
		},
		{
			name:  "pmo command",
			built: protocol.PMOCommandSubject("v1", "p", "c", "spawn_agent"),
			text:  "cg.v1.p.c.cmd.sys.pmo.internal.spawn_agent",
			want:  protocol.Subject{Kind: protocol.SubjectPMOCommand, Version: "v1", Project: "p", Channel: "c", Tool: "spawn_agent"},
		},
		{
			name:  "wakeup",
			built: protocol.WakeupSubject("v1", "p", "c", "worker-7"),
			text:  "cg.v1.p.c.cmd.agent.worker-7.wakeup",
			want:  protocol.Subject{Kind: protocol.SubjectWakeup, Version: "v1", Project: "p", Channel: "c", WorkerTarget: "worker-7"},
		},
		{
			name:  "report",
			built: protocol.ReportSubject("v1", "p", "c", "turn-1", "call-1"),
			text:  "cg.v1.p.c.ledger.report.turn-1.call-1",
			want:  protocol.Subject{Kind: protocol.SubjectReport, Version: "v1", Project: "p", Channel: "c", AgentTurnID: "turn-1", ToolCallID: "call-1"},
		},
		{
			name:  "duplicate",
			built: protocol.DuplicateSubject("v1", "p", "c", "turn-1", "call-1"),
			text:  "cg.v1.p.c.ledger.duplicate.turn-1.call-1",
			want:  protocol.Subject{Kind: protocol.SubjectDuplicate, Version: "v1", Project: "p", Channel: "c", AgentTurnID: "turn-1", ToolCallID: "call-1"},
		},
		{
			name:  "wakeup skipped",
			built: protocol.WakeupSkippedSubject("v1", "p", "c", "turn-1", "call-1"),
			text:  "cg.v1.p.c.ledger.wakeup_skipped.turn-1.call-1",
			want:  protocol.Subject{Kind: protocol.SubjectWakeupSkip, Version: "v1", Project: "p", Channel: "c", AgentTurnID: "turn-1", ToolCallID: "call-1"},
		},
		{
			name:  "rejection",
			built: protocol.RejectionSubject("v1", "p", "c", protocol.CodeBadRequest),
			text:  "cg.v1.p.c.ledger.rejection.bad_request",
			want:  protocol.Subject{Kind: protocol.SubjectRejection, Version: "v1", Project: "p", Channel: "c", Reason: "bad_request"},
		},
		{
			name:  "rejection with invalid project is unrouted",
			built: protocol.RejectionSubject("v1", "bad.project", "c", protocol.CodeConflict),
			text:  "cg.v1._._.ledger.rejection.conflict",
			want:  protocol.Subject{Kind: protocol.SubjectRejection, Version: "v1", Project: "_", Channel: "_", Reason: "conflict"},
		},
		{
			name:  "rejection with empty channel is unrouted",
			built: protocol.RejectionSubject("v1", "p", "", protocol.CodeUnknownCall),
			text:  "cg.v1._._.ledger.rejection.unknown_call",
			want:  protocol.Subject{Kind: protocol.SubjectRejection, Version: "v1", Project: "_", Channel: "_", Reason: "unknown_call"},
		},
		{
			name:  "card",
			built: protocol.CardSubject("v1", "p", "card-1"),
			text:  "cg.v1.p.card.card-1",
			want:  protocol.Subject{Kind: protocol.SubjectCard, Version: "v1", Project: "p", CardID: "card-1"},
		},
		{
			name:  "roster",
			built: protocol.RosterSubject("v1", "p", "agent-1"),
			text:  "cg.v1.p.roster.agent-1",
			want:  protocol.Subject{Kind: protocol.SubjectRoster, Version: "v1", Project: "p", AgentID: "agent-1"},
		},
		{
			name:  "max-length identifiers and punctuation",
			built: protocol.ReportSubject("v123456789", long, "!#$%&'()+,-/:;<=?@[]^_`{|}~", long, "a"),
			text:  "cg.v123456789." + long + ".!#$%&'()+,-/:;<=?@[]^_`{|}~." + "ledger.report." + long + ".a",
			want: protocol.Subject{Kind: protocol.SubjectReport, Version: "v123456789", Project: long, Channel: "!#$%&'()+,-/:;<=?@[]^_`{|}~",
				AgentTurnID: long, ToolCallID: "a"},
		},
		{
			name:  "skip",
			built: protocol.SkipSubject("v1", 18446744073709551615),
			text:  "cg.v1._._.ledger.skip.18446744073709551615",
			want:  protocol.Subject{Kind: protocol.SubjectSkip, Version: "v1", Project: "_", Channel: "_", Seq: 18446744073709551615},
		},
		{
			name:  "grammar keywords as ids",
			built: protocol.CardSubject("v0", "card", "roster"),
			text:  "cg.v0.card.card.roster",
			want:  protocol.Subject{Kind: protocol.SubjectCard, Version: "v0", Project: "card", CardID: "roster"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.text, tc.built, "builder output")
			got, err := protocol.ParseSubject(tc.built)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.want.Kind, got.Kind)
			assert.Equal(t, tc.built, got.String(), "String() of the parsed subject")
			again, err := protocol.ParseSubject(got.String())
			require.NoError(t, err)
			assert.Equal(t, got, again)

			cmd, err := protocol.ParseCommandSubject(tc.built)
			if got.IsCommand() {
				require.NoError(t, err)
				assert.Equal(t, got, cmd)
			} else {
				requireSubjectError(t, err, protocol.VInvalidSubject)
				assert.Equal(t, protocol.Subject{}, cmd)
			}
		})
	}
}

func TestSubjectKindString(t *testing.T) {
	want := map[protocol.SubjectKind]string{
		protocol.SubjectUnknown:     "unknown",
		protocol.SubjectToolCommand: "tool_command",
		protocol.SubjectPMOCommand:  "pmo_command",
		protocol.SubjectWakeup:      "wakeup",
		protocol.SubjectReport:      "report",
		protocol.SubjectDuplicate:   "duplicate",
		protocol.SubjectWakeupSkip:  "wakeup_skipped",
		protocol.SubjectRejection:   "rejection",
		protocol.SubjectCard:        "card",
		protocol.SubjectRoster:      "roster",
		protocol.SubjectConsumed:    "consumed",
		protocol.SubjectTool:        "tool",
		protocol.SubjectCancel:      "cancel",
		protocol.SubjectSkip:        "skip",
		protocol.SubjectKind(999):   "unknown",
	}
	for k, name := range want {
		assert.Equal(t, name, k.String(), "kind %d", int(k))
	}
	assert.Equal(t, "", protocol.Subject{Kind: protocol.SubjectUnknown, Version: "v1", Project: "p"}.String())
}

func TestSubjectIsCommand(t *testing.T) {
	for k := protocol.SubjectUnknown; k <= protocol.SubjectSkip; k++ {
		want := k == protocol.SubjectToolCommand || k == protocol.SubjectPMOCommand
		assert.Equal(t, want, protocol.Subject{Kind: k}.IsCommand(), "kind %s", k)
	}
}

func TestSubjectValidVersion(t *testing.T) {
	valid := []string{"v0", "v1", "v2", "v10", "v01", "v123456789", "v999999999"}
	invalid := []string{"", "v", "V1", "1", "vv1", "v-1", "v+1", "v1a", "va", "v 1", "v1 ", " v1", "v1.0", "v1_0",
		"v0x1", "v1234567890", "v4294967296", "v１"}
	for _, v := range valid {
		assert.True(t, protocol.ValidVersion(v), "ValidVersion(%q)", v)
	}
	for _, v := range invalid {
		assert.False(t, protocol.ValidVersion(v), "ValidVersion(%q)", v)
	}
}

func TestSubjectParseRejects(t *testing.T) {
	long := strings.Repeat("a", protocol.MaxIdentifierLen+1)
	const (
		sub = protocol.VInvalidSubject
		tok = protocol.VInvalidToken
	)
	tests := []struct {
		name  string
		in    string
		codes []string
	}{
		// Root and shape.
		{"empty", "", []string{sub}},
		{"just root", "cg", []string{sub}},
		{"wrong root", "nats.v1.p.c.cmd.tool.echo", []string{sub}},
		{"root wrong case", "CG.v1.p.c.cmd.tool.echo", []string{sub}},
		{"root with space", " cg.v1.p.c.cmd.tool.echo", []string{sub}},
		{"leading dot", ".cg.v1.p.c.cmd.tool.echo", []string{sub}},
		{"four tokens", "cg.v1.p.card", []string{sub}},

		// Version token.
		{"version without v", "cg.1.p.c.cmd.tool.echo", []string{sub}},
		{"version upper V", "cg.V1.p.c.cmd.tool.echo", []string{sub}},
		{"version letters", "cg.vX.p.c.cmd.tool.echo", []string{sub}},
		{"version only v", "cg.v.p.c.cmd.tool.echo", []string{sub}},
		{"version signed", "cg.v+1.p.card.x", []string{sub}},
		{"version too long", "cg.v12345678901.p.card.x", []string{sub}},
		{"version empty", "cg..p.card.x", []string{sub}},

		// Empty tokens.
		{"empty project", "cg.v1..c.cmd.tool.echo", []string{tok}},
		{"empty channel", "cg.v1.p..cmd.tool.echo", []string{tok}},
		{"empty target", "cg.v1.p.c.cmd.tool.", []string{tok}},
		{"empty middle target", "cg.v1.p.c.cmd.tool.a..b", []string{tok}},
		{"empty pmo tool", "cg.v1.p.c.cmd.sys.pmo.internal.", []string{tok}},
		{"empty worker target", "cg.v1.p.c.cmd.agent..wakeup", []string{tok}},
		{"empty turn and call", "cg.v1.p.c.ledger.report..", []string{tok, tok}},
		{"empty reason", "cg.v1.p.c.ledger.rejection.", []string{tok}},
		{"empty card id", "cg.v1.p.card.", []string{tok}},
		{"empty agent id", "cg.v1.p.roster.", []string{tok}},
		{"trailing dot", "cg.v1.p.c.cmd.tool.echo.", []string{tok}},

		// Skip subjects: ledger-wide, one spelling per sequence.
		{"skip under a project", "cg.v1.p.c.ledger.skip.5", []string{sub}},
		{"skip seq zero", "cg.v1._._.ledger.skip.0", []string{tok}},
		{"skip seq leading zero", "cg.v1._._.ledger.skip.05", []string{tok}},
		{"skip seq not a number", "cg.v1._._.ledger.skip.five", []string{tok}},
		{"skip seq signed", "cg.v1._._.ledger.skip.+5", []string{tok}},
		{"skip seq overflows", "cg.v1._._.ledger.skip.18446744073709551616", []string{tok}},
		{"skip seq empty", "cg.v1._._.ledger.skip.", []string{tok}},
		{"skip with extra token", "cg.v1._._.ledger.skip.5.6", []string{sub}},

		// Wildcards.
		{"star project", "cg.v1.*.c.cmd.tool.echo", []string{tok}},
		{"star channel", "cg.v1.p.*.cmd.tool.echo", []string{tok}},
		{"star target", "cg.v1.p.c.cmd.tool.*", []string{tok}},
		{"gt target", "cg.v1.p.c.cmd.tool.>", []string{tok}},
		{"gt inside token", "cg.v1.p.c.cmd.tool.a>b", []string{tok}},
		{"star pmo tool", "cg.v1.p.c.cmd.sys.pmo.internal.*", []string{tok}},
		{"gt card id", "cg.v1.p.card.>", []string{tok}},
		{"star agent id", "cg.v1.p.roster.a*", []string{tok}},
		{"gt worker target", "cg.v1.p.c.cmd.agent.>.wakeup", []string{tok}},
		{"star call id", "cg.v1.p.c.ledger.duplicate.t.*", []string{tok}},

		// Whitespace and non-printable.
		{"space in project", "cg.v1.p q.c.cmd.tool.echo", []string{tok}},
		{"tab in channel", "cg.v1.p.c\t.cmd.tool.echo", []string{tok}},
		{"newline in target", "cg.v1.p.c.cmd.tool.echo\n", []string{tok}},
		{"CR in card id", "cg.v1.p.card.x\r", []string{tok}},
		{"NUL in turn id", "cg.v1.p.c.ledger.report.t\x00.c", []string{tok}},
		{"DEL in reason", "cg.v1.p.c.ledger.rejection.x\x7f", []string{tok}},
		{"non-ASCII agent id", "cg.v1.p.roster.agént", []string{tok}},

		// The reserved "_" token.
		{"unrouted project on command", "cg.v1._.c.cmd.tool.echo", []string{tok}},
		{"unrouted channel on command", "cg.v1.p._.cmd.tool.echo", []string{tok}},
		{"unrouted project and channel on command", "cg.v1._._.cmd.tool.echo", []string{tok, tok}},
		{"unrouted project only on rejection", "cg.v1._.c.ledger.rejection.bad_request", []string{tok}},
		{"unrouted channel only on rejection", "cg.v1.p._.ledger.rejection.bad_request", []string{tok}},
		{"unrouted on report", "cg.v1._._.ledger.report.t.c", []string{tok, tok}},
		{"unrouted reason", "cg.v1._._.ledger.rejection._", []string{tok}},
		{"unrouted target", "cg.v1.p.c.cmd.tool._", []string{tok}},
		{"unrouted pmo tool", "cg.v1.p.c.cmd.sys.pmo.internal._", []string{tok}},
		{"unrouted card id", "cg.v1.p.card._", []string{tok}},
		{"unrouted card project", "cg.v1._.card.x", []string{tok}},
		{"unrouted agent id", "cg.v1.p.roster._", []string{tok}},
		{"unrouted worker target", "cg.v1.p.c.cmd.agent._.wakeup", []string{tok}},
		{"unrouted turn id", "cg.v1.p.c.ledger.wakeup_skipped._.c", []string{tok}},

		// Too long.
		{"long project", "cg.v1." + long + ".c.cmd.tool.echo", []string{tok}},
		{"long channel", "cg.v1.p." + long + ".cmd.tool.echo", []string{tok}},
		{"long target", "cg.v1.p.c.cmd.tool." + long, []string{tok}},
		{"long card id", "cg.v1.p.card." + long, []string{tok}},
		{"long call id", "cg.v1.p.c.ledger.report.t." + long, []string{tok}},

		// Wrong token counts and unknown keywords.
		{"card with extra token", "cg.v1.p.card.x.y", []string{sub}},
		{"roster with extra token", "cg.v1.p.roster.a.b", []string{sub}},
		{"unknown project-scoped kind", "cg.v1.p.cards.x", []string{sub}},
		{"tool without target", "cg.v1.p.c.cmd.tool", []string{sub}},
		{"cmd only", "cg.v1.p.c.cmd", []string{sub}},
		{"unknown cmd kind", "cg.v1.p.c.cmd.tools.echo", []string{sub}},
		{"pmo without tool", "cg.v1.p.c.cmd.sys.pmo.internal", []string{sub}},
		{"pmo with two tools", "cg.v1.p.c.cmd.sys.pmo.internal.a.b", []string{sub}},
		{"pmo wrong keyword", "cg.v1.p.c.cmd.sys.pmo.external.a", []string{sub}},
		{"wakeup without target", "cg.v1.p.c.cmd.agent.wakeup", []string{sub}},
		{"wakeup extra token", "cg.v1.p.c.cmd.agent.w.wakeup.x", []string{sub}},
		{"wakeup wrong suffix", "cg.v1.p.c.cmd.agent.w.wake", []string{sub}},
		{"report missing call", "cg.v1.p.c.ledger.report.t", []string{sub}},
		{"report extra token", "cg.v1.p.c.ledger.report.t.c.x", []string{sub}},
		{"unknown ledger kind", "cg.v1.p.c.ledger.reports.t.c", []string{sub}},
		{"rejection without reason", "cg.v1.p.c.ledger.rejection", []string{sub}},
		{"rejection extra token", "cg.v1.p.c.ledger.rejection.a.b", []string{sub}},
		{"unknown section", "cg.v1.p.c.events.x", []string{sub}},

		// Several problems are all reported.
		{"bad version and no grammar match", "cg.x.p.c.nope", []string{sub, sub}},
		{"bad version and bad tokens", "cg.V1.p*.c>.cmd.tool.a b.*", []string{sub, tok, tok, tok, tok}},
		{"bad report ids and route", "cg.v1.p q.c\t.ledger.report.*.>", []string{tok, tok, tok, tok}},
		{"bad card and project", "cg.v01x.>.card._", []string{sub, tok, tok}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := protocol.ParseSubject(tc.in)
			requireSubjectError(t, err, tc.codes...)
			assert.Equal(t, protocol.Subject{}, got, "a failed parse returns the zero Subject")

			// ParseCommandSubject reports exactly the same problems.
			cmd, cerr := protocol.ParseCommandSubject(tc.in)
			requireSubjectError(t, cerr, tc.codes...)
			assert.Equal(t, protocol.Subject{}, cmd)
		})
	}
}

func TestSubjectParseCommandRejectsNonCommands(t *testing.T) {
	for _, s := range []string{
		protocol.WakeupSubject("v1", "p", "c", "w"),
		protocol.ReportSubject("v1", "p", "c", "t", "c"),
		protocol.DuplicateSubject("v1", "p", "c", "t", "c"),
		protocol.WakeupSkippedSubject("v1", "p", "c", "t", "c"),
		protocol.RejectionSubject("v1", "p", "c", protocol.CodeMismatch),
		protocol.RejectionSubject("v1", "", "", protocol.CodeMismatch),
		protocol.CardSubject("v1", "p", "x"),
		protocol.RosterSubject("v1", "p", "a"),
	} {
		t.Run(s, func(t *testing.T) {
			parsed, err := protocol.ParseSubject(s)
			require.NoError(t, err)
			require.False(t, parsed.IsCommand())

			got, err := protocol.ParseCommandSubject(s)
			requireSubjectError(t, err, protocol.VInvalidSubject)
			assert.Equal(t, protocol.Subject{}, got)
			e, _ := protocol.AsError(err)
			assert.Contains(t, e.Violations[0].Message, parsed.Kind.String())
		})
	}
}

func TestSubjectErrorMessage(t *testing.T) {
	_, err := protocol.ParseSubject("cg.V1.p*.card.x")
	require.Error(t, err)
	msg := err.Error()
	assert.True(t, strings.HasPrefix(msg, "bad_request: "), msg)
	assert.Contains(t, msg, "2 violation(s)")
	assert.Contains(t, msg, "subject: ")
	assert.Contains(t, msg, "("+protocol.VInvalidSubject+")")
	assert.Contains(t, msg, "("+protocol.VInvalidToken+")")

	// Long inputs are clipped in messages.
	_, err = protocol.ParseSubject("nope." + strings.Repeat("z", 1000))
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 400, err.Error())
}
