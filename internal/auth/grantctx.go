package auth

import "context"

// grantKey is the context key of the grant the HTTP policy (httpapi.Policy)
// verified.
type grantKey struct{}

// WithGrant returns ctx carrying g, the verified grant of the request: the
// HTTP policy (httpapi.Policy) sets it, GrantFrom reads it.
func WithGrant(ctx context.Context, g Grant) context.Context {
	return context.WithValue(ctx, grantKey{}, g)
}

// GrantFrom returns the grant of the bearer credential the HTTP policy verified
// for the request whose context ctx is: what a handler needs to act as the
// credential (an approver's approve or deny is recorded under its approver
// name). False when the request did not come through the policy (a serve
// without credentials).
func GrantFrom(ctx context.Context) (Grant, bool) {
	g, ok := ctx.Value(grantKey{}).(Grant)
	return g, ok
}
