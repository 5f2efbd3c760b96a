package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// Role is what a credential may do: a client role of the API
// (protocol.Role), or RoleLedger.
type Role = protocol.Role

// Roles. Every role but RoleLedger is a client of the ledger's API; only
// RoleLedger may write the ledger's stream and bucket or touch the
// JetStream API beyond pulling a tool's own consumer.
const (
	RoleWorker       = protocol.RoleWorker
	RoleTool         = protocol.RoleTool
	RoleAuditor      = protocol.RoleAuditor
	RoleAdmin        = protocol.RoleAdmin
	RoleLedger  Role = "ledger"
	// RoleApprover decides held calls (approve, deny) and reads them, as
	// one named approver (Grant.Approver) of one project.
	RoleApprover = protocol.RoleApprover
)

// APIPrefix starts every API subject: cgledger.v1.<project>.<actor>.<op>.
const APIPrefix = protocol.APIPrefix

// GlobalProject is the project token of API operations that belong to no
// project (projector.skip).
const GlobalProject = protocol.GlobalProject

// AllProjects in a grant's Project means every project (admin and auditor
// only).
const AllProjects = "*"

// ToolJSAPIPrefix is the JetStream API prefix tool services use to pull
// their consumer (the CLIENTS account imports those two API subjects under
// it): nats.go jetstream.NewWithAPIPrefix(nc, ToolJSAPIPrefix), nats.js
// jetstream(nc, {apiPrefix}).
const ToolJSAPIPrefix = "cgledger.js.API"

// DefaultStream is the ledger stream whose consumers tool credentials pull.
const DefaultStream = "CG_LEDGER"

// API operation names (the <op> of an API subject), by role: the
// operation table's (protocol.Operations), in its order.
var (
	WorkerOps  = protocol.OpsOf(protocol.RoleWorker)
	ToolOps    = protocol.OpsOf(protocol.RoleTool)
	AuditorOps = protocol.OpsOf(protocol.RoleAuditor)
	// ApproverOps are an approver's, under its own name as actor.
	ApproverOps = protocol.OpsOf(protocol.RoleApprover)
	// AdminOps are the operations only an admin of the project may call
	// (its wildcard covers every op; no other role lists them): the
	// operator actions and conformance runs, recorded with the admin's
	// actor token.
	AdminOps = protocol.OpsOf(protocol.RoleAdmin)
	// GlobalOps are admin operations outside any project; only an admin of
	// every project may call them.
	GlobalOps = protocol.GlobalOps()
)

// Grant says what one credential may do. Empty Agent, Tool and Target mean
// "any in the project".
type Grant struct {
	Role    Role   `json:"role"`
	Project string `json:"project"`
	// Agent binds a worker to one agent id: it can act only as that agent.
	Agent string `json:"agent,omitempty"`
	// Target is the worker target whose wakeups a worker may receive.
	// Empty means Agent (or any target when Agent is empty too).
	Target string `json:"target,omitempty"`
	// Tool binds a tool credential to one tool target (the first token after
	// cmd.tool); it is required to pull the tool's durable consumer. A PMO
	// built-in's name (protocol.ReservedToolNames, which no registered tool
	// may take as target) binds it to that built-in's commands,
	// cmd.sys.pmo.internal.<tool>, instead.
	Tool string `json:"tool,omitempty"`
	// Approver binds an approver credential to its approver name: the
	// actor token of its API subjects, which the ledger records as the
	// approver of its decisions and checks against a tool's approvers.
	// Required for an approver, for no one else.
	Approver string `json:"approver,omitempty"`
	// Label names the holder, for logs and audits.
	Label string `json:"label,omitempty"`
}

// Validate lists every problem with the grant.
func (g Grant) Validate() []string {
	var errs []string
	switch g.Role {
	case RoleWorker, RoleTool, RoleAuditor, RoleAdmin, RoleLedger, RoleApprover:
	default:
		errs = append(errs, fmt.Sprintf("role %q: want worker, tool, auditor, admin, approver or ledger", g.Role))
	}
	if g.Role == RoleLedger && g.Project != "" {
		errs = append(errs, "a ledger credential covers the whole ledger account: it takes no project")
	}
	if g.Role != RoleLedger {
		switch {
		case g.Project == "":
			errs = append(errs, "project is required")
		case g.Project == AllProjects:
			if g.Role != RoleAdmin && g.Role != RoleAuditor {
				errs = append(errs, "project \"*\" (every project) is only for admin and auditor credentials")
			}
		case !IsIdent(g.Project):
			errs = append(errs, fmt.Sprintf("project %q is not an identifier (1-256 printable ASCII bytes without '.', '*', '>', not \"_\")", g.Project))
		}
	}
	for _, f := range []struct{ name, v string }{{"agent", g.Agent}, {"target", g.Target}, {"tool", g.Tool}, {"approver", g.Approver}} {
		if f.v != "" && !IsIdent(f.v) {
			errs = append(errs, fmt.Sprintf("%s %q is not an identifier", f.name, f.v))
		}
	}
	if (g.Agent != "" || g.Target != "") && g.Role != RoleWorker {
		errs = append(errs, "agent and target are for worker credentials only")
	}
	if g.Tool != "" && g.Role != RoleTool {
		errs = append(errs, "tool is for tool credentials only")
	}
	switch {
	case g.Role == RoleApprover && g.Approver == "":
		errs = append(errs, "approver (the approver's name) is required for an approver credential")
	case g.Approver != "" && g.Role != RoleApprover:
		errs = append(errs, "approver is for approver credentials only")
	}
	if strings.ContainsAny(g.Label, "\x00\n\r") || len(g.Label) > 256 {
		errs = append(errs, "label must be at most 256 bytes on one line")
	}
	return errs
}

