package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// TestRefusalTellsAReplyInboxFromTheCredentialsScope: a refused
// subscription to the client's own reply inbox (a serve restarted under a
// waiting verb) says to run the command again; any other violation names
// the credential as the cause. Both are refusals (exit 1).
func TestRefusalTellsAReplyInboxFromTheCredentialsScope(t *testing.T) {
	c := &clientFlags{creds: "/tmp/alice.creds", source: map[string]string{"creds": "flag --creds"}}
	violation := func(what string) error {
		return fmt.Errorf("%w: Permissions Violation for %s", nats.ErrPermissionViolation, what)
	}

	err := c.refusal(violation(`Subscription to "_INBOX_abc.Xy12.*"`), "_INBOX_abc.")
	require.ErrorIs(t, err, errRefused)
	require.Contains(t, err.Error(), "reply inbox after it reconnected")
	require.Contains(t, err.Error(), "run the command again")
	require.NotContains(t, err.Error(), "may not do this")

	err = c.refusal(violation(`Publish to "cgledger.v1._.alice.views.snapshot"`), "_INBOX_abc.")
	require.True(t, errors.Is(err, errRefused))
	require.Contains(t, err.Error(), "may not do this")

	// Another client's inbox is the credential's scope, not a restart.
	err = c.refusal(violation(`Subscription to "_INBOX_other.x"`), "_INBOX_abc.")
	require.Contains(t, err.Error(), "may not do this")
}
