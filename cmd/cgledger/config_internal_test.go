package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestToolAckWaitSetting: tool_ack_wait takes a duration from 1s to 1h;
// anything else is listed as its own violation.
func TestToolAckWaitSetting(t *testing.T) {
	for v, ok := range map[string]bool{"": true, "1s": true, "30s": true, "1h": true, "500ms": false, "2h": false, "soon": false} {
		s := defaultSettings()
		s.ToolAckWait = v
		found := false
		for _, x := range s.validate() {
			if x.Field == "tool_ack_wait" {
				found = true
			}
		}
		require.Equal(t, !ok, found, "tool_ack_wait %q", v)
	}
}
