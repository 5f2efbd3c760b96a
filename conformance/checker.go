package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/protocol"
)

// Outcome is a case's verdict.
type Outcome string

// Verdicts.
const (
	Pass          Outcome = "pass"
	Fail          Outcome = "fail"
	NotApplicable Outcome = "not_applicable"
)

// CaseResult is one row of the table.
type CaseResult struct {
	Case       string  `json:"case"`
	Expected   string  `json:"expected"`
	Seen       string  `json:"seen"`
	Outcome    Outcome `json:"outcome"`
	DurationMS int64   `json:"duration_ms"`
	// Turn is the agent_turn_id of the case's calls (audit them by it).
	Turn string `json:"agent_turn_id,omitempty"`
}

// Report is a run's result.
type Report struct {
	Run           string       `json:"run"`
	Project       string       `json:"project_id"`
	Tool          string       `json:"tool"`
	Agent         string       `json:"agent_id"`
	Cases         []CaseResult `json:"cases"`
	Passed        int          `json:"passed"`
	Failed        int          `json:"failed"`
	NotApplicable int          `json:"not_applicable"`
}

// OK reports whether no case failed.
func (r Report) OK() bool { return r.Failed == 0 }

// Config configures a run.
type Config struct {
	// Conn is a connection with an admin credential of Project.
	Conn    *nats.Conn
	Project string
	Fixture Fixture
	// Actor is the admin's actor token (recorded as who acted); empty
	// means "conformance".
	Actor string
	// Run names the run (an identifier); empty means a random one.
	Run string
	// Cases, when set, runs only the cases named (ids as in Cases()).
	Cases []string
	// Grace is the ledger's deadline grace (ledger.Config.DeadlineGrace);
	// 0 means 5s.
	Grace time.Duration
	// Settle bounds how long a case waits for the service to acknowledge a
	// command it must not run; 0 means 30s.
	Settle time.Duration
	// Progress, when set, is told each case's result as it ends.
	Progress func(CaseResult)
}

// Case ids, in the order a run takes them.
const (
	CaseNormal              = "normal"
	CaseMetadata            = "metadata_verbatim"
	CaseTraceparent         = "traceparent_child"
	CaseAfterExecution      = "after_execution_kept"
	CaseMissingCallID       = "command_missing_call_id"
	CaseInlineArgs          = "command_inline_args"
	CaseUnknownCard         = "command_unknown_card"
	CaseIdentityMismatch    = "command_identity_mismatch"
	CaseRedeliveryAfter     = "redelivery_after_report"
	CaseRedeliveryBefore    = "redelivery_before_report"
	CaseDuplicateCommand    = "duplicate_command"
	CaseCanceled            = "canceled_call"
	CaseCanceledRunning     = "canceled_while_running"
	CaseDeadline            = "deadline_timeout_once"
	CaseHeartbeat           = "heartbeats_long_call"
	CaseSideEffectIntent    = "side_effect_intent"
	CaseSideEffectReconcile = "side_effect_reconcile"
)

const (
	// caseStatusPrefix starts the ids of the per-status cases (status_failed).
	caseStatusPrefix = "status_"
	// conformanceExecutorID is the executor_id of the attempt the
	// reconcile case opens, as a service that died would leave it.
	conformanceExecutorID    = "cgledger-conformance"
	defaultConformanceActor  = "conformance"
	conformanceCancelReason  = "conformance: canceled before delivery"
	conformancePauseReason   = "conformance run %s: holding one call to cancel it before its command is published"
	metadataTraceWithSpecial = "conformance \u00e9\u6f22\u5b57\U0001F642 <&> line\u2028sep\u2029end"
)

// requestTimeout bounds one request to the ledger.
const requestTimeout = 30 * time.Second

// Cases lists every case id a run may take, in order.
func Cases() []string {
	out := []string{CaseNormal}
	for _, s := range statuses {
		out = append(out, caseStatusPrefix+s)
	}
	return append(out, CaseMetadata, CaseTraceparent, CaseAfterExecution,
		CaseMissingCallID, CaseInlineArgs, CaseUnknownCard, CaseIdentityMismatch,
		CaseRedeliveryAfter, CaseRedeliveryBefore, CaseDuplicateCommand, CaseCanceled, CaseCanceledRunning, CaseDeadline, CaseHeartbeat,
		CaseSideEffectIntent, CaseSideEffectReconcile)
}

// runner holds a run's state.
type runner struct {
	cfg   Config
	c     *client.Client
	tc    *client.Client
	f     Fixture
	run   string
	agent string
	det   string
	obs   *observer
	// normalCmd is the command entry of the normal case's call, which the
	// redelivery cases copy.
	normal *callRef
}

