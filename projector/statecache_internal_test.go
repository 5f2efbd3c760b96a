package projector

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStateCacheIsAnLRU(t *testing.T) {
	c := newStateCache(3)
	for i := range 3 {
		c.put(fmt.Sprint(i), &CallState{ToolCallID: fmt.Sprint(i)})
	}
	_, ok := c.get("0") // 0 is now the most recently used
	require.True(t, ok)
	c.putAll(map[string]*CallState{"3": {ToolCallID: "3"}})
	require.Equal(t, 3, c.len(), "bounded")
	_, ok = c.get("1")
	require.False(t, ok, "the least recently used went first")
	st, ok := c.get("0")
	require.True(t, ok)
	require.Equal(t, "0", st.ToolCallID)
	c.put("0", nil)
	st, ok = c.get("0")
	require.True(t, ok, "a call known to have no state is remembered as such")
	require.Nil(t, st)
	c.clear()
	require.Zero(t, c.len())
}
