package conformance_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/conformance"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// flaw is one deliberately broken behaviour of the test tool service.
type flaw string

const (
	sound               flaw = ""
	runsMalformed       flaw = "runs the tool on a malformed command"
	rewritesMetadata    flaw = "rewrites the result card's metadata"
	runsAgainAfter      flaw = "runs again on a redelivery of an answered call"
	ignoresCancel       flaw = "never reads cancel.get"
	reportsTwiceTimeout flaw = "reports a timeout twice"
	skipsAttempt        flaw = "skips attempt.start"
	noHeartbeats        flaw = "sends no in-progress acks"
	rewritesAfter       flaw = "reports after_execution suspend whatever the command says"
	dropsTraceparent    flaw = "reports without a traceparent"
	acksMalformed       flaw = "acknowledges a malformed command without command.reject"
	dropsCanceledRun    flaw = "stops a call canceled while it runs without reporting it"
	reportsEveryTwice   flaw = "sends every report twice"
)

// toolService is a tool service in another process as docs/protocol.md
// describes it ("A tool service, step by step"), built on the client
// package and the ledger-kept consumer, with at most one flaw. Its tool
// sleeps args.ms (until the command's deadline) and returns its arguments.
type toolService struct {
	t      *testing.T
	c      *client.Client
	tool   string
	det    string
	flaw   flaw
	ackDur time.Duration
}

func startToolService(t *testing.T, r *rig, tool, det string, f flaw) {
	t.Helper()
	registerTool(t, r, tool, det)
	consumeTool(t, r, tool, det, f)
}

// registerTool registers the test service's tool.
func registerTool(t *testing.T, r *rig, tool, det string) {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	def := protocol.ToolDefinition{
		ToolName: tool, Description: "conformance test service", Parameters: []byte(`{"type":"object"}`),
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool." + tool, AfterExecution: protocol.AfterSuspend,
		Limits:      protocol.ToolLimits{TimeoutMSDefault: 10_000, TimeoutMSMax: 60_000, ConcurrencyMax: 4},
		Determinism: det, Retry: protocol.RetryPolicy{MaxAttempts: 1, BaseMS: 100, CapMS: 100},
	}
	def.ProjectID = project
	_, err := r.c.RegisterTool(ctx, &def)
	require.NoError(t, err)
}

// consumeTool starts the test service on the tool's ledger-kept consumer.
func consumeTool(t *testing.T, r *rig, tool, det string, f flaw) {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	c := client.New(r.NC, client.WithActor(tool), client.WithTimeout(30*time.Second))
	info, err := c.EnsureToolConsumer(ctx, project, tool)
	require.NoError(t, err)
	js, err := jetstream.New(r.NC)
	require.NoError(t, err)
	cons, err := js.Consumer(ctx, info.Stream, info.Consumer)
	require.NoError(t, err)
	s := &toolService{t: t, c: c, tool: tool, det: det, flaw: f, ackDur: time.Duration(info.AckWaitMS) * time.Millisecond}
	cc, err := cons.Consume(s.handle)
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
}

func (s *toolService) handle(msg jetstream.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.serve(ctx, msg); err != nil {
		s.t.Logf("tool service: %v (left unacknowledged)", err)
		_ = msg.Nak()
		return
	}
	_ = msg.Ack()
}

