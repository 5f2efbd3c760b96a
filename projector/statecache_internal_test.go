package projector

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStateCacheIsAnLRU(t *testing.T) {
	c := newStateCache(3)
	for i := range 3 {
		c.Put(fmt.Sprint(i), &CallState{ToolCallID: fmt.Sprint(i)})
	}
	_, ok := c.Get("0") // 0 is now the most recently used
	require.True(t, ok)
	c.PutAll(map[string]*CallState{"3": {ToolCallID: "3"}})
	require.Equal(t, 3, c.Len(), "bounded")
	_, ok = c.Get("1")
	require.False(t, ok, "the least recently used went first")
	st, ok := c.Get("0")
	require.True(t, ok)
	require.Equal(t, "0", st.ToolCallID)
	c.Put("0", nil)
	st, ok = c.Get("0")
	require.True(t, ok, "a call known to have no state is remembered as such")
	require.Nil(t, st)
	c.Clear()
	require.Zero(t, c.Len())
}