// Run drives the tool service through every case (or cfg.Cases) and
// returns the table. An error means the run itself could not go on (the
// ledger unreachable, the credential refused); a case that fails is a row.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, fmt.Errorf("conformance: %w", err)
	}
	if cfg.Actor == "" {
		cfg.Actor = defaultConformanceActor
	}
	if cfg.Grace == 0 {
		cfg.Grace = 5 * time.Second
	}
	if cfg.Settle == 0 {
		cfg.Settle = 30 * time.Second
	}
	if cfg.Run == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		cfg.Run = "r" + hex.EncodeToString(b[:])
	}
	rep := Report{Run: cfg.Run, Project: cfg.Project, Tool: cfg.Fixture.Tool, Agent: protocol.ConformanceAgentPrefix + cfg.Run, Cases: []CaseResult{}}
	// The run id goes into agent, turn and card ids (conformance-<run>,
	// conf-<run>-<case>, cc-conf-...): 64 bytes keep them identifiers.
	if !protocol.ValidIdentifier(cfg.Run) || len(cfg.Run) > 64 {
		return rep, fmt.Errorf("conformance: run id %q is not an identifier of at most 64 bytes", cfg.Run)
	}
	for _, k := range cfg.Cases {
		if !slices.Contains(Cases(), k) {
			return rep, fmt.Errorf("conformance: unknown case %q (cases: %s)", k, strings.Join(Cases(), ", "))
		}
	}
	r := &runner{cfg: cfg, f: cfg.Fixture, run: cfg.Run, agent: rep.Agent,
		c: client.New(cfg.Conn, client.WithActor(cfg.Actor), client.WithTimeout(requestTimeout)),
		// The admin acts as the tool where the ledger wants the tool as
		// actor (attempt.start): its credential may take any actor token.
		tc: client.New(cfg.Conn, client.WithActor(cfg.Fixture.Tool), client.WithTimeout(requestTimeout))}
	r.obs = &observer{c: r.c, project: cfg.Project, tool: r.f.Tool}
	if err := r.obs.start(ctx); err != nil {
		return rep, err
	}
	r.det = r.f.Determinism
	if r.det == "" {
		r.det = protocol.DeterminismPure
		if st, err := r.c.GetTool(ctx, cfg.Project, r.f.ToolName); err == nil && st != nil && st.Definition.Determinism != "" {
			r.det = st.Definition.Determinism
		}
	}
	for _, k := range Cases() {
		if len(cfg.Cases) > 0 && !slices.Contains(cfg.Cases, k) && !(k == CaseNormal && needsNormal(cfg.Cases)) {
			continue
		}
		start := time.Now()
		res, err := r.runCase(ctx, k)
		if err != nil {
			return rep, fmt.Errorf("conformance: case %s: %w", k, err)
		}
		res.Case, res.DurationMS = k, time.Since(start).Milliseconds()
		switch res.Outcome {
		case Pass:
			rep.Passed++
		case Fail:
			rep.Failed++
		default:
			rep.NotApplicable++
		}
		rep.Cases = append(rep.Cases, res)
		if cfg.Progress != nil {
			cfg.Progress(res)
		}
	}
	return rep, nil
}

// needsNormal: the redelivery-after-report case copies the normal call's
// command.
func needsNormal(cases []string) bool { return slices.Contains(cases, CaseRedeliveryAfter) }

func (r *runner) runCase(ctx context.Context, k string) (CaseResult, error) {
	if s, ok := strings.CutPrefix(k, caseStatusPrefix); ok {
		return r.caseStatus(ctx, s)
	}
	switch k {
	case CaseNormal:
		return r.caseNormal(ctx)
	case CaseMetadata:
		return r.caseMetadata(ctx)
	case CaseTraceparent:
		return r.caseTraceparent(ctx)
	case CaseAfterExecution:
		return r.caseAfterExecution(ctx)
	case CaseMissingCallID, CaseInlineArgs, CaseUnknownCard, CaseIdentityMismatch:
		return r.caseBadCommand(ctx, k)
	case CaseRedeliveryAfter:
		return r.caseRedeliveryAfter(ctx)
	case CaseRedeliveryBefore:
		return r.caseRedeliveryBefore(ctx)
	case CaseDuplicateCommand:
		return r.caseDuplicate(ctx)
	case CaseCanceled:
		return r.caseCanceled(ctx)
	case CaseCanceledRunning:
		return r.caseCanceledRunning(ctx)
	case CaseDeadline:
		return r.caseDeadline(ctx)
	case CaseHeartbeat:
		return r.caseHeartbeat(ctx)
	case CaseSideEffectIntent:
		return r.caseIntent(ctx)
	case CaseSideEffectReconcile:
		return r.caseReconcile(ctx)
	}
	return CaseResult{}, fmt.Errorf("no such case")
}

// callRef is one call a case dispatched.
type callRef struct {
	kase     string
	turn, id string
	cardID   string
	identity protocol.Identity
	subject  string
	meta     protocol.CardMetadata
	after    string
	dispatch protocol.DispatchResult
}

// ids of a case: turn conf-<run>-<case>[-n], call k, card cc-<turn>.
func (r *runner) newCall(kase string, n int) *callRef {
	turn := protocol.ConformanceTurnPrefix + r.run + "-" + strings.ReplaceAll(kase, "_", "-")
	if n > 0 {
		turn += fmt.Sprintf("-%d", n)
	}
	return &callRef{
		kase: kase, turn: turn, id: "k", cardID: "cc-" + turn,
		identity: protocol.Identity{AgentID: r.agent, AgentTurnID: turn, TurnEpoch: 1, ToolCallID: "k"},
		subject:  protocol.ToolCommandSubject(protocol.DefaultVersion, r.cfg.Project, r.f.Channel, r.f.Tool),
		meta:     protocol.CardMetadata{TraceID: "conformance/" + r.run + "/" + kase},
		after:    protocol.AfterSuspend,
	}
}

