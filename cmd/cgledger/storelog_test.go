package main

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A flush that fails without end is logged once per interval, not once per
// try.
func TestBackgroundErrorLogIsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	f := backgroundErrorLog(slog.New(slog.NewTextHandler(&buf, nil)))
	for range 100 {
		f(errors.New("write 000012.sst: no space left on device"))
	}
	require.Equal(t, 1, strings.Count(buf.String(), "a background write failed"), buf.String())
	require.Contains(t, buf.String(), "no space left on device")
}
