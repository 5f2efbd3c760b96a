package protocol

import (
	"encoding/json"
	"errors"
)

// API subjects: the ledger's operations over NATS request/reply, for clients
// in any language (docs/protocol.md, "Ledger API"). A request goes to
// cgledger.v1.<project_id>.<actor>.<op>: the project and the actor (the agent
// or tool the caller acts as) sit in the subject so that NATS permissions can
// scope them, and the ledger checks the request against them. They sit
// outside the cg.> namespace so the ledger stream never captures a request.
const APIPrefix = "cgledger.v1"

// GlobalProject is the project token of API operations that belong to no
// project (projector.skip). "_" is never a valid project id.
const GlobalProject = "_"

// Operation names, as recorded in rejection entries and metrics.
const (
	OpCardPut      = "card.put"
	OpDispatch     = "dispatch"
	OpReport       = "report"
	OpRosterSet    = "roster.set"
	OpConsume      = "inbox.consume"
	OpToolRegister = "tool.register"
	OpCancel       = "cancel"
	OpCommand      = "command"
)

// Read operations (writes are the Op* names of rejection entries).
const (
	OpCardGet      = "card.get"
	OpRosterGet    = "roster.get"
	OpCallGet      = "call.get"
	OpToolGet      = "tool.get"
	OpToolList     = "tool.list"
	OpToolConsumer = "tool.consumer"
	OpCancelGet    = "cancel.get"
	// OpProjectorSkip is global: its subject's project token is "_".
	OpProjectorSkip = "projector.skip"
	// OpInboxList lists an agent's pending results. The views (the
	// projector) answer it, not the ledger, whose call records are keyed
	// by call, not by agent (docs/decisions.md, "Recovering missed wakeups").
	OpInboxList = "inbox.list"
	// OpViewsSnapshot takes a snapshot of the views of the serve process
	// that answers it (docs/protocol.md#viewssnapshot). It is global, like
	// projector.skip: its subject's project token is "_".
	OpViewsSnapshot = "views.snapshot"
	// OpViewsSnapshotList lists the snapshots of the views where the
	// answering serve process keeps them; global, an admin's.
	OpViewsSnapshotList = "views.snapshot.list"
)

// Writes an executor in another process makes besides its reports: finishing
// a stored report whose wakeup is missing, and recording a command it
// refused (recorded as a rejection of op OpCommand).
const (
	OpResume        = "report.resume"
	OpCommandReject = "command.reject"
)

// APISubject is the subject of an API operation for project, sent by actor.
func APISubject(project, actor, op string) string {
	return APIPrefix + "." + project + "." + actor + "." + op
}

// APIReply is the body of every API reply: Result on success, Error otherwise.
type APIReply struct {
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *Error          `json:"error,omitempty"`
}

// HeaderActor names, on an entry written for an API request, the actor token
// of the request's subject (cgledger.v1.<project>.<actor>.<op>): the agent,
// tool or person NATS let publish it. It records who asked.
const HeaderActor = "CG-Actor"

// CodeForbidden: the request names a project or an actor other than the one
// its API subject (which NATS permissions scope) grants.
const CodeForbidden Code = "forbidden"

// ErrForbidden matches every *Error with code forbidden.
var ErrForbidden = errors.New("forbidden")

func init() { sentinelByCode[CodeForbidden] = ErrForbidden }
