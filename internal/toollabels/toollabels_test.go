package toollabels_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/toollabels"
)

// TestCallLabelNeedsTheCallsRegistrationOrABuiltin checks
// Labels.CallLabel alone.
func TestCallLabelNeedsTheCallsRegistrationOrABuiltin(t *testing.T) {
	l := toollabels.New("search")
	l.AddBuiltin("echo")
	require.Equal(t, "search", l.CallLabel("search", true))
	require.Equal(t, toollabels.Other, l.CallLabel("search", false), "registered elsewhere only")
	require.Equal(t, "echo", l.CallLabel("echo", false))
	require.Equal(t, toollabels.Other, l.CallLabel("made-up", false))
	require.Equal(t, "fresh", l.CallLabel("fresh", true), "registered in the call's project, not seen yet")
	require.Contains(t, l.Names(), "fresh")
	require.True(t, l.Builtin("echo"))
	require.False(t, l.Builtin("search"))
	require.NotContains(t, l.Names(), "\x00builtin\x00echo")
}
