package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/mcpfront"
	"github.com/cgledger/cgledger/protocol"
)

// mcpServeGrantProblem says why the credential at credsPath cannot dispatch
// as agent in project (the rule of /mcp/{project}/{agent}), or "" when it
// can or carries no cgledger grant (NATS then decides, e.g. under --no-auth).
// An auditor's credential may list a project's tools, so listing them at
// start proves nothing about dispatching.
func mcpServeGrantProblem(credsPath, project, agent string) string {
	if credsPath == "" {
		return ""
	}
	token, _, err := auth.ReadCreds(credsPath)
	if err != nil {
		return ""
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return ""
	}
	var g auth.Grant
	if json.Unmarshal([]byte(uc.Name), &g) != nil || g.Role == "" {
		return ""
	}
	return httpapi.MCPProblem(g, project, agent)
}

// refusingLedger ends a ledger operation at once when NATS refuses one of
// the connection's publishes while it runs (a permissions violation, which
// NATS reports on the connection, not to the request): the operation fails
// forbidden, which the front door answers as an error not to retry, instead
// of waiting out its deadline.
type refusingLedger struct {
	mcpfront.Ledger
	mu       sync.Mutex
	watchers map[chan error]struct{}
}

// newRefusingLedger wraps l, whose connection is nc, chaining nc's error
// handler.
func newRefusingLedger(nc *nats.Conn, l mcpfront.Ledger) *refusingLedger {
	r := &refusingLedger{Ledger: l, watchers: map[chan error]struct{}{}}
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, s *nats.Subscription, err error) {
		if prev != nil {
			prev(c, s, err)
		}
		if !errors.Is(err, nats.ErrPermissionViolation) {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for w := range r.watchers {
			select {
			case w <- err:
			default:
			}
		}
	})
	return r
}

// run runs op with a context that ends when a publish is refused meanwhile.
func (r *refusingLedger) run(ctx context.Context, what string, op func(context.Context) error) error {
	w := make(chan error, 1)
	r.mu.Lock()
	r.watchers[w] = struct{}{}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.watchers, w)
		r.mu.Unlock()
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case err := <-w:
			cancel(err)
		case <-ctx.Done():
		}
	}()
	err := op(ctx)
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, nats.ErrPermissionViolation) {
		return &protocol.Error{Code: protocol.CodeForbidden, Message: fmt.Sprintf("%s: NATS refused the credential: %s; it needs to be a worker credential of the project bound to the agent or to none, or an admin's",
			what, strings.TrimPrefix(cause.Error(), "nats: "))}
	}
	return err
}

// Dispatch implements mcpfront.Ledger.
func (r *refusingLedger) Dispatch(ctx context.Context, req protocol.DispatchRequest) (res protocol.DispatchResult, err error) {
	err = r.run(ctx, "dispatch", func(ctx context.Context) error {
		res, err = r.Ledger.Dispatch(ctx, req)
		return err
	})
	return res, err
}

// GetCall implements mcpfront.Ledger.
func (r *refusingLedger) GetCall(ctx context.Context, project, turnID, callID string) (rec *protocol.CallRecord, err error) {
	err = r.run(ctx, "call.get", func(ctx context.Context) error {
		rec, err = r.Ledger.GetCall(ctx, project, turnID, callID)
		return err
	})
	return rec, err
}