// dispatch sends the call's dispatch with args and timeoutMS (0: the
// fixture's), after mod adjusts the request.
func (r *runner) dispatch(ctx context.Context, cr *callRef, args map[string]any, timeoutMS int64, mod func(*protocol.DispatchRequest)) error {
	a, err := argsJSON(args)
	if err != nil {
		return err
	}
	if timeoutMS == 0 {
		timeoutMS = r.f.TimeoutMS
	}
	content, err := json.Marshal(map[string]any{"tool_name": r.f.ToolName, "arguments": a})
	if err != nil {
		return err
	}
	req := protocol.DispatchRequest{
		Subject: cr.subject, Identity: cr.identity,
		Card: protocol.Card{CardID: cr.cardID, ProjectID: r.cfg.Project, Type: protocol.CardToolCall, AuthorID: r.agent,
			AgentTurnID: cr.turn, ToolCallID: cr.id, Content: content, Metadata: cr.meta},
		Payload: protocol.ToolCommandPayload{ToolCallCardID: cr.cardID, ToolName: r.f.ToolName, AfterExecution: cr.after, TimeoutMS: timeoutMS},
	}
	if mod != nil {
		mod(&req)
	}
	cr.identity, cr.meta, cr.after = req.Identity, req.Card.Metadata, req.Payload.AfterExecution
	res, err := r.c.Dispatch(ctx, req)
	if err != nil {
		return fmt.Errorf("dispatch %s: %w", cr.turn, err)
	}
	cr.dispatch = res
	return nil
}

// longBudget is the timeout_ms of a long call that must run to its end:
// the fixture's, or twice the call's duration when that is longer.
func (r *runner) longBudget() int64 { return max(r.f.TimeoutMS, 2*r.f.Long.DurationMS) }

// budget is how long a call of timeoutMS may take to be answered: its
// deadline, the ledger's grace, and a margin for a loaded machine.
func (r *runner) budget(timeoutMS int64) time.Duration {
	if timeoutMS == 0 {
		timeoutMS = r.f.TimeoutMS
	}
	return time.Duration(timeoutMS)*time.Millisecond + r.cfg.Grace + r.cfg.Settle
}

// settled waits until the call has a report and its commands up to upTo
// are acknowledged, and returns the call's entries.
func (r *runner) settled(ctx context.Context, cr *callRef, timeoutMS int64, upTo uint64) ([]protocol.Entry, string, error) {
	ok, err := r.obs.waitFor(ctx, r.budget(timeoutMS), func() bool { return len(kindOf(r.obs.about(cr.turn), protocol.KindReport)) > 0 })
	if err != nil {
		return nil, "", err
	}
	if !ok {
		return r.obs.about(cr.turn), "no report within " + r.budget(timeoutMS).String(), nil
	}
	note, err := r.acked(ctx, upTo)
	return r.obs.about(cr.turn), note, err
}

// acked waits until a consumer of the tool acknowledged every command up to
// seq; the note says why it could not tell, or that it never happened.
func (r *runner) acked(ctx context.Context, seq uint64) (string, error) {
	ok, err := r.obs.waitFor(ctx, r.cfg.Settle, func() bool { return r.obs.ackedUpTo(seq) })
	if err != nil {
		return "", err
	}
	switch {
	case ok:
		return "", nil
	case len(r.obs.consumers) == 0:
		return "no durable consumer of the tool: cannot tell when the service acknowledged its commands", nil
	}
	return fmt.Sprintf("command %d not acknowledged within %s (consumers: %s)", seq, r.cfg.Settle, r.obs.consumerSummary()), nil
}

// verdict builds a row from the problems found.
func verdict(expected, seen string, problems []string, turn string) CaseResult {
	res := CaseResult{Expected: expected, Seen: seen, Outcome: Pass, Turn: turn}
	if len(problems) > 0 {
		res.Outcome = Fail
		res.Seen = strings.Join(problems, "; ")
		if seen != "" {
			res.Seen = seen + "; " + res.Seen
		}
	}
	return res
}

func na(expected, why string) CaseResult {
	return CaseResult{Expected: expected, Seen: why, Outcome: NotApplicable}
}

// reportOf decodes the call's report entries.
func reportsOf(es []protocol.Entry) []protocol.ReportEntry {
	var out []protocol.ReportEntry
	for _, e := range kindOf(es, protocol.KindReport) {
		var re protocol.ReportEntry
		if json.Unmarshal(e.Data, &re) == nil {
			out = append(out, re)
		}
	}
	return out
}

