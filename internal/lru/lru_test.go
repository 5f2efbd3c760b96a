package lru_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/lru"
)

func TestCacheDropsTheLeastRecentlyUsed(t *testing.T) {
	c := lru.New[int](2)
	c.Put("a", 1)
	c.Put("b", 2)
	_, _ = c.Get("a")
	c.PutAll(map[string]int{"c": 3})
	_, ok := c.Get("b")
	require.False(t, ok, "b was the least recently used")
	v, ok := c.Get("a")
	require.True(t, ok)
	require.Equal(t, 1, v)
	c.Put("a", 10)
	v, _ = c.Get("a")
	require.Equal(t, 10, v, "a put replaces")
	require.Equal(t, 2, c.Len())
	c.Clear()
	require.Zero(t, c.Len())
}
