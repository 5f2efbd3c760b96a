package main

import (
	"context"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/protocol"
)

// operatorActions sends the audit HTTP API's call cancel and resolve to the
// ledger API over nc, as the admin: the ledger checks and records them as
// it does an admin's own request (docs/operations.md, "Operator actions").
func operatorActions(nc *nats.Conn) httpapi.OperateFunc {
	c := client.New(nc)
	return func(ctx context.Context, op, actor string, req any) (any, error) {
		switch r := req.(type) {
		case protocol.OperatorCancelRequest:
			return c.OperatorCancel(ctx, actor, r)
		case protocol.ResolveRequest:
			return c.Resolve(ctx, actor, r)
		case protocol.RedriveRequest:
			return c.Redrive(ctx, actor, r)
		}
		return nil, fmt.Errorf("%s: unexpected request %T", op, req)
	}
}

// httpOperator names the actor of an HTTP operator action. With
// credentials on (secured), it is the bearer admin credential's
// (operatorActor); without, the body names one.
func httpOperator(secured bool) func(*http.Request) (string, bool) {
	if !secured {
		return nil
	}
	return func(r *http.Request) (string, bool) {
		g, ok := auth.GrantFrom(r.Context())
		if !ok {
			return "", true
		}
		return operatorActor(g), true
	}
}

// defaultOperatorActor is the actor of an admin credential without a label
// that is an identifier.
const defaultOperatorActor = "admin"

// operatorActor is the actor token an admin credential's operator actions
// are recorded under: its label (creds issue --label) when that is an
// identifier, so each operator's actions carry their name; else "admin".
func operatorActor(g auth.Grant) string {
	if protocol.ValidIdentifier(g.Label) {
		return g.Label
	}
	return defaultOperatorActor
}