// refusals describes the rejection entries among es other than command
// rejections (those are the expected answer to a malformed command).
func refusals(es []protocol.Entry) []string {
	var out []string
	for _, e := range kindOf(es, protocol.KindRejection) {
		var re protocol.RejectionEntry
		if json.Unmarshal(e.Data, &re) != nil || re.Op == protocol.OpCommand {
			continue
		}
		msg := re.Message
		if len(re.Violations) > 0 {
			msg = re.Violations[0].Field + " " + re.Violations[0].Code + ": " + re.Violations[0].Message
		}
		out = append(out, fmt.Sprintf("%s refused %s (seq %d: %s)", re.Op, re.Code, e.Seq, clip(msg, 160)))
	}
	return out
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// expectOneReport checks the common shape of a call's answer: one report,
// with status want (any when empty), by the service unless byLedgerOK.
func expectOneReport(es []protocol.Entry, want string, byLedgerOK bool) (protocol.ReportEntry, string, []string) {
	var problems []string
	rs := reportsOf(es)
	if len(rs) != 1 {
		return protocol.ReportEntry{}, "", []string{fmt.Sprintf("%d report entries", len(rs))}
	}
	re := rs[0]
	seen := fmt.Sprintf("reported %s by %s", re.Status, re.SourceID)
	if want != "" && re.Status != want {
		problems = append(problems, "status "+re.Status+", want "+want)
	}
	if !byLedgerOK && (re.SourceID == protocol.DeadlineSourceID || re.SourceID == protocol.LedgerSourceID) {
		problems = append(problems, "the ledger answered the call ("+re.SourceID+"): the service did not report it")
	}
	return re, seen, append(problems, refusals(es)...)
}

// exchange is one call of a case: what it sends and the answer it expects.
type exchange struct {
	kase string
	// n numbers the case's calls as in newCall.
	n    int
	args map[string]any
	// timeoutMS is the dispatch's timeout_ms (0: the fixture's).
	timeoutMS int64
	// waitMS is the deadline the answer is waited for by (0: timeoutMS).
	waitMS int64
	mod    func(*protocol.DispatchRequest)
	// status and byLedgerOK are expectOneReport's want and byLedgerOK.
	status     string
	byLedgerOK bool
}

// normalCall is the fixture's normal call, answered with status (any when
// empty).
func (r *runner) normalCall(kase, status string) exchange {
	return exchange{kase: kase, args: r.f.Normal.Args, timeoutMS: r.f.Normal.TimeoutMS, status: status}
}

// longCall is the fixture's long call with a budget to run to its end,
// answered with status (any when empty).
func (r *runner) longCall(kase, status string) exchange {
	return exchange{kase: kase, args: r.f.Long.Args, timeoutMS: r.longBudget(), status: status}
}

// send dispatches the exchange's call.
func (r *runner) send(ctx context.Context, x exchange) (*callRef, error) {
	cr := r.newCall(x.kase, x.n)
	if err := r.dispatch(ctx, cr, x.args, x.timeoutMS, x.mod); err != nil {
		return nil, err
	}
	return cr, nil
}

// answer is a call's answer as a case judges it.
type answer struct {
	cr       *callRef
	es       []protocol.Entry
	re       protocol.ReportEntry
	seen     string
	problems []string
}

// await waits until the call is settled up to upTo and judges its answer
// as x expects; a note of settled's follows expectOneReport's problems.
func (r *runner) await(ctx context.Context, cr *callRef, x exchange, upTo uint64) (*answer, error) {
	wait := x.waitMS
	if wait == 0 {
		wait = x.timeoutMS
	}
	es, note, err := r.settled(ctx, cr, wait, upTo)
	if err != nil {
		return nil, err
	}
	re, seen, problems := expectOneReport(es, x.status, x.byLedgerOK)
	if note != "" {
		problems = append(problems, note)
	}
	a := &answer{cr: cr, es: es, re: re, seen: seen, problems: problems}
	if n := a.duplicates(); n > 0 {
		// Shown in every case; the cases about a second run fail on it.
		a.seen += fmt.Sprintf("; reported %d more time(s) (duplicate entries)", n)
	}
	return a, nil
}

// roundTrip sends x's call and judges its answer, once its command is
// acknowledged.
func (r *runner) roundTrip(ctx context.Context, x exchange) (*answer, error) {
	cr, err := r.send(ctx, x)
	if err != nil {
		return nil, err
	}
	return r.await(ctx, cr, x, cr.dispatch.CommandSeq)
}

// awaitCopy appends a copy of the call's command, as a redelivery or a
// duplicate publish would bring it, and judges the call's answer once the
// copy too is acknowledged.
func (r *runner) awaitCopy(ctx context.Context, cr *callRef, x exchange) (*answer, error) {
	seq, err := r.copyCommand(ctx, x.kase, cr)
	if err != nil {
		return nil, err
	}
	return r.await(ctx, cr, x, seq)
}

// fail adds a problem.
func (a *answer) fail(problem string) { a.problems = append(a.problems, problem) }

// duplicates counts the call's duplicate entries (reports of a second run).
func (a *answer) duplicates() int { return len(kindOf(a.es, protocol.KindDuplicate)) }

// failOnDuplicates adds the problem format says of n, when the call has n
// duplicate entries.
func (a *answer) failOnDuplicates(format string) {
	if n := a.duplicates(); n > 0 {
		a.fail(fmt.Sprintf(format, n))
	}
}

// verdict is the case's row.
func (a *answer) verdict(expected string) CaseResult {
	return verdict(expected, a.seen, a.problems, a.cr.turn)
}

func (r *runner) caseNormal(ctx context.Context) (CaseResult, error) {
	exp := fmt.Sprintf("one report, status %s, by the service; the command acknowledged", r.f.Normal.Status)
	a, err := r.roundTrip(ctx, r.normalCall(CaseNormal, r.f.Normal.Status))
	if err != nil {
		return CaseResult{}, err
	}
	if len(a.problems) == 0 {
		r.normal = a.cr
	}
	return a.verdict(exp), nil
}

func (r *runner) caseStatus(ctx context.Context, status string) (CaseResult, error) {
	exp := "one report, status " + status
	c, ok := r.f.Statuses[status]
	if !ok && status == r.f.Normal.Status {
		c, ok = r.f.Normal, true
	}
	if !ok {
		return na(exp, "the fixture declares no call that ends "+status), nil
	}
	a, err := r.roundTrip(ctx, exchange{kase: caseStatusPrefix + status, args: c.Args, timeoutMS: c.TimeoutMS,
		status: status, byLedgerOK: status == protocol.StatusTimeout})
	if err != nil {
		return CaseResult{}, err
	}
	return a.verdict(exp), nil
}

func (r *runner) caseMetadata(ctx context.Context) (CaseResult, error) {
	exp := "the result card's metadata equal to the tool.call card's (unicode, <&>, U+2028)"
	x := r.normalCall(CaseMetadata, "")
	x.mod = func(d *protocol.DispatchRequest) {
		d.Card.Metadata = protocol.CardMetadata{TraceID: metadataTraceWithSpecial, ParentStepID: "<parent>&\u2028", StepID: "step\u00e9"}
		d.Identity.StepID = ""
	}
	a, err := r.roundTrip(ctx, x)
	if err != nil {
		return CaseResult{}, err
	}
	if a.re.ToolResultCardID != "" {
		cards, missing, err := r.c.GetCards(ctx, r.cfg.Project, []string{a.cr.cardID, a.re.ToolResultCardID})
		switch {
		case err != nil:
			return CaseResult{}, fmt.Errorf("read cards: %w", err)
		case len(missing) > 0 || len(cards) != 2:
			a.fail(fmt.Sprintf("cards missing: %v", missing))
		default:
			want, got := cards[0].Card.Metadata, cards[1].Card.Metadata
			if got != want {
				a.fail(fmt.Sprintf("result card metadata %+q, want %+q", got, want))
			} else {
				a.seen += "; metadata copied verbatim"
			}
		}
	}
	return a.verdict(exp), nil
}

func (r *runner) caseTraceparent(ctx context.Context) (CaseResult, error) {
	exp := "the report's traceparent in the dispatch's trace, with a span of its own (a child span)"
	var tid [16]byte
	var sid [8]byte
	_, _ = rand.Read(tid[:])
	_, _ = rand.Read(sid[:])
	tid[0] |= 1
	sid[0] |= 1
	trace, span := hex.EncodeToString(tid[:]), hex.EncodeToString(sid[:])
	x := r.normalCall(CaseTraceparent, "")
	x.mod = func(d *protocol.DispatchRequest) { d.Identity.Traceparent = "00-" + trace + "-" + span + "-01" }
	a, err := r.roundTrip(ctx, x)
	if err != nil {
		return CaseResult{}, err
	}
	if reps := kindOf(a.es, protocol.KindReport); len(reps) == 1 {
		tp := nats.Header(reps[0].Headers).Get(protocol.HeaderTraceparent)
		parts := strings.Split(tp, "-")
		switch {
		case tp == "":
			a.fail("the report carries no traceparent")
		case len(parts) != 4 || parts[1] != trace:
			a.fail(fmt.Sprintf("report traceparent %q is not in trace %s", tp, trace))
		case parts[2] == span:
			a.fail(fmt.Sprintf("report traceparent %q has the dispatch's own span id: no child span", tp))
		default:
			a.seen += "; traceparent " + tp
		}
	}
	return a.verdict(exp), nil
}

func (r *runner) caseAfterExecution(ctx context.Context) (CaseResult, error) {
	exp := "the report's after_execution is the command's (terminate), never rewritten"
	x := r.normalCall(CaseAfterExecution, "")
	x.mod = func(d *protocol.DispatchRequest) { d.Payload.AfterExecution = protocol.AfterTerminate }
	a, err := r.roundTrip(ctx, x)
	if err != nil {
		return CaseResult{}, err
	}
	if a.re.Status != "" {
		a.seen += "; after_execution " + a.re.AfterExecution
		if a.re.AfterExecution != protocol.AfterTerminate {
			a.fail("after_execution " + a.re.AfterExecution + ", want terminate")
		}
	}
	return a.verdict(exp), nil
}

// caseBadCommand sends a command no dispatch would publish, naming a call
// never dispatched, and expects its refusal through command.reject (a
// rejection entry of op command), its acknowledgement, and nothing else
// about the call: the tool never runs.
func (r *runner) caseBadCommand(ctx context.Context, k string) (CaseResult, error) {
	exp := "refused through command.reject (or the validation failure path), acknowledged, the tool never run"
	cr := r.newCall(k, 0)
	a, err := argsJSON(r.f.Normal.Args)
	if err != nil {
		return CaseResult{}, err
	}
	h := cr.identity.Header()
	payload := map[string]any{"tool_call_card_id": cr.cardID, "tool_name": r.f.ToolName, "after_execution": protocol.AfterSuspend,
		"deadline_unix_ms": time.Now().Add(time.Duration(r.f.TimeoutMS) * time.Millisecond).UnixMilli()}
	switch k {
	case CaseMissingCallID:
		h.Del(protocol.HeaderToolCallID)
	case CaseInlineArgs:
		payload["args"] = a
	case CaseUnknownCard:
		payload["tool_call_card_id"] = cr.cardID + "-missing"
	case CaseIdentityMismatch:
		payload["agent_turn_id"] = cr.turn + "-other"
	}
	body, err := json.Marshal(payload)
	if err != nil {
		return CaseResult{}, err
	}
	seq, err := r.command(ctx, k, cr.subject, h, body)
	if err != nil {
		return CaseResult{}, err
	}
	note, err := r.acked(ctx, seq)
	if err != nil {
		return CaseResult{}, err
	}
	// The service records its refusal before it acknowledges the command:
	// once acknowledged, what it wrote is in the entries read.
	if err := r.obs.poll(ctx); err != nil {
		return CaseResult{}, err
	}
	var problems []string
	seen := ""
	if note != "" {
		problems = append(problems, note)
	}
	if rej := r.commandRejection(k); rej != nil {
		seen = "command.reject: " + string(rej.Code)
	} else {
		problems = append(problems, "no rejection entry of op command for it")
	}
	for _, e := range r.obs.about(cr.turn) {
		kind := entryKind(e)
		if kind == string(protocol.KindCommand) && e.Seq == seq || kind == string(protocol.KindRejection) && isCommandRejection(e) {
			continue
		}
		problems = append(problems, fmt.Sprintf("the service acted on it: %s entry %d on %s", kind, e.Seq, e.Subject))
	}
	return verdict(exp, seen, problems, cr.turn), nil
}

// command appends a conformance command.
func (r *runner) command(ctx context.Context, kase, subject string, h nats.Header, body []byte) (uint64, error) {
	res, err := r.c.ConformanceCommand(ctx, r.cfg.Actor, protocol.ConformanceCommandRequest{
		ProjectID: r.cfg.Project, Run: r.run, Case: strings.ReplaceAll(kase, "_", "-"), Subject: subject, Headers: h, Payload: body,
	})
	if err != nil {
		return 0, fmt.Errorf("conformance.command: %w", err)
	}
	return res.Seq, nil
}

// commandRejection finds the rejection of op command recording the case's
// conformance command.
func (r *runner) commandRejection(k string) *protocol.RejectionEntry {
	want := strings.ReplaceAll(k, "_", "-")
	for _, e := range r.obs.entries {
		if entryKind(e) != string(protocol.KindRejection) {
			continue
		}
		var re protocol.RejectionEntry
		if json.Unmarshal(e.Data, &re) != nil || re.Op != protocol.OpCommand {
			continue
		}
		h := nats.Header(re.Request.Headers)
		if h.Get(protocol.HeaderConformance) == r.run && h.Get(protocol.HeaderConformanceCase) == want {
			return &re
		}
	}
	return nil
}

func isCommandRejection(e protocol.Entry) bool {
	var re protocol.RejectionEntry
	return json.Unmarshal(e.Data, &re) == nil && re.Op == protocol.OpCommand
}

// copyCommand appends a copy of the call's command, as a redelivery or a
// duplicate publish would bring it.
func (r *runner) copyCommand(ctx context.Context, kase string, cr *callRef) (uint64, error) {
	var orig *protocol.Entry
	for _, e := range kindOf(r.obs.about(cr.turn), protocol.KindCommand) {
		if e.Seq == cr.dispatch.CommandSeq {
			orig = &e
			break
		}
	}
	if orig == nil {
		ok, err := r.obs.waitFor(ctx, r.cfg.Settle, func() bool { return r.obs.bySeq(cr.dispatch.CommandSeq) != nil })
		if err != nil || !ok {
			return 0, errors.Join(err, fmt.Errorf("the command of %s (seq %d) is not visible", cr.turn, cr.dispatch.CommandSeq))
		}
		orig = r.obs.bySeq(cr.dispatch.CommandSeq)
	}
	h := nats.Header{}
	for k, v := range orig.Headers {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "nats-") || slices.ContainsFunc([]string{protocol.HeaderEntryKind, protocol.HeaderTime, protocol.HeaderActor, protocol.HeaderIdempotencyKey, protocol.HeaderConformance, protocol.HeaderConformanceCase}, func(s string) bool { return strings.EqualFold(s, k) }) {
			continue
		}
		h[k] = v
	}
	return r.command(ctx, kase, orig.Subject, h, orig.Data)
}

