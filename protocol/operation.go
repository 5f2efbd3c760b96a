package protocol

import (
	"fmt"
	"slices"
	"strings"
)

// Role is a kind of client of the API, as a credential names it
// (internal/auth grants one per credential).
type Role string

// The roles that call the API. The ledger's own role is no client of it.
const (
	RoleWorker  Role = "worker"
	RoleTool    Role = "tool"
	RoleAuditor Role = "auditor"
	RoleAdmin   Role = "admin"
	// RoleApprover decides held calls (approve, deny) and reads them, as
	// one named approver of one project.
	RoleApprover Role = "approver"
)

// Server names the part of cgledger that answers an operation.
type Server string

// Servers of the API operations.
const (
	// ServerLedger is the ledger's API server (ledger.ServeAPI).
	ServerLedger Server = "ledger"
	// ServerViews is the projector's API server (projector.ServeAPI): the
	// reads whose answer is a view, not a call record.
	ServerViews Server = "views"
)

// Operation is one API operation: the <op> of its subject
// (cgledger.v1.<project_id>.<actor>.<op>) and what the rest of cgledger
// does with it. The table Operations is the only list of them: the API
// servers subscribe it, the caller check reads it, refusals are recorded
// and operator actions counted by it, and the NATS permissions of every
// role are built from it.
type Operation struct {
	// Name is the <op> token, as recorded in rejection entries and metrics.
	Name string
	// Write says the operation may change the ledger: every refusal of it
	// is recorded as a rejection entry (a read's only when nobody can be
	// told, having no reply subject that is an inbox).
	Write bool
	// Global says the operation belongs to no project: its subject's
	// project token is GlobalProject and only an admin of every project may
	// call it.
	Global bool
	// Roles may call the operation in their project. An admin's permission
	// covers every operation of its project (or, with every project, the
	// global ones too); RoleAdmin is listed all the same.
	Roles []Role
	// AdminOnly says only an admin may call it, and no other role's
	// permissions name it: the operator actions and conformance runs,
	// recorded with the admin's actor token. tool.register, which an admin
	// alone may call too, is a definition, not an action, and is not one.
	AdminOnly bool
	// OperatorAction says cgledger_operator_actions_total counts it.
	OperatorAction bool
	// BodyAgent says the body's agent_id is the caller's: the caller check
	// holds it to the subject's actor, as it holds every body's project_id
	// to the subject's project (CheckCaller).
	BodyAgent bool
	// Server answers it.
	Server Server
}

// Role sets of the table.
var (
	workerToolAuditor = []Role{RoleWorker, RoleTool, RoleAuditor, RoleAdmin}
	workerAuditor     = []Role{RoleWorker, RoleAuditor, RoleAdmin}
	workerOnly        = []Role{RoleWorker, RoleAdmin}
	toolOnly          = []Role{RoleTool, RoleAdmin}
	workerTool        = []Role{RoleWorker, RoleTool, RoleAdmin}
	adminOnly         = []Role{RoleAdmin}
	approvalReaders   = []Role{RoleAuditor, RoleApprover, RoleAdmin}
	approvers         = []Role{RoleApprover, RoleAdmin}
)

