package main

import (
	"context"
	"net/http"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/protocol"
)

// approvalDecider sends the audit HTTP API's approve and deny to the ledger
// API over nc, as the approver: the ledger checks and records them as it
// does an approver's own request (docs/approvals.md).
func approvalDecider(nc *nats.Conn) httpapi.DecideFunc {
	c := client.New(nc)
	return func(ctx context.Context, op, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error) {
		if op == protocol.OpDeny {
			return c.Deny(ctx, approver, req)
		}
		return c.Approve(ctx, approver, req)
	}
}

// httpApprover names the approver of an HTTP approve or deny. With
// credentials on (secured), it is the bearer's approver name, from the
// grant the policy verified (empty for any other credential, which the
// policy has refused anyway); without, the body names one.
func httpApprover(secured bool) func(*http.Request) (string, bool) {
	if !secured {
		return nil
	}
	return func(r *http.Request) (string, bool) {
		g, ok := auth.GrantFrom(r.Context())
		if !ok {
			return "", true
		}
		return grantApprover(g), true
	}
}

// grantApprover is the approver name a grant carries ("approver" in the
// credential's grant JSON).
func grantApprover(g auth.Grant) string { return g.Approver }

// httpAdminActor is the actor an admin's pause or resume over HTTP is
// recorded under: the credential's label when it is an identifier, else
// "admin" (also without credentials).
func httpAdminActor(r *http.Request) string {
	if g, ok := auth.GrantFrom(r.Context()); ok && protocol.ValidIdentifier(g.Label) {
		return g.Label
	}
	return "admin"
}
