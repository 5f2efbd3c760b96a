package protocol_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestOperationsTable: every operation is named once, called by some role,
// admin included, and documented under its own heading in
// docs/protocol.md; the operator actions and global operations are an
// admin's alone.
func TestOperationsTable(t *testing.T) {
	doc, err := os.ReadFile("../docs/protocol.md")
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, o := range protocol.Operations {
		require.False(t, seen[o.Name], "%s is listed twice", o.Name)
		seen[o.Name] = true
		got, ok := protocol.Op(o.Name)
		require.True(t, ok)
		require.Equal(t, o.Name, got.Name)
		require.True(t, o.CalledBy(protocol.RoleAdmin), "%s: an admin may call every operation", o.Name)
		require.Contains(t, []protocol.Server{protocol.ServerLedger, protocol.ServerViews}, o.Server, o.Name)
		if o.OperatorAction || o.AdminOnly || o.Global {
			require.Equal(t, []protocol.Role{protocol.RoleAdmin}, o.Roles, "%s is an admin's alone", o.Name)
		}
		if o.Server == protocol.ServerViews {
			require.False(t, o.Write, "%s: the views write nothing", o.Name)
		}
		require.Regexp(t, regexp.MustCompile(`(?m)^### .*`+"`?"+regexp.QuoteMeta(o.Name)+"`?"+`( |$)`), string(doc), "%s has no section in docs/protocol.md", o.Name)
	}
	_, ok := protocol.Op("no.such.op")
	require.False(t, ok)
	require.Equal(t, []string{protocol.OpProjectorSkip, protocol.OpViewsSnapshot, protocol.OpViewsSnapshotList}, protocol.GlobalOps())
}

// TestCheckServed names every operation a server leaves unanswered and every
// handler that is no operation of its.
func TestCheckServed(t *testing.T) {
	require.NoError(t, protocol.CheckServed(protocol.ServerViews, []string{protocol.OpInboxList, protocol.OpApprovalList, protocol.OpApprovalGet, protocol.OpViewsSnapshot, protocol.OpViewsSnapshotList}))
	err := protocol.CheckServed(protocol.ServerViews, []string{protocol.OpInboxList, protocol.OpApprovalGet, protocol.OpViewsSnapshot, protocol.OpViewsSnapshotList, protocol.OpDispatch, "nope"})
	require.EqualError(t, err, "views API: approval.list has no handler; dispatch is not an operation the views answers; nope is not an operation the views answers")
	require.NoError(t, protocol.CheckServed(protocol.ServerLedger, protocol.OpsServedBy(protocol.ServerLedger)))
}
