package main

// The document: the operations are described here, the schemas of their
// answers are derived from the Go types that encode them (json tags; a
// field without omitempty is required).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/cgledger/cgledger/docs"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

type obj = map[string]any

func ref(name string) obj { return obj{"$ref": "#/components/schemas/" + name} }

// schemas derives JSON Schemas (2020-12, as OpenAPI 3.1 uses) from Go types
// into components.schemas, one per named struct type.
type schemas struct {
	defs  obj
	types map[string]reflect.Type
	// fieldDocs describe fields by "Type.json_name".
	fieldDocs map[string]string
}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

// name is the component name of a named struct type; a projector.Page[T] is
// "<T>Page".
func (s *schemas) name(t reflect.Type) string {
	n := t.Name()
	if i := strings.IndexByte(n, '['); i >= 0 {
		f, ok := t.FieldByName("Items")
		if !ok {
			panic("generic type without Items: " + n)
		}
		return s.name(f.Type.Elem()) + n[:i]
	}
	return n
}

func (s *schemas) of(t reflect.Type) obj {
	switch {
	case t == timeType:
		return obj{"type": "string", "format": "date-time"}
	case t == rawType:
		return obj{}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return s.of(t.Elem())
	case reflect.String:
		return obj{"type": "string"}
	case reflect.Bool:
		return obj{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return obj{"type": "integer"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return obj{"type": "integer", "minimum": 0}
	case reflect.Float32, reflect.Float64:
		return obj{"type": "number"}
	case reflect.Slice:
		return obj{"type": "array", "items": s.of(t.Elem())}
	case reflect.Map:
		return obj{"type": "object", "additionalProperties": s.of(t.Elem())}
	case reflect.Interface:
		return obj{}
	case reflect.Struct:
		n := s.name(t)
		if prev, ok := s.types[n]; ok {
			if prev != t {
				panic(fmt.Sprintf("two types named %s: %v and %v", n, prev, t))
			}
			return ref(n)
		}
		s.types[n] = t
		props, required := obj{}, []string{}
		s.fields(t, n, props, &required)
		sch := obj{"type": "object", "properties": props}
		if len(required) > 0 {
			sort.Strings(required)
			sch["required"] = required
		}
		s.defs[n] = sch
		return ref(n)
	}
	panic("no schema for " + t.String())
}

// fields adds t's JSON fields (embedded structs inlined, as encoding/json
// does) to props.
func (s *schemas) fields(t reflect.Type, owner string, props obj, required *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() && !f.Anonymous {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			s.fields(f.Type, owner, props, required)
			continue
		}
		if name == "" {
			name = f.Name
		}
		sch := s.of(f.Type)
		if d := s.fieldDocs[owner+"."+name]; d != "" {
			if _, isRef := sch["$ref"]; isRef {
				sch = obj{"allOf": []any{sch}, "description": d}
			} else {
				c := obj{}
				for k, v := range sch {
					c[k] = v
				}
				c["description"] = d
				sch = c
			}
		}
		props[name] = sch
		if !strings.Contains(opts, "omitempty") {
			*required = append(*required, name)
		}
	}
}

func param(name, in, desc string, sch obj) obj {
	p := obj{"name": name, "in": in, "description": desc, "schema": sch}
	if in == "path" {
		p["required"] = true
	}
	return p
}

func pref(name string) obj { return obj{"$ref": "#/components/parameters/" + name} }

func resp(name string) obj { return obj{"$ref": "#/components/responses/" + name} }

func jsonBody(desc string, sch obj) obj {
	return obj{"description": desc, "content": obj{"application/json": obj{"schema": sch}}}
}

// op is one documented operation.
type op struct {
	method, path, id, tag, summary, desc string
	params                               []obj
	ok                                   obj // the 2xx answers by status
	errs                                 []string
	open                                 bool
	body                                 obj
}

// identifier is a path id: an identifier in the protocol's sense (1 to
// 256 printable ASCII characters but '.', '*' and '>', and not "_").
var identifier = obj{"type": "string", "minLength": 1, "maxLength": 256, "pattern": `^[!-)+-\-/-=?-~]+$`,
	"description": "An identifier: 1 to 256 printable ASCII characters except '.', '*' and '>', and not \"_\"; anything else is a 400 (invalid_token)."}

func buildDocument() obj {
	s := &schemas{defs: obj{}, types: map[string]reflect.Type{}, fieldDocs: map[string]string{
		"ProjectInfo.first_seq":      "Sequence of the project's first entry: the first that wrote a view row of the project.",
		"ProjectInfo.first_time":     "Time of that entry (its CG-Time; 0001-01-01T00:00:00Z when it has none).",
		"RegistryPage.tools":         "Deprecated: the same as items, kept for clients of earlier releases; it goes away in a later release.",
		"RegistryPage.next_cursor":   "Pass as cursor for the next page; absent on the last page.",
		"RegistryTool.builtin":       "True for a built-in tool the project did not override (seq 0).",
		"TimelineItem.data":          "The entry's data: its JSON, or a JSON string when it is not JSON.",
		"TimelineItem.headers":       "The entry's CG-* and trace headers, each name to its values.",
		"TimelineItem.reason":        "Why an unrecognized entry is not a ledger entry, or the operator's reason for skipping a skipped one.",
		"CardVersion.card":           "The card's JSON as stored.",
		"ToolVersion.definition":     "The tool definition's JSON as registered.",
		"Problem.error":              "Deprecated: code, message (= detail), violations and rejection_seq in the shape of earlier releases; it goes away in a later release.",
		"CallStateAnswer.call":       "The call's state as of the query.",
		"ChainLink.link":             "The chain link after seq, 64 hex digits.",
		"SkipItem.effective":         "True when this skip entry recorded the entry it names as skipped.",
		"UnrecognizedEntry.code":     "Why the message is not a ledger entry: unknown_kind, no_kind, outside_grammar or kind_mismatch.",
		"DigestResult.digest":        "SHA-256 over every view row in key order, lower-case hex (docs/views.md#digest).",
		"DigestResult.chain_head":    "The chain head after applied_seq, hex.",
		"VerifyReport.reason":        "Why verification failed (only when ok is false).",
		"VerifyReport.first_bad_seq": "The first sequence that does not match (only when ok is false).",
	}}
	for _, page := range []any{projector.Page[projector.ProjectInfo]{}} {
		s.of(reflect.TypeOf(page))
	}
	sch := func(v any) obj { return s.of(reflect.TypeOf(v)) }

	// The problem body, as httpapi/problem writes it.
	sch(problem.Details{})
	s.defs["Problem"] = s.defs["Details"]
	delete(s.defs, "Details")
	s.defs["LegacyError"] = s.defs["Legacy"]
	delete(s.defs, "Legacy")
	problemSchema := s.defs["Problem"].(obj)
	problemSchema["description"] = "An error, as RFC 9457 problem details (application/problem+json). type is " +
		problem.TypeBase + "<code>; code and violations are the protocol's (docs/protocol.md); error is deprecated."
	props := problemSchema["properties"].(obj)
	props["type"] = obj{"type": "string", "format": "uri", "description": "Identifies the kind of problem: " + problem.TypeBase + "<code>."}
	props["error"] = obj{"allOf": []any{ref("LegacyError")}, "deprecated": true, "description": s.fieldDocs["Problem.error"]}
	props["violations"] = obj{"type": "array", "items": ref("Violation")}
	legacy := s.defs["LegacyError"].(obj)
	legacy["deprecated"] = true
	legacy["properties"].(obj)["violations"] = obj{"type": "array", "items": ref("Violation")}

	asOf := []obj{pref("as_of_seq"), pref("as_of")}
	paged := append(append([]obj{}, asOf...), pref("limit"), pref("cursor"))
	path := func(names ...string) []obj {
		var out []obj
		for _, n := range names {
			out = append(out, pref(n))
		}
		return out
	}
	join := func(parts ...[]obj) []obj {
		var out []obj
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	ok := func(desc string, v any) obj { return obj{"200": jsonBody(desc, sch(v))} }
	queryErrs := []string{"400", "401", "403", "500"}
	findErrs := []string{"400", "401", "403", "404", "500"}

	ops := []op{
		{method: "get", path: "/v1/projects", id: "listProjects", tag: "audit",
			summary: "The projects the views hold",
			desc: "Every project with at least one entry as of the query, by project id: a project is listed as of sequence S when its first entry's " +
				"sequence is at or before S. Needs an auditor or admin credential of every project (\"*\").",
			params: paged, ok: ok("A page of projects.", projector.Page[projector.ProjectInfo]{}), errs: queryErrs},
		{method: "get", path: "/v1/projects/{project}/turns/{turn}/timeline", id: "getTimeline", tag: "audit",
			summary: "A turn's timeline",
			desc: "Every entry of the turn in ledger order (commands, cards, reports, duplicates, wakeups, consumptions, cancels, rejections, " +
				"and the unrecognized, skipped and skip entries placed in it). 404 when the turn has no entries.",
			params: join(path("project", "turn"), asOf), ok: ok("The timeline.", projector.Timeline{}), errs: findErrs},
		{method: "get", path: "/v1/projects/{project}/turns/{turn}/cards", id: "listTurnCards", tag: "audit",
			summary: "A turn's cards", desc: "Every version of every card of the turn, in ledger order; an unknown turn has no items.",
			params: join(path("project", "turn"), paged), ok: ok("A page of card versions.", projector.Page[projector.CardVersion]{}), errs: queryErrs},
		{method: "get", path: "/v1/projects/{project}/turns/{turn}/calls/{call}", id: "getCallState", tag: "audit",
			summary: "A call's state", desc: "The state of the call (project, turn, tool_call_id) as of the query; 404 when there is none.",
			params: join(path("project", "turn", "call"), asOf), ok: ok("The call state.", projector.CallStateAnswer{}), errs: findErrs},
		{method: "get", path: "/v1/projects/{project}/calls", id: "listCalls", tag: "audit",
			summary: "A project's calls, filtered",
			desc: "Calls ordered by dispatch time. A page examines at most 10000 index rows, so a selective filter can answer fewer than limit " +
				"items (even none) with a next_cursor: page until next_cursor is absent.",
			params: join(path("project"), []obj{
				param("tool", "query", "Only calls of this tool.", obj{"type": "string"}),
				param("status", "query", "Only calls whose result has this status.", obj{"type": "string", "enum": []string{"success", "failed", "canceled", "timeout", "partial"}}),
				param("state", "query", "Only calls in this lifecycle state.", obj{"type": "string", "enum": []string{"awaiting_approval", "paused", "dispatched", "reported", "consumed", "rejected"}}),
				param("agent", "query", "Only calls of this agent.", obj{"type": "string"}),
				param("channel", "query", "Only calls on this channel.", obj{"type": "string"}),
				param("from", "query", "Dispatched at or after this time (RFC 3339).", obj{"type": "string", "format": "date-time"}),
				param("to", "query", "Dispatched at or before this time (RFC 3339); before from is a 400.", obj{"type": "string", "format": "date-time"}),
			}, paged), ok: ok("A page of call states.", projector.Page[projector.CallState]{}), errs: queryErrs},
		{method: "get", path: "/v1/projects/{project}/calls/{call}", id: "getCallStory", tag: "audit",
			summary: "A call's story", desc: "The state of each call using the tool_call_id (one per turn) and every entry, in ledger order; 404 when there are none.",
			params: join(path("project", "call"), []obj{param("turn", "query", "Only the call of this turn.", obj{"type": "string"})}, asOf),
			ok:     ok("The call story.", projector.CallStory{}), errs: findErrs},
		{method: "get", path: "/v1/projects/{project}/overview", id: "getOverview", tag: "audit",
			summary: "A project's overview",
			desc: "The calls dispatched in [from, to] (by dispatch time, as of the query) counted per status and per tool in time buckets, each tool's " +
				"p50/p95/max dispatch-to-report duration, and the rejections and duplicates on those calls. It examines at most 10000 calls " +
				"(one state read each): beyond that truncated is true and next_from is where the rest starts.",
			params: join(path("project"), []obj{
				param("from", "query", "Dispatched at or after this time (RFC 3339); absent: from the first call.", obj{"type": "string", "format": "date-time"}),
				param("to", "query", "Dispatched at or before this time (RFC 3339); before from is a 400.", obj{"type": "string", "format": "date-time"}),
				param("buckets", "query", "Time buckets (1 to 200; absent or 0 means 48).", obj{"type": "integer", "minimum": 0, "maximum": 200}),
			}, asOf), ok: ok("The overview.", projector.Overview{}), errs: queryErrs},
		{method: "get", path: "/v1/projects/{project}/agents/{agent}/inbox", id: "listInbox", tag: "audit",
			summary: "An agent's Inbox", desc: "Reported results in arrival order, each pending or consumed as of the query. " +
				"Needs an auditor or admin credential of the project, or, with state=pending only, a worker credential of the project bound to this agent or to none " +
				"(its recovery of missed wakeups, docs/protocol.md#recovering-missed-wakeups; the page and cursor are inbox.list's).",
			params: join(path("project", "agent"), []obj{param("state", "query", "Which entries (default all).", obj{"type": "string", "enum": []string{"pending", "consumed", "all"}})}, paged),
			ok:     ok("A page of Inbox entries.", projector.Page[projector.InboxEntry]{}), errs: queryErrs},
		{method: "get", path: "/v1/projects/{project}/agents/{agent}/roster", id: "getRoster", tag: "audit",
			summary: "An agent's roster entry", desc: "The agent's worker target as of the query and the sequence that set it; 404 when there is none.",
			params: join(path("project", "agent"), asOf), ok: ok("The roster entry.", projector.RosterAnswer{}), errs: findErrs},
		{method: "get", path: "/v1/projects/{project}/cards/{card}", id: "getCard", tag: "audit",
			summary: "A card and its versions", desc: "The card's latest version as of the query and every version up to it; 404 when there is none.",
			params: join(path("project", "card"), asOf), ok: ok("The card.", projector.CardResult{}), errs: findErrs},
		{method: "get", path: "/v1/projects/{project}/tools", id: "listProjectTools", tag: "audit",
			summary: "A project's registered tools", desc: "The tools registered in the project, each at its version in force as of the query, by name (built-ins are listed by the registry).",
			params: join(path("project"), paged), ok: ok("A page of tool versions.", projector.Page[projector.ToolVersion]{}), errs: queryErrs},
		{method: "get", path: "/v1/projects/{project}/tools/{tool}", id: "getProjectTool", tag: "audit",
			summary: "A tool's registration history", desc: "The version in force as of the query and every version up to it; 404 when not registered.",
			params: join(path("project", "tool"), asOf), ok: ok("The tool's history.", projector.ToolHistory{}), errs: findErrs},
		{method: "get", path: "/v1/projects/{project}/approvals", id: "listApprovals", tag: "approvals",
			summary: "A project's held calls",
			desc: "Calls held for approval in the order they were held (oldest first), each with its tool.call card's arguments, their digest and its decision " +
				"as of the query (docs/approvals.md). The page and cursor are approval.list's. Needs an approver, auditor or admin credential of the project.",
			params: join(path("project"), []obj{param("state", "query", "Which held calls (default pending).", obj{"type": "string", "enum": []string{"pending", "decided", "all"}})}, paged),
			ok:     ok("A page of held calls.", projector.Page[projector.ApprovalItem]{}), errs: queryErrs},
		{method: "get", path: "/v1/projects/{project}/approvals/{turn}/{call}", id: "getApproval", tag: "approvals",
			summary: "A held call", desc: "One held call as of the query (approval.get's item); 404 when the call was not held. Needs an approver, auditor or admin credential of the project.",
			params: join(path("project", "turn", "call"), asOf), ok: ok("The held call.", projector.ApprovalAnswer{}), errs: findErrs},
		{method: "post", path: "/v1/projects/{project}/approvals/{turn}/{call}/approve", id: "approve", tag: "approvals",
			summary: "Approve a held call",
			desc: "Sends the approve operation to the ledger as the bearer's approver name (docs/approvals.md): the body names the call's tool.call card and the digest " +
				"of its arguments (GET the held call for both). The ledger publishes the call's command. Refusals are the operation's, with every violation and " +
				"the rejection entry's rejection_seq: 400 bad_request, 403 forbidden (not a listed approver, self-approval), 404 unknown_call, 409 conflict " +
				"(decided already, or not held: the decision that won is named) or mismatch (another card or digest). Needs an approver credential of the project.",
			params: path("project", "turn", "call"), body: jsonBody("The card and digest decided on.", sch(DecisionBody{})),
			ok: ok("The decision recorded.", protocol.ApprovalResult{}), errs: []string{"400", "401", "403", "404", "409", "500"}},
		{method: "post", path: "/v1/projects/{project}/approvals/{turn}/{call}/deny", id: "deny", tag: "approvals",
			summary: "Deny a held call",
			desc:    "As approve, for deny: the call ends failed (auth_failed, A-APPROVAL-DENIED) with the reason. Needs an approver credential of the project.",
			params:  path("project", "turn", "call"), body: jsonBody("The card and digest decided on.", sch(DecisionBody{})),
			ok: ok("The decision recorded.", protocol.ApprovalResult{}), errs: []string{"400", "401", "403", "404", "409", "500"}},
		{method: "post", path: "/v1/projects/{project}/turns/{turn}/calls/{call}/cancel", id: "cancelCall", tag: "operator",
			summary: "Cancel any agent's call (operator)",
			desc: "Sends call.cancel to the ledger as the bearer admin credential's actor (its label when that is an identifier, else \"admin\"; " +
				"docs/operations.md#operator-actions): a running call gets its cancel entry (its executor stops it and reports canceled), a call held for " +
				"approval the decision canceled. A cancel already stored answers duplicate. Refusals are the operation's, with every violation and the " +
				"rejection entry's rejection_seq: 400 bad_request, 404 unknown_call, 409 conflict (the call already has a report). Needs an admin credential of the project.",
			params: path("project", "turn", "call"), body: jsonBody("Why.", sch(OperatorCancelBody{})),
			ok: ok("The entry that canceled the call.", protocol.OperatorCancelResult{}), errs: []string{"400", "401", "403", "404", "409", "500"}},
		{method: "post", path: "/v1/projects/{project}/turns/{turn}/calls/{call}/resolve", id: "resolveCall", tag: "operator",
			summary: "Resolve an outcome_unknown call (operator)",
			desc: "Sends call.resolve to the ledger as the bearer admin credential's actor: records (once per call) whether the side effect of a call " +
				"reported failed with S-TOOL-OUTCOME-UNKNOWN took place, applied or not_applied (docs/side-effects.md). The report is left as it is. The same " +
				"resolution again answers the stored one. Refusals: 400 bad_request, 404 unknown_call, 409 conflict (no such report, or resolved already: " +
				"the resolution named). Needs an admin credential of the project.",
			params: path("project", "turn", "call"), body: jsonBody("The effect and why.", sch(ResolveBody{})),
			ok: ok("The resolution recorded.", protocol.ResolveResult{}), errs: []string{"400", "401", "403", "404", "409", "500"}},
		{method: "post", path: "/v1/projects/{project}/turns/{turn}/calls/{call}/redrive", id: "redriveCall", tag: "operator",
			summary: "Redrive a failed or timed-out call (operator)",
			desc: "Sends call.redrive to the ledger as the bearer admin credential's actor (docs/operations.md#redrive): records (once per call) a redrive entry and " +
				"dispatches the derived call <call>~r<n>, with the same agent, turn, tool, arguments and idempotency key; its report wakes the same agent. The call's " +
				"own report is left as it is. The same actor and reason again answers the stored redrive (duplicate true). Refusals: 400 bad_request, 404 unknown_call, " +
				"409 conflict (no report, a report other than failed or timeout, a denied approval, a side_effectful call whose outcome is unknown and not resolved " +
				"not_applied, a derived id too long, or redriven already: the derived call named). Needs an admin credential of the project.",
			params: path("project", "turn", "call"), body: jsonBody("Why.", sch(RedriveBody{})),
			ok: ok("The redrive recorded and its derived call's dispatch.", protocol.RedriveResult{}), errs: []string{"400", "401", "403", "404", "409", "500"}},
		{method: "get", path: "/v1/unrecognized", id: "listUnrecognized", tag: "audit",
			summary: "Unrecognized stream messages", desc: "Messages the projector recorded as unrecognized (not ledger entries), in ledger order.",
			params: paged, ok: ok("A page of unrecognized entries.", projector.Page[projector.UnrecognizedEntry]{}), errs: queryErrs},
		{method: "get", path: "/v1/skipped", id: "listSkipped", tag: "audit",
			summary: "Skipped entries", desc: "Entries recorded as skipped because a skip entry named them, in ledger order.",
			params: paged, ok: ok("A page of skipped entries.", projector.Page[projector.SkippedEntry]{}), errs: queryErrs},
		{method: "get", path: "/v1/skips", id: "listSkips", tag: "audit",
			summary: "Skip entries", desc: "The valid skip entries, in ledger order.",
			params: paged, ok: ok("A page of skip entries.", projector.Page[projector.SkipItem]{}), errs: queryErrs},
		{method: "get", path: "/v1/digest", id: "getDigest", tag: "audit",
			summary: "The views' digest", desc: "The digest of every view row, with the applied sequence and chain head it belongs to (docs/views.md#digest).",
			ok: ok("The digest.", projector.DigestResult{}), errs: []string{"401", "403", "500"}},
		{method: "get", path: "/v1/verify", id: "verify", tag: "audit",
			summary: "Verify the live stream's chain", desc: "Recomputes the hash chain of the live stream and compares it with the views' (docs/tamper-evidence.md#verifying).",
			ok: ok("The verification report (ok false names the first bad sequence).", stream.VerifyReport{}), errs: []string{"401", "403", "404", "500"}},
		{method: "get", path: "/v1/chain/{seq}", id: "getChainLink", tag: "audit",
			summary: "The chain link after a sequence", desc: "The link the views recorded after applying seq; 404 when they have not applied it yet, or when it is in a range of entries that expired before they were archived (the message names the range).",
			params: path("seq"), ok: ok("The link.", projector.ChainLink{}), errs: findErrs},
		{method: "get", path: "/v1/export", id: "exportLedger", tag: "audit",
			summary: "Export the ledger", desc: "The ledger from from_seq on as an export file (docs/tamper-evidence.md), one JSON entry per line; a failure mid-stream aborts the connection. " +
				"404 not_found when entries the export needs are kept nowhere any more (lost before they were archived) or an archive segment does not verify (docs/durability.md#history-beyond-one-stream): retrying does not help.",
			params: []obj{param("from_seq", "query", "First sequence (default 1).", obj{"type": "integer", "minimum": 1})},
			ok:     obj{"200": obj{"description": "The export file.", "content": obj{"application/x-ndjson": obj{"schema": obj{"type": "string"}}}}},
			errs:   []string{"400", "401", "403", "404", "500"}},
		{method: "get", path: docs.OpenAPIPath, id: "getOpenAPI", tag: "operations", open: true,
			summary: "This document", desc: "The OpenAPI 3.1 document of the HTTP API. Open: it holds no data.",
			ok: obj{"200": jsonBody("The document.", obj{"type": "object"})}},
		{method: "get", path: "/projects/{project}/tools", id: "listTools", tag: "registry",
			summary: "List a project's tools",
			desc: "The tools registered in the project by name, then the built-ins it did not override (builtin true, seq 0), by name, read from the ledger. " +
				"tools repeats items and is deprecated. Any credential of the project.",
			params: join(path("project"), []obj{pref("limit"), pref("cursor")}), ok: ok("A page of tools.", executor.RegistryPage{}), errs: queryErrs},
		{method: "post", path: "/projects/{project}/tools", id: "registerTool", tag: "registry",
			summary: "Register a tool definition",
			desc: "Registers (or changes) a tool definition from a YAML or JSON body of at most 256 KiB (docs/executor.md#tool-definitions). 201 when a version was " +
				"written, 200 when the same definition was already in force; an invalid definition is a 400 listing every violation, with the " +
				"rejection entry's rejection_seq. Needs an admin credential of the project.",
			params: path("project"),
			body: obj{"required": true, "description": "The tool definition.", "content": obj{
				"application/yaml": obj{"schema": obj{"type": "string"}},
				"application/json": obj{"schema": obj{"type": "object"}},
			}},
			ok:   obj{"201": jsonBody("A new version was written.", sch(protocol.RegisterResult{})), "200": jsonBody("Unchanged: the same definition is in force.", sch(protocol.RegisterResult{}))},
			errs: queryErrs},
		{method: "get", path: "/projects/{project}/tools/{tool}", id: "getTool", tag: "registry",
			summary: "A tool's definition in force", desc: "The registered definition in force, or the built-in of that name; 404 otherwise.",
			params: path("project", "tool"), ok: ok("The tool.", executor.RegistryTool{}), errs: findErrs},
		{method: "post", path: "/projects/{project}/tools/{tool}/pause", id: "pauseTool", tag: "registry",
			summary: "Pause a tool",
			desc: "Runs tool.pause (docs/operations.md#operator-actions): from the pause entry on, every dispatch of the tool is held (state paused, no command; " +
				"its deadline keeps running) until a resume. Commands published before the pause are not held. The body's reason is required (at most 1024 bytes). " +
				"Refusals list every violation, with the rejection entry's rejection_seq: 400 bad_request, 404 not_found (neither registered nor built in), " +
				"409 conflict (paused already). Needs an admin credential of the project; the entry's actor is the credential's label.",
			params: path("project", "tool"), body: jsonBody("The operator's reason.", sch(executor.ToolPauseBody{})),
			ok: ok("The pause entry.", protocol.ToolPauseResult{}), errs: []string{"400", "401", "403", "404", "409", "500"}},
		{method: "post", path: "/projects/{project}/tools/{tool}/resume", id: "resumeTool", tag: "registry",
			summary: "Resume a paused tool",
			desc: "Runs tool.resume: the commands of the calls held while paused are published in dispatch order with their original deadlines (those " +
				"whose deadline passed ended timeout and are not released); released counts them. 409 conflict when the tool is not paused. As pause otherwise.",
			params: path("project", "tool"), body: jsonBody("The operator's reason.", sch(executor.ToolPauseBody{})),
			ok: ok("The resume entry and the calls released.", protocol.ToolPauseResult{}), errs: []string{"400", "401", "403", "404", "409", "500"}},
		{method: "get", path: "/healthz", id: "health", tag: "operations", open: true,
			summary: "Liveness", desc: "The process and its NATS connection. Answered from the start of serve, while it restores its views or waits for the cluster (200 before the connection is made).",
			ok: obj{"200": jsonBody("Alive and connected.", ref("Health")), "503": jsonBody("NATS disconnected.", ref("Health"))}},
		{method: "get", path: "/readyz", id: "ready", tag: "operations", open: true,
			summary: "Readiness", desc: "Ready once the projector caught up at start; 503 with a reason otherwise (catching up, stopped on a gap or corrupt entry, storage trouble, shutting down). " +
				"Answered from the start of serve: while it starts (restoring its views, waiting for the cluster) every path but /healthz, /readyz, /metrics and /v1/openapi.json answers 503 problem starting (Retry-After).",
			ok: obj{"200": jsonBody("Ready.", ref("Readiness")), "503": jsonBody("Not ready.", ref("Readiness"))}},
		{method: "get", path: "/metrics", id: "metrics", tag: "operations", open: true,
			summary: "Prometheus metrics", desc: "The Prometheus text exposition (docs/operations.md).",
			ok: obj{"200": obj{"description": "The metrics.", "content": obj{"text/plain": obj{"schema": obj{"type": "string"}}}}}},
	}

	s.defs["Health"] = obj{"type": "object", "required": []string{"status"}, "properties": obj{
		"status": obj{"type": "string", "description": "ok, or nats disconnected."}}}
	s.defs["Readiness"] = obj{"type": "object", "required": []string{"status", "roles"}, "properties": obj{
		"status": obj{"type": "string", "enum": []string{"ready", "not ready"}},
		"reason": obj{"type": "string", "description": "Why not ready."},
		"step": obj{"type": "string", "enum": []string{"starting", "restoring_views", "catching_up", "shutting_down"},
			"description": "With a 503 for a step of serve's own life rather than a fault (absent for a fault): a start-up part runs or waits for the cluster, a views snapshot is restored, the projector's catch-up at start (a rebuild included), the shutdown."},
		"roles":                obj{"type": "array", "items": obj{"type": "string"}, "description": "The roles this process runs (api, executor, projector)."},
		"applied_seq":          obj{"type": "integer", "minimum": 0, "description": "The projector's applied sequence (with the projector role)."},
		"last_seq":             obj{"type": "integer", "minimum": 0, "description": "The ledger stream's last sequence (absent when the stream cannot be read within a second): with applied_seq, how far a catch-up has to go."},
		"first_seq":            obj{"type": "integer", "minimum": 1, "description": "With retention set, or an archive written before: the first sequence the stream still keeps (tool definitions and roster entries are kept for good, so it can stay low); absent when the stream cannot be read within a second."},
		"archived_seq":         obj{"type": "integer", "minimum": 0, "description": "With retention set or an archive written before: the last sequence in a sealed archive segment (docs/durability.md#history-beyond-one-stream)."},
		"archive_lost_entries": obj{"type": "integer", "minimum": 1, "description": "How many entries expired before they were archived (absent when none did; docs/durability.md#history-beyond-one-stream)."},
	}}

	paths := obj{}
	for _, o := range ops {
		item, _ := paths[o.path].(obj)
		if item == nil {
			item = obj{}
			paths[o.path] = item
		}
		responses := obj{}
		for code, r := range o.ok {
			responses[code] = r
		}
		for _, code := range o.errs {
			responses[code] = resp(errorResponses[code].name)
		}
		// Every operation but the open ones is answered 503 starting
		// while serve starts (cmd/cgledger/servestarting.go): only the
		// open endpoints are served before the whole router.
		if !o.open {
			responses["503"] = resp(errorResponses["503"].name)
		}
		operation := obj{"operationId": o.id, "tags": []string{o.tag}, "summary": o.summary, "description": o.desc, "responses": responses}
		if len(o.params) > 0 {
			operation["parameters"] = o.params
		}
		if o.body != nil {
			operation["requestBody"] = o.body
		}
		if o.open {
			operation["security"] = []any{}
		}
		item[o.method] = operation
	}

	responses := obj{}
	for _, r := range errorResponses {
		responses[r.name] = obj{"description": r.desc, "content": obj{problem.ContentType: obj{"schema": ref("Problem")}}}
	}
	responses["MethodNotAllowed"].(obj)["headers"] = obj{"Allow": obj{"description": "The methods the path is served for.", "schema": obj{"type": "string"}}}
	responses["Starting"].(obj)["headers"] = obj{"Retry-After": obj{"description": "Seconds to wait before retrying (1).", "schema": obj{"type": "integer", "minimum": 0}}}

	return obj{
		"openapi": "3.1.0",
		"info": obj{
			"title":   "cgledger HTTP API",
			"version": "1",
			"description": "The audit API (/v1), the ledger export, the tool registry (/projects) and the operational endpoints of `cgledger serve` " +
				"(docs/audit-api.md, docs/executor.md#tool-definitions). Lists take limit (default " + fmt.Sprint(projector.DefaultLimit) +
				", at most " + fmt.Sprint(projector.MaxLimit) + ") and cursor, and answer items and next_cursor (absent on the last page). " +
				"Errors are RFC 9457 problem details (application/problem+json): a request no route serves is 404, or 405 with Allow " +
				"when its path is served for other methods.",
		},
		"servers":  []any{obj{"url": "http://127.0.0.1:8080", "description": "cgledger serve's default HTTP address"}},
		"security": []any{obj{"bearer": []string{}}},
		"tags": []any{
			obj{"name": "audit", "description": "The audit API: views of the ledger as of any sequence or time."},
			obj{"name": "approvals", "description": "Held calls and their decisions (docs/approvals.md)."},
			obj{"name": "operator", "description": "Operator actions on calls, recorded as entries (docs/operations.md#operator-actions)."},
			obj{"name": "registry", "description": "The tool registry management API."},
			obj{"name": "operations", "description": "Health, readiness, metrics and this document: open, no credential."},
		},
		"paths": paths,
		"components": obj{
			"securitySchemes": obj{"bearer": obj{"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
				"description": "The user JWT of a credential from `cgledger creds issue` (docs/security.md#permission-matrix)."}},
			"schemas": s.defs,
			"parameters": obj{
				"as_of_seq": param("as_of_seq", "query", "Answer as the views stood right after this sequence (wins over as_of; above the applied sequence answers for it).", obj{"type": "integer", "minimum": 0}),
				"as_of":     param("as_of", "query", "Answer as of the last entry at or before this time (RFC 3339, 1970-01-01T00:00:00Z to 2262-04-11T23:47:16Z).", obj{"type": "string", "format": "date-time"}),
				"limit":     param("limit", "query", fmt.Sprintf("Items per page: absent or 0 means %d; above %d is a 400.", projector.DefaultLimit, projector.MaxLimit), obj{"type": "integer", "minimum": 0, "maximum": projector.MaxLimit}),
				"cursor":    param("cursor", "query", "The next_cursor of the previous page.", obj{"type": "string"}),
				"project":   param("project", "path", "Project id.", identifier),
				"turn":      param("turn", "path", "agent_turn_id.", identifier),
				"call":      param("call", "path", "tool_call_id.", identifier),
				"agent":     param("agent", "path", "agent_id.", identifier),
				"card":      param("card", "path", "card_id.", identifier),
				"tool":      param("tool", "path", "tool_name.", identifier),
				"seq":       param("seq", "path", "A ledger sequence.", obj{"type": "integer", "minimum": 1}),
			},
			"responses": responses,
		},
	}
}

type errorResponse struct{ name, desc string }

var errorResponses = map[string]errorResponse{
	"400": {"BadRequest", "bad_request: every parameter problem listed in violations."},
	"401": {"Unauthenticated", "unauthenticated: no valid bearer token (WWW-Authenticate: Bearer)."},
	"403": {"Forbidden", "forbidden: the credential is for another project or role."},
	"404": {"NotFound", "not_found: nothing found, or no such endpoint."},
	"409": {"Conflict", "conflict or mismatch: the call was decided, reported or resolved already (or is not in the state the operation needs: the violations say which), or the card or digest is not the call's."},
	"405": {"MethodNotAllowed", "method_not_allowed: the path is served for other methods (Allow)."},
	"500": {"Internal", "internal: the server could not answer; retry."},
	"503": {"Starting", "starting: serve is still starting (restoring its views, waiting for the cluster) and answers only /healthz, /readyz, /metrics and /v1/openapi.json until it serves; retry after Retry-After seconds (/readyz names the step)."},
}

// DecisionBody is the body of POST .../approve and .../deny.
type DecisionBody struct {
	ToolCallCardID  string `json:"tool_call_card_id"`
	ArgumentsDigest string `json:"arguments_digest"`
	Reason          string `json:"reason,omitempty"`
}

// OperatorCancelBody is the body of POST .../calls/{call}/cancel.
type OperatorCancelBody struct {
	Reason string `json:"reason"`
}

// ResolveBody is the body of POST .../calls/{call}/resolve.
type ResolveBody struct {
	Effect string `json:"effect"`
	Reason string `json:"reason"`
}

// RedriveBody is the body of POST .../calls/{call}/redrive.
type RedriveBody struct {
	Reason string `json:"reason"`
}

// encodeDocument is the file's bytes: indented JSON, keys sorted.
func encodeDocument(doc obj) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		panic(err)
	}
	return b.Bytes()
}