func (s *toolService) serve(ctx context.Context, msg jetstream.Msg) error {
	h := msg.Headers()
	if h.Get(protocol.HeaderEntryKind) == string(protocol.KindDecision) {
		return nil
	}
	cmd, perr := protocol.ParseToolCommand(msg.Subject(), h, msg.Data())
	if perr != nil {
		switch s.flaw {
		case runsMalformed:
			id, _ := protocol.ParseIdentity(h, protocol.IdentityRules{})
			sub, _ := protocol.ParseSubject(msg.Subject())
			return s.answer(ctx, sub, id, protocol.ToolCommandPayload{AfterExecution: protocol.AfterSuspend}, protocol.CardMetadata{}, protocol.StatusSuccess, "")
		case acksMalformed:
			return nil
		}
		e, _ := protocol.AsError(perr)
		if e == nil {
			e = protocol.NewError(protocol.CodeBadRequest, nil, "invalid tool command: %v", perr)
		}
		return s.c.RejectCommand(ctx, msg.Subject(), h, msg.Data(), e)
	}
	sub, id, p := cmd.Subject, cmd.Identity, cmd.Payload
	rec, err := s.c.GetCall(ctx, sub.Project, id.AgentTurnID, id.ToolCallID)
	if errors.Is(err, protocol.ErrUnknownCall) {
		if s.flaw == runsMalformed {
			return s.answer(ctx, sub, id, p, protocol.CardMetadata{}, protocol.StatusSuccess, "")
		}
		var vs protocol.Violations
		vs.Add("header."+protocol.HeaderToolCallID, protocol.VNotFound, "call %s was never dispatched", id.ToolCallID)
		return s.c.RejectCommand(ctx, msg.Subject(), h, msg.Data(), protocol.NewError(protocol.CodeUnknownCall, vs, "command for a call the ledger never dispatched"))
	}
	if err != nil {
		return err
	}
	switch {
	case rec.State == protocol.StateClaimed:
		_, err := s.c.Resume(ctx, sub.Project, id.AgentTurnID, id.ToolCallID)
		return err
	case rec.State != protocol.StateDispatched && s.flaw != runsAgainAfter:
		return nil
	}
	if s.flaw != ignoresCancel {
		canceled, err := s.c.Canceled(ctx, sub.Project, sub.Channel, id.AgentTurnID, id.ToolCallID)
		if err != nil {
			return err
		}
		if canceled && s.flaw == dropsCanceledRun && rec.Paused == nil {
			// Canceled after its command was published (a call held by a
			// pause is the checker's canceled-before-delivery case): on a
			// loaded machine the checker's cancel of a running call can land
			// before this look, and the flaw must not depend on where.
			return nil
		}
		if canceled {
			return s.answer(ctx, sub, id, p, rec.CardMetadata, protocol.StatusCanceled, "")
		}
	}
	if s.det == protocol.DeterminismSideEffectful && s.flaw != skipsAttempt {
		st, err := s.c.StartAttempt(ctx, protocol.AttemptStartRequest{ProjectID: sub.Project, AgentTurnID: id.AgentTurnID, ToolCallID: id.ToolCallID, ExecutorID: "svc-1"})
		if err != nil {
			return err
		}
		if !st.Started {
			return s.answer(ctx, sub, id, p, rec.CardMetadata, protocol.StatusFailed, protocol.AttemptOutcomeUnknown)
		}
	}
	card, err := s.c.GetCard(ctx, sub.Project, p.ToolCallCardID)
	if err != nil {
		return err
	}
	var content struct {
		Arguments struct {
			MS int64 `json:"ms"`
		} `json:"arguments"`
	}
	_ = json.Unmarshal(card.Card.Content, &content)
	status := s.run(msg, time.Duration(content.Arguments.MS)*time.Millisecond, time.UnixMilli(p.DeadlineUnixMS), func() bool {
		canceled, err := s.c.Canceled(ctx, sub.Project, sub.Channel, id.AgentTurnID, id.ToolCallID)
		return err == nil && canceled
	})
	if status == "" {
		return nil // dropped: acknowledged, never reported
	}
	if err := s.answer(ctx, sub, id, p, card.Card.Metadata, status, ""); err != nil {
		return err
	}
	if (status == protocol.StatusTimeout && s.flaw == reportsTwiceTimeout) || s.flaw == reportsEveryTwice {
		return s.answer(ctx, sub, id, p, card.Card.Metadata, status, "")
	}
	return nil
}

// run sleeps d or until the deadline, heartbeating; it returns the status
// ("" when the flaw drops a call canceled meanwhile). The sound service
// runs a call canceled while it runs to its end: the protocol allows it.
func (s *toolService) run(msg jetstream.Msg, d time.Duration, deadline time.Time, canceled func() bool) string {
	var dropped bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if s.flaw != noHeartbeats {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(s.ackDur / 3)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					_ = msg.InProgress()
					if s.flaw == dropsCanceledRun && canceled() {
						dropped = true
					}
				}
			}
		}()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	dl := time.NewTimer(time.Until(deadline))
	defer dl.Stop()
	status := protocol.StatusSuccess
	select {
	case <-t.C:
	case <-dl.C:
		status = protocol.StatusTimeout
	}
	close(stop)
	wg.Wait()
	// A cancel that landed after the last heartbeat's look (a loaded
	// machine) is still one this flawed service drops: its flaw must not
	// depend on where the cancel falls between two ticks.
	if dropped || (s.flaw == dropsCanceledRun && canceled()) {
		return ""
	}
	return status
}

