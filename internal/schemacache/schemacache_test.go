package schemacache

import (
	"fmt"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
)

func TestCacheKeepsOneVersionPerToolAndIsBounded(t *testing.T) {
	c := New(3)
	s1, s2 := &jsonschema.Schema{}, &jsonschema.Schema{}
	c.Put("p\x00t", 1, s1)
	c.Put("p\x00t", 2, s2)
	require.Equal(t, 1, c.Len(), "a re-registration replaces its tool's schema")
	_, ok := c.Get("p\x00t", 1)
	require.False(t, ok, "the old version is gone")
	got, ok := c.Get("p\x00t", 2)
	require.True(t, ok)
	require.Same(t, s2, got)

	for i := range 5 {
		c.Put(fmt.Sprintf("p%d\x00t", i), 1, &jsonschema.Schema{})
		// Keep p0 in use: it must survive the evictions.
		_, _ = c.Get("p0\x00t", 1)
	}
	require.Equal(t, 3, c.Len(), "bounded")
	_, ok = c.Get("p0\x00t", 1)
	require.True(t, ok, "the most recently used stays")
	_, ok = c.Get("p1\x00t", 1)
	require.False(t, ok, "the least recently used went first")
}