func (r *runner) caseRedeliveryAfter(ctx context.Context) (CaseResult, error) {
	exp := "a copy of an answered call's command acknowledged with no second run (no card, report, duplicate or refusal)"
	if r.normal == nil {
		return na(exp, "the normal case did not pass: no answered call to redeliver"), nil
	}
	cr := r.normal
	before := len(r.obs.about(cr.turn))
	seq, err := r.copyCommand(ctx, CaseRedeliveryAfter, cr)
	if err != nil {
		return CaseResult{}, err
	}
	note, err := r.acked(ctx, seq)
	if err != nil {
		return CaseResult{}, err
	}
	var problems []string
	if note != "" {
		problems = append(problems, note)
	}
	for _, e := range r.obs.about(cr.turn)[before:] {
		if e.Seq == seq {
			continue
		}
		problems = append(problems, fmt.Sprintf("second run: %s entry %d on %s", entryKind(e), e.Seq, e.Subject))
	}
	return verdict(exp, "acknowledged, nothing written", problems, cr.turn), nil
}

// delivered waits until a consumer of the tool delivered seq.
func (r *runner) delivered(ctx context.Context, seq uint64) (bool, error) {
	return r.obs.waitFor(ctx, r.cfg.Settle, func() bool {
		for _, c := range r.obs.consumers {
			if c.DeliveredStreamSeq >= seq {
				return true
			}
		}
		return false
	})
}