// answer puts the result card and reports it.
func (s *toolService) answer(ctx context.Context, sub protocol.Subject, id protocol.Identity, p protocol.ToolCommandPayload, meta protocol.CardMetadata, status, attemptOutcome string) error {
	content := map[string]any{"status": status, "result": map[string]any{"ok": status == protocol.StatusSuccess}}
	switch status {
	case protocol.StatusFailed:
		content["error"] = map[string]any{"code": "internal_error", "message": "outcome unknown", "detail": map[string]any{"taxonomy_code": "S-TOOL-OUTCOME-UNKNOWN"}}
	case protocol.StatusTimeout:
		content["error"] = map[string]any{"code": "tool_timeout", "message": "deadline"}
	case protocol.StatusCanceled:
		content["error"] = map[string]any{"code": "canceled", "message": "canceled"}
	}
	raw, err := json.Marshal(content)
	if err != nil {
		return err
	}
	if s.flaw == rewritesMetadata {
		meta.TraceID = strings.ToValidUTF8(strings.ReplaceAll(meta.TraceID, "\u2028", " "), "")
	}
	cardID := "rc-" + id.AgentTurnID + "-" + id.ToolCallID + "-" + status
	_, err = s.c.PutCard(ctx, protocol.Card{CardID: cardID, ProjectID: sub.Project, Type: protocol.CardToolResult, AuthorID: "svc." + s.tool,
		FunctionName: s.tool, AgentTurnID: id.AgentTurnID, ToolCallID: id.ToolCallID, Content: raw, Metadata: meta})
	if _, refused := protocol.AsError(err); err != nil && !refused {
		return err
	}
	after := p.AfterExecution
	if s.flaw == rewritesAfter {
		after = protocol.AfterSuspend
	}
	if parts := strings.Split(id.Traceparent, "-"); len(parts) == 4 {
		var span [8]byte
		_, _ = rand.Read(span[:])
		span[0] |= 1
		id.Traceparent = fmt.Sprintf("00-%s-%s-01", parts[1], hex.EncodeToString(span[:]))
	}
	if s.flaw == dropsTraceparent {
		id.Traceparent, id.Tracestate = "", ""
	}
	_, err = s.c.Report(ctx, protocol.ReportRequest{ProjectID: sub.Project, ChannelID: sub.Channel, Identity: id, SourceID: "svc." + s.tool, SourceFunction: s.tool,
		Payload: protocol.ReportPayload{Status: status, AfterExecution: after, ToolResultCardID: cardID, AttemptOutcome: attemptOutcome}})
	if _, refused := protocol.AsError(err); refused {
		return nil // recorded as a rejection: the checker sees it
	}
	return err
}

// newServiceRig is a rig with serve's deadline keeper, so that a call its
// service never answers ends (timeout) at its deadline.
func newServiceRig(t *testing.T) *rig {
	t.Helper()
	r := newRig(t)
	k, err := r.L.StartDeadlineKeeper(ledgertest.Ctx(t), ledger.DeadlineKeeperConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = k.Stop(context.Background()) })
	return r
}

const svcFixture = `
normal: {args: {ms: 1}}
long: {args: {ms: 2500}, duration_ms: 2500}
timeout_ms: 3000
`

func failed(rep conformance.Report) []string {
	var out []string
	for _, c := range rep.Cases {
		if c.Outcome == conformance.Fail {
			out = append(out, c.Case)
		}
	}
	sort.Strings(out)
	return out
}

// TestSoundToolServiceConforms: the test service without a flaw passes
// every case, so each flawed variant fails only by its flaw.
func TestSoundToolServiceConforms(t *testing.T) {
	r := newServiceRig(t)
	startToolService(t, r, "svc", protocol.DeterminismPure, sound)
	rep := run(t, r, fixture(t, "svc", svcFixture))
	require.Empty(t, failed(rep))
	require.Equal(t, 16, rep.Passed, "every case but the four other statuses and the two side effects applies")

	require.Empty(t, sideEffectRuns(t, r, sound), "a sound side_effectful service passes intent and reconcile")
}