// IsIdent reports whether s is a protocol identifier (protocol.ValidIdentifier):
// a single NATS subject token that can be named in a permission.
func IsIdent(s string) bool { return protocol.ValidIdentifier(s) }

// APISubject is the subject of an API operation.
func APISubject(project, actor, op string) string { return protocol.APISubject(project, actor, op) }

// ToolConsumerName is the durable consumer the ledger keeps for a tool of a
// project. Project ids may hold characters consumer names may not, so the
// name is derived from a hash.
func ToolConsumerName(project, tool string) string {
	h := sha256.Sum256([]byte(project + "\x00" + tool))
	return "cgtool-" + hex.EncodeToString(h[:12])
}

// InboxPrefix is the only prefix under which a credential may receive
// replies: requests must set it as the client's inbox prefix, so no client
// can read another's replies.
func InboxPrefix(userPublicKey string) string { return "_INBOX_" + userPublicKey }

// DefaultTTL is how long an issued credential lives unless told otherwise.
const DefaultTTL = time.Hour

// Permissions returns the publish and subscribe allow lists of the grant for
// a user key. Everything not listed is denied by NATS.
func (g Grant) Permissions(userPublicKey string) (pub, sub []string) {
	if g.Role == RoleLedger {
		return []string{">"}, []string{">"}
	}
	sub = []string{InboxPrefix(userPublicKey) + ".>"}
	any := func(v string) string {
		if v == "" {
			return "*"
		}
		return v
	}
	proj := g.Project
	switch g.Role {
	case RoleWorker:
		for _, op := range WorkerOps {
			pub = append(pub, APISubject(proj, any(g.Agent), op))
		}
		target := g.Target
		if target == "" {
			target = g.Agent
		}
		sub = append(sub, protocol.WakeupSubject(protocol.DefaultVersion, proj, "*", any(target)))
	case RoleTool:
		tool := any(g.Tool)
		for _, op := range ToolOps {
			pub = append(pub, APISubject(proj, tool, op))
		}
		if protocol.IsPMOTool(g.Tool) {
			sub = append(sub, protocol.PMOCommandSubject(protocol.DefaultVersion, proj, "*", g.Tool), protocol.CancelSubjectPattern(protocol.DefaultVersion, proj))
		} else {
			sub = append(sub, protocol.ToolCommandSubject(protocol.DefaultVersion, proj, "*", tool), protocol.ToolCommandSubject(protocol.DefaultVersion, proj, "*", tool, ">"), protocol.CancelSubjectPattern(protocol.DefaultVersion, proj))
		}
		if g.Tool != "" {
			c := ToolConsumerName(g.Project, g.Tool)
			pub = append(pub,
				ToolJSAPIPrefix+".CONSUMER.INFO."+DefaultStream+"."+c,
				ToolJSAPIPrefix+".CONSUMER.MSG.NEXT."+DefaultStream+"."+c,
				"$JS.ACK."+DefaultStream+"."+c+".>")
		}
	case RoleApprover:
		// Its own name as actor, so every decision it makes is its own;
		// it reads nothing but its replies.
		for _, op := range ApproverOps {
			pub = append(pub, APISubject(proj, g.Approver, op))
		}
	case RoleAuditor:
		for _, op := range AuditorOps {
			pub = append(pub, APISubject(proj, "*", op))
		}
	case RoleAdmin:
		if proj == AllProjects {
			pub = append(pub, APIPrefix+".>")
		} else {
			pub = append(pub, APISubject(proj, "*", ">"))
		}
	}
	return pub, sub
}

// Allows reports whether the grant covers project (for HTTP checks). An
// AllProjects grant covers every project.
func (g Grant) Allows(project string) bool {
	return g.Role == RoleLedger || g.Project == AllProjects || g.Project == project
}