func (r *runner) caseRedeliveryBefore(ctx context.Context) (CaseResult, error) {
	exp := "a copy of the command delivered while the call runs: one run, one report, no duplicate or refusal"
	if r.f.Long == nil {
		return na(exp, "the fixture declares no long call"), nil
	}
	if r.det == protocol.DeterminismSideEffectful {
		return na(exp, "a side_effectful tool's copy meets the open attempt (side_effect_reconcile covers it)"), nil
	}
	x := r.longCall(CaseRedeliveryBefore, protocol.StatusSuccess)
	cr, err := r.send(ctx, x)
	if err != nil {
		return CaseResult{}, err
	}
	if ok, err := r.delivered(ctx, cr.dispatch.CommandSeq); err != nil || !ok {
		return verdict(exp, "", []string{"the command was never delivered to a consumer of the tool"}, cr.turn), err
	}
	a, err := r.awaitCopy(ctx, cr, x)
	if err != nil {
		return CaseResult{}, err
	}
	a.failOnDuplicates("%d duplicate report(s): the tool ran again on the copy, or the service sent its report again")
	return a.verdict(exp), nil
}

func (r *runner) caseDuplicate(ctx context.Context) (CaseResult, error) {
	exp := "the same command twice on the stream: one accepted report, no conflicting one, both acknowledged"
	x := r.normalCall(CaseDuplicateCommand, r.f.Normal.Status)
	cr, err := r.send(ctx, x)
	if err != nil {
		return CaseResult{}, err
	}
	a, err := r.awaitCopy(ctx, cr, x)
	if err != nil {
		return CaseResult{}, err
	}
	if n := a.duplicates(); n > 0 && r.det == protocol.DeterminismSideEffectful {
		a.fail(fmt.Sprintf("%d duplicate report(s) of a side_effectful tool: it ran twice", n))
	}
	return a.verdict(exp), nil
}