// TestBrokenToolServiceFailsItsCase: each flaw fails exactly the cases it
// breaks, among those run with it (its own and neighbours it must not
// disturb).
func TestBrokenToolServiceFailsItsCase(t *testing.T) {
	bad := []string{conformance.CaseMissingCallID, conformance.CaseInlineArgs, conformance.CaseUnknownCard, conformance.CaseIdentityMismatch}
	for _, tc := range []struct {
		flaw  flaw
		det   string
		cases []string
		fails []string
	}{
		{runsMalformed, protocol.DeterminismPure, append([]string{conformance.CaseNormal}, bad...), bad},
		// A command naming an unknown card parses: this service still
		// refuses it when call.get says unknown_call.
		{acksMalformed, protocol.DeterminismPure, append([]string{conformance.CaseNormal}, bad...), []string{conformance.CaseMissingCallID, conformance.CaseInlineArgs, conformance.CaseIdentityMismatch}},
		{rewritesMetadata, protocol.DeterminismPure, []string{conformance.CaseNormal, conformance.CaseMetadata, conformance.CaseTraceparent}, []string{conformance.CaseMetadata}},
		{dropsTraceparent, protocol.DeterminismPure, []string{conformance.CaseNormal, conformance.CaseMetadata, conformance.CaseTraceparent}, []string{conformance.CaseTraceparent}},
		{rewritesAfter, protocol.DeterminismPure, []string{conformance.CaseNormal, conformance.CaseAfterExecution}, []string{conformance.CaseAfterExecution}},
		{runsAgainAfter, protocol.DeterminismPure, []string{conformance.CaseNormal, conformance.CaseRedeliveryAfter, conformance.CaseRedeliveryBefore}, []string{conformance.CaseRedeliveryAfter, conformance.CaseRedeliveryBefore}},
		{ignoresCancel, protocol.DeterminismPure, []string{conformance.CaseNormal, conformance.CaseCanceled, conformance.CaseCanceledRunning}, []string{conformance.CaseCanceled}},
		{dropsCanceledRun, protocol.DeterminismPure, []string{conformance.CaseNormal, conformance.CaseCanceled, conformance.CaseCanceledRunning}, []string{conformance.CaseCanceledRunning}},
		{reportsTwiceTimeout, protocol.DeterminismPure, []string{conformance.CaseNormal, conformance.CaseDeadline}, []string{conformance.CaseDeadline}},
		{noHeartbeats, protocol.DeterminismPure, []string{conformance.CaseNormal, conformance.CaseHeartbeat}, []string{conformance.CaseHeartbeat}},
	} {
		t.Run(strings.ReplaceAll(string(tc.flaw), " ", "_"), func(t *testing.T) {
			t.Parallel()
			r := newServiceRig(t)
			startToolService(t, r, "svc", tc.det, tc.flaw)
			rep := run(t, r, fixture(t, "svc", svcFixture), tc.cases...)
			want := append([]string(nil), tc.fails...)
			sort.Strings(want)
			require.Equal(t, want, failed(rep), "a service that %s", tc.flaw)
			require.False(t, rep.OK())
		})
	}
}

// TestAReportSentTwiceIsShown: a service that sends each report twice (the
// protocol lets it retry a report) still has one accepted report, so the
// normal case passes, and its row names the duplicate.
func TestAReportSentTwiceIsShown(t *testing.T) {
	r := newServiceRig(t)
	startToolService(t, r, "svc", protocol.DeterminismPure, reportsEveryTwice)
	rep := run(t, r, fixture(t, "svc", svcFixture), conformance.CaseNormal)
	require.Empty(t, failed(rep))
	require.Len(t, rep.Cases, 1)
	require.Contains(t, rep.Cases[0].Seen, "reported 1 more time(s) (duplicate entries)")
}

// sideEffectRuns runs the side-effect cases against a side_effectful
// service with flaw f: reconcile with the service started once the
// checker's attempt is open (in this process the service would win the
// race for it), then intent; it returns the failed cases.
func sideEffectRuns(t *testing.T, r *rig, f flaw) []string {
	t.Helper()
	registerTool(t, r, "svcfx", protocol.DeterminismSideEffectful)
	fx := fixture(t, "svcfx", "normal: {args: {ms: 1}}\n")
	r.afterCheckerAttempt(t, func() { consumeTool(t, r, "svcfx", protocol.DeterminismSideEffectful, f) })
	rec := run(t, r, fx, conformance.CaseSideEffectReconcile)
	intent := run(t, r, fx, conformance.CaseSideEffectIntent)
	require.Len(t, append(rec.Cases, intent.Cases...), 2, "one case each")
	return append(failed(rec), failed(intent)...)
}

// TestBrokenSideEffectfulServiceFailsIntentAndReconcile: a service that
// skips attempt.start runs the tool without recording its intent, and over
// the attempt another left open.
func TestBrokenSideEffectfulServiceFailsIntentAndReconcile(t *testing.T) {
	r := newServiceRig(t)
	require.Equal(t, []string{conformance.CaseSideEffectReconcile, conformance.CaseSideEffectIntent}, sideEffectRuns(t, r, skipsAttempt))
}