// Operations is every API operation (docs/protocol.md, "Ledger API").
var Operations = []Operation{
	{Name: OpCardPut, Write: true, Roles: workerTool, Server: ServerLedger},
	{Name: OpCardGet, Roles: workerToolAuditor, Server: ServerLedger},
	{Name: OpDispatch, Write: true, Roles: workerOnly, Server: ServerLedger},
	{Name: OpRosterSet, Write: true, Roles: workerOnly, BodyAgent: true, Server: ServerLedger},
	{Name: OpRosterGet, Roles: workerAuditor, Server: ServerLedger},
	{Name: OpCallGet, Roles: workerToolAuditor, Server: ServerLedger},
	{Name: OpCancelGet, Roles: workerToolAuditor, Server: ServerLedger},
	{Name: OpConsume, Write: true, Roles: workerOnly, BodyAgent: true, Server: ServerLedger},
	{Name: OpInboxList, Roles: workerOnly, BodyAgent: true, Server: ServerViews},
	{Name: OpCancel, Write: true, Roles: workerOnly, BodyAgent: true, Server: ServerLedger},
	{Name: OpCommit, Write: true, Roles: workerOnly, BodyAgent: true, Server: ServerLedger},
	{Name: OpAbort, Write: true, Roles: workerOnly, BodyAgent: true, Server: ServerLedger},
	{Name: OpReport, Write: true, Roles: toolOnly, Server: ServerLedger},
	{Name: OpReportResult, Write: true, Roles: toolOnly, Server: ServerLedger},
	{Name: OpResume, Write: true, Roles: toolOnly, Server: ServerLedger},
	{Name: OpCommandReject, Write: true, Roles: toolOnly, Server: ServerLedger},
	{Name: OpAttemptStart, Write: true, Roles: toolOnly, Server: ServerLedger},
	{Name: OpPrepare, Write: true, Roles: toolOnly, Server: ServerLedger},
	{Name: OpToolGet, Roles: workerToolAuditor, Server: ServerLedger},
	{Name: OpToolList, Roles: workerAuditor, Server: ServerLedger},
	{Name: OpToolConsumer, Roles: toolOnly, Server: ServerLedger},
	{Name: OpApprove, Write: true, Roles: approvers, Server: ServerLedger},
	{Name: OpDeny, Write: true, Roles: approvers, Server: ServerLedger},
	{Name: OpApprovalList, Roles: approvalReaders, Server: ServerViews},
	{Name: OpApprovalGet, Roles: approvalReaders, Server: ServerViews},
	{Name: OpToolRegister, Write: true, Roles: adminOnly, Server: ServerLedger},
	{Name: OpCallCancel, Write: true, Roles: adminOnly, AdminOnly: true, OperatorAction: true, Server: ServerLedger},
	{Name: OpCallResolve, Write: true, Roles: adminOnly, AdminOnly: true, OperatorAction: true, Server: ServerLedger},
	{Name: OpCallRedrive, Write: true, Roles: adminOnly, AdminOnly: true, OperatorAction: true, Server: ServerLedger},
	{Name: OpToolPause, Write: true, Roles: adminOnly, AdminOnly: true, OperatorAction: true, Server: ServerLedger},
	{Name: OpToolResume, Write: true, Roles: adminOnly, AdminOnly: true, OperatorAction: true, Server: ServerLedger},
	{Name: OpConformanceCommand, Write: true, Roles: adminOnly, AdminOnly: true, Server: ServerLedger},
	{Name: OpConformanceObserve, Roles: adminOnly, AdminOnly: true, Server: ServerLedger},
	{Name: OpProjectorSkip, Global: true, Roles: adminOnly, Server: ServerLedger},
	{Name: OpViewsSnapshot, Global: true, Roles: adminOnly, Server: ServerViews},
	{Name: OpViewsSnapshotList, Global: true, Roles: adminOnly, Server: ServerViews},
}

var opByName = func() map[string]Operation {
	m := make(map[string]Operation, len(Operations))
	for _, o := range Operations {
		m[o.Name] = o
	}
	return m
}()

// Op returns the operation named name.
func Op(name string) (Operation, bool) {
	o, ok := opByName[name]
	return o, ok
}

// IsWrite reports whether name is a write operation of the table.
func IsWrite(name string) bool { return opByName[name].Write }

// IsOperatorAction reports whether cgledger_operator_actions_total counts
// operation name.
func IsOperatorAction(name string) bool { return opByName[name].OperatorAction }

// CalledBy reports whether role may call the operation.
func (o Operation) CalledBy(role Role) bool { return slices.Contains(o.Roles, role) }

// OpsOf lists, in table order, the names of the project operations role
// may call. For RoleAdmin it lists those only an admin may call
// (AdminOnly): its permission is a wildcard and needs no list.
func OpsOf(role Role) []string {
	var out []string
	for _, o := range Operations {
		switch {
		case o.Global:
		case role == RoleAdmin && o.AdminOnly, role != RoleAdmin && o.CalledBy(role):
			out = append(out, o.Name)
		}
	}
	return out
}

// GlobalOps lists the names of the operations that belong to no project.
func GlobalOps() []string {
	var out []string
	for _, o := range Operations {
		if o.Global {
			out = append(out, o.Name)
		}
	}
	return out
}

// OpsServedBy lists the names of the operations server answers.
func OpsServedBy(server Server) []string {
	var out []string
	for _, o := range Operations {
		if o.Server == server {
			out = append(out, o.Name)
		}
	}
	return out
}

// CheckServed reports, as one error naming each, the operations of the
// table server answers that ops leaves out, and the names in ops that are no
// operation of server's: an API server checks its handlers with it before
// it subscribes anything.
func CheckServed(server Server, ops []string) error {
	have := make(map[string]bool, len(ops))
	var problems []string
	for _, op := range ops {
		have[op] = true
		if o, ok := Op(op); !ok || o.Server != server {
			problems = append(problems, fmt.Sprintf("%s is not an operation the %s answers", op, server))
		}
	}
	for _, op := range OpsServedBy(server) {
		if !have[op] {
			problems = append(problems, fmt.Sprintf("%s has no handler", op))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	slices.Sort(problems)
	return fmt.Errorf("%s API: %s", server, strings.Join(problems, "; "))
}