func (r *runner) caseCanceled(ctx context.Context) (CaseResult, error) {
	exp := "a call canceled before its command reaches the service: reported canceled by the service, the tool not run"
	_, err := r.c.PauseTool(ctx, r.cfg.Actor, protocol.ToolPauseRequest{ProjectID: r.cfg.Project, ToolName: r.f.ToolName, Reason: fmt.Sprintf(conformancePauseReason, r.run)})
	if e, ok := protocol.AsError(err); ok {
		return na(exp, "the tool cannot be paused to hold the call ("+string(e.Code)+": "+clip(e.Message, 120)+")"), nil
	} else if err != nil {
		return CaseResult{}, fmt.Errorf("tool.pause: %w", err)
	}
	resumed := false
	resume := func() error {
		if resumed {
			return nil
		}
		resumed = true
		_, err := r.c.ResumeTool(context.WithoutCancel(ctx), r.cfg.Actor, protocol.ToolPauseRequest{ProjectID: r.cfg.Project, ToolName: r.f.ToolName, Reason: "conformance run " + r.run + ": done"})
		return err
	}
	defer func() { _ = resume() }()
	x := r.normalCall(CaseCanceled, protocol.StatusCanceled)
	cr, err := r.send(ctx, x)
	if err != nil {
		return CaseResult{}, err
	}
	if _, err := r.c.Cancel(ctx, protocol.CancelRequest{ProjectID: r.cfg.Project, AgentID: r.agent, AgentTurnID: cr.turn, ToolCallID: cr.id, Reason: conformanceCancelReason}); err != nil {
		return CaseResult{}, fmt.Errorf("cancel: %w", err)
	}
	if err := resume(); err != nil {
		return CaseResult{}, fmt.Errorf("tool.resume: %w", err)
	}
	rec, err := r.c.GetCall(ctx, r.cfg.Project, cr.turn, cr.id)
	if err != nil {
		return CaseResult{}, fmt.Errorf("call.get: %w", err)
	}
	a, err := r.await(ctx, cr, x, rec.CommandSeq)
	if err != nil {
		return CaseResult{}, err
	}
	return a.verdict(exp), nil
}

func (r *runner) caseCanceledRunning(ctx context.Context) (CaseResult, error) {
	exp := "a call canceled while it runs: answered by the service, canceled or (run to its end) with its real outcome"
	if r.f.Long == nil {
		return na(exp, "the fixture declares no long call"), nil
	}
	x := r.longCall(CaseCanceledRunning, "")
	cr, err := r.send(ctx, x)
	if err != nil {
		return CaseResult{}, err
	}
	if ok, err := r.delivered(ctx, cr.dispatch.CommandSeq); err != nil || !ok {
		return verdict(exp, "", []string{"the command was never delivered to a consumer of the tool"}, cr.turn), err
	}
	if _, err := r.c.Cancel(ctx, protocol.CancelRequest{ProjectID: r.cfg.Project, AgentID: r.agent, AgentTurnID: cr.turn, ToolCallID: cr.id, Reason: "conformance: canceled while running"}); err != nil {
		if e, ok := protocol.AsError(err); !ok || e.Code != protocol.CodeConflict {
			return CaseResult{}, fmt.Errorf("cancel: %w", err)
		}
		// Reported before the cancel arrived: the answer is judged all the same.
	}
	a, err := r.await(ctx, cr, x, cr.dispatch.CommandSeq)
	if err != nil {
		return CaseResult{}, err
	}
	if st := a.re.Status; st != "" && st != protocol.StatusCanceled && st != protocol.StatusSuccess {
		a.fail("status " + st + ": neither canceled nor the long call's success")
	}
	return a.verdict(exp), nil
}

func (r *runner) caseDeadline(ctx context.Context) (CaseResult, error) {
	exp := "a deadline shorter than the tool: timeout reported once (no second or late report)"
	if r.f.Long == nil {
		return na(exp, "the fixture declares no long call"), nil
	}
	if r.det == protocol.DeterminismSideEffectful {
		return na(exp, "a side_effectful call past its deadline is outcome_unknown, not timeout"), nil
	}
	tmo := max(200, r.f.Long.DurationMS/4)
	a, err := r.roundTrip(ctx, exchange{kase: CaseDeadline, args: r.f.Long.Args, timeoutMS: tmo, waitMS: tmo + r.f.Long.DurationMS,
		status: protocol.StatusTimeout, byLedgerOK: true})
	if err != nil {
		return CaseResult{}, err
	}
	a.failOnDuplicates("reported %d more time(s) (duplicate entries)")
	return a.verdict(exp), nil
}

