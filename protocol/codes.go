package protocol

// CodeKind names one of the vocabularies of codes cgledger answers with.
type CodeKind string

// The vocabularies of the catalogue.
const (
	// KindError is the code of an API refusal (Code: APIReply's
	// error.code and a rejection entry's reason), docs/protocol.md,
	// "Errors".
	KindError CodeKind = "error"
	// KindTaxonomy is a result card's error.detail.taxonomy_code: the
	// precise cause of a failed call, docs/executor.md, "Outcomes and their
	// L0 mapping".
	KindTaxonomy CodeKind = "taxonomy"
	// KindL0 is a result card's error.code (RecommendedErrorCodes): the
	// coarse class an agent reads.
	KindL0 CodeKind = "l0"
	// KindProblem is the code of an HTTP problem details answer, its type
	// https://cgledger.dev/problems/<code>, docs/audit-api.md, "Errors".
	KindProblem CodeKind = "problem"
)

// CodeInfo is one code of the catalogue.
type CodeInfo struct {
	Kind CodeKind
	Code string
	// Meaning is what the code says, as the docs say it.
	Meaning string
	// Retry says repeating the same request (for a call's codes, running
	// the call again) can succeed; a refusal of what was sent cannot.
	Retry bool
	// Status is a problem's HTTP status; 0 for the other kinds.
	Status int
}

// Codes is the catalogue of every code cgledger answers with, by kind. The
// tables of the docs are tested against it, both ways.
var Codes = []CodeInfo{
	{Kind: KindError, Code: string(CodeBadRequest), Meaning: "malformed request; violations lists every problem"},
	{Kind: KindError, Code: string(CodeUnknownCall), Meaning: "no call (project_id, agent_turn_id, tool_call_id) was dispatched through the ledger"},
	{Kind: KindError, Code: string(CodeUnknownCard), Meaning: "the referenced card does not exist"},
	{Kind: KindError, Code: string(CodeMismatch), Meaning: "the request does not match what is stored (its call, its result card, the call's agent)"},
	{Kind: KindError, Code: string(CodeStaleEpoch), Meaning: "turn_epoch is not the epoch the call was dispatched with"},
	{Kind: KindError, Code: string(CodeConflict), Meaning: "a different value already exists for the same identity, or the call's state forbids the request"},
	{Kind: KindError, Code: string(CodeNotFound), Meaning: "a read found nothing, or a write names a tool neither registered nor built in"},
	{Kind: KindError, Code: string(CodeNotReported), Meaning: "inbox.consume of a call with no accepted report"},
	{Kind: KindError, Code: string(CodeForbidden), Meaning: "the request names a project or actor other than its API subject's, or a call dispatched to another tool"},
	{Kind: KindError, Code: string(CodeInternal), Meaning: "the ledger could not finish (NATS unavailable, timeout); nothing was refused", Retry: true},

	{Kind: KindTaxonomy, Code: "R-TIMEOUT-001", Meaning: "the tool did not finish by the call's deadline (the executor's)", Retry: true},
	{Kind: KindTaxonomy, Code: TaxonomyDeadlineTimeout, Meaning: "nobody reported the call by its deadline (the ledger's)"},
	{Kind: KindTaxonomy, Code: CodeToolUnavailable, Meaning: "no tool service pulled the tool's commands within health.fail_fast_after_ms (dispatch again)"},
	{Kind: KindTaxonomy, Code: CodeToolOutcomeUnknown, Meaning: "an attempt of a side_effectful tool was left open by a crash and no reconcile found its outcome"},
	{Kind: KindTaxonomy, Code: "S-TOOL-RESULT", Meaning: "the ledger refuses the tool's result as a card (too large)"},
	{Kind: KindTaxonomy, Code: "I-REQ-001", Meaning: "the call's arguments do not validate against the tool's parameters"},
	{Kind: KindTaxonomy, Code: "C-CONTRACT-001", Meaning: "unknown tool, or its pinned definition is gone"},
	{Kind: KindTaxonomy, Code: "C-CONTRACT-002", Meaning: "the command is not on the tool's target subject"},
	{Kind: KindTaxonomy, Code: CodeResultContract, Meaning: "the tool's result breaks its result_schema"},
	{Kind: KindTaxonomy, Code: TaxonomyApprovalDenied, Meaning: "an approver denied the call"},
	{Kind: KindTaxonomy, Code: TaxonomyApprovalExpired, Meaning: "no approver decided before the approval's timeout"},

	{Kind: KindL0, Code: ErrorCodeToolTimeout, Meaning: "the call ran out of time", Retry: true},
	{Kind: KindL0, Code: ErrorCodeAuthFailed, Meaning: "the call was not allowed (an authorization failed, an approver denied it)"},
	{Kind: KindL0, Code: ErrorCodeBadRequest, Meaning: "the call's request was wrong (arguments, preconditions, contract)"},
	{Kind: KindL0, Code: ErrorCodeUpstreamUnavailable, Meaning: "what the tool depends on (or the tool itself) was unavailable", Retry: true},
	{Kind: KindL0, Code: ErrorCodeInternal, Meaning: "the tool failed on its own", Retry: true},
	{Kind: KindL0, Code: ErrorCodeCanceled, Meaning: "the worker canceled the call"},

	{Kind: KindProblem, Code: string(CodeBadRequest), Status: 400, Meaning: "parameters, path ids, cursors or paths are invalid; violations lists every problem"},
	{Kind: KindProblem, Code: "unauthenticated", Status: 401, Meaning: "no valid bearer token"},
	{Kind: KindProblem, Code: string(CodeForbidden), Status: 403, Meaning: "the credential may not make this request (another project or role)"},
	{Kind: KindProblem, Code: string(CodeNotFound), Status: 404, Meaning: "nothing found, no such endpoint, or a role this process does not run (violation not_served)"},
	{Kind: KindProblem, Code: "method_not_allowed", Status: 405, Meaning: "the path is served, not for this method (Allow lists those it is)"},
	{Kind: KindProblem, Code: string(CodeInternal), Status: 500, Meaning: "the server could not finish", Retry: true},
	{Kind: KindProblem, Code: "starting", Status: 503, Meaning: "serve is still starting (restoring its views, waiting for the cluster): only /healthz, /readyz, /metrics and /v1/openapi.json answer", Retry: true},
}

// CodesOf lists the catalogue's codes of kind, in its order.
func CodesOf(kind CodeKind) []CodeInfo {
	var out []CodeInfo
	for _, c := range Codes {
		if c.Kind == kind {
			out = append(out, c)
		}
	}
	return out
}