func (r *runner) caseHeartbeat(ctx context.Context) (CaseResult, error) {
	exp := "a call longer than two ack waits delivered once (in-progress acks keep it)"
	if r.f.Long == nil {
		return na(exp, "the fixture declares no long call"), nil
	}
	if err := r.obs.poll(ctx); err != nil {
		return CaseResult{}, err
	}
	if len(r.obs.consumers) == 0 {
		return na(exp, "no durable consumer of the tool"), nil
	}
	before := map[string]protocol.ConformanceConsumer{}
	var wait int64
	for _, c := range r.obs.consumers {
		before[c.Name] = c
		wait = max(wait, c.AckWaitMS)
	}
	if r.f.Long.DurationMS < 2*wait {
		return na(exp, fmt.Sprintf("the long call (%d ms) is shorter than two ack waits (%d ms)", r.f.Long.DurationMS, 2*wait)), nil
	}
	a, err := r.roundTrip(ctx, r.longCall(CaseHeartbeat, protocol.StatusSuccess))
	if err != nil {
		return CaseResult{}, err
	}
	for _, c := range r.obs.consumers {
		b, ok := before[c.Name]
		if !ok || c.DeliveredStreamSeq < a.cr.dispatch.CommandSeq {
			continue
		}
		if n := c.DeliveredConsumerSeq - b.DeliveredConsumerSeq; n != 1 {
			a.fail(fmt.Sprintf("consumer %s delivered %d time(s) during the call: redelivered for want of in-progress acks", c.Name, n))
		} else {
			a.seen += "; delivered once"
		}
	}
	return a.verdict(exp), nil
}

func (r *runner) caseIntent(ctx context.Context) (CaseResult, error) {
	exp := "attempt.start recorded before the tool runs, then one report"
	if r.det != protocol.DeterminismSideEffectful {
		return na(exp, "the tool is "+r.det+", not side_effectful"), nil
	}
	a, err := r.roundTrip(ctx, r.normalCall(CaseSideEffectIntent, r.f.Normal.Status))
	if err != nil {
		return CaseResult{}, err
	}
	atts, reps := kindOf(a.es, protocol.KindAttempt), kindOf(a.es, protocol.KindReport)
	switch {
	case len(atts) == 0:
		a.fail("no attempt entry: the tool ran without attempt.start")
	case len(reps) == 1 && atts[0].Seq > reps[0].Seq:
		a.fail("the attempt was recorded after the report")
	case len(atts) > 1:
		a.fail(fmt.Sprintf("%d attempts for one delivery", len(atts)))
	default:
		a.seen += "; attempt recorded first"
	}
	return a.verdict(exp), nil
}

// reconcileTries bounds the calls the reconcile case dispatches to open an
// attempt before the service does.
const reconcileTries = 5

func (r *runner) caseReconcile(ctx context.Context) (CaseResult, error) {
	exp := "a delivery meeting an open attempt: the tool not run; reconciled, outcome_unknown, or a new attempt after not_done"
	if r.det != protocol.DeterminismSideEffectful {
		return na(exp, "the tool is "+r.det+", not side_effectful"), nil
	}
	for try := range reconcileTries {
		x := r.normalCall(CaseSideEffectReconcile, "")
		x.n = try + 1
		cr, err := r.send(ctx, x)
		if err != nil {
			return CaseResult{}, err
		}
		// Open an attempt as a service that died would leave it, before
		// the service under test starts its own.
		st, err := r.tc.StartAttempt(ctx, protocol.AttemptStartRequest{ProjectID: r.cfg.Project, AgentTurnID: cr.turn, ToolCallID: cr.id, ExecutorID: conformanceExecutorID})
		if e, ok := protocol.AsError(err); ok && e.Code == protocol.CodeConflict {
			continue // the service answered it first
		} else if err != nil {
			return CaseResult{}, fmt.Errorf("attempt.start: %w", err)
		}
		if !st.Started {
			continue // the service started first: try again
		}
		a, err := r.await(ctx, cr, x, cr.dispatch.CommandSeq)
		if err != nil {
			return CaseResult{}, err
		}
		var second *protocol.AttemptEntry
		for _, e := range kindOf(a.es, protocol.KindAttempt) {
			var a protocol.AttemptEntry
			if json.Unmarshal(e.Data, &a) == nil && a.Attempt == 2 {
				second = &a
			}
		}
		switch re := a.re; {
		case re.AttemptOutcome == protocol.AttemptReconciled || re.AttemptOutcome == protocol.AttemptOutcomeUnknown:
			a.seen += "; attempt_outcome " + re.AttemptOutcome
		case second != nil && second.PreviousOutcome == protocol.AttemptNotDone:
			a.seen += "; reconciled not done, ran attempt 2"
		case re.Status != "":
			a.fail("the tool ran over the open attempt (report without attempt_outcome, no attempt 2 after not_done)")
		}
		return a.verdict(exp), nil
	}
	return na(exp, fmt.Sprintf("the service started its attempt before the checker could open one, %d times", reconcileTries)), nil
}
