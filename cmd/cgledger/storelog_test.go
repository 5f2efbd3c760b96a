package main

import (
	"bytes"
	"errors"
	"fmt"
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

	// Pebble's errors print their stack trace with %+v: the line keeps the
	// message only.
	buf.Reset()
	f = backgroundErrorLog(slog.New(slog.NewTextHandler(&buf, nil)))
	f(stackErr{})
	require.NotContains(t, buf.String(), "stack trace")
}

// stackErr formats like a cockroachdb/errors error: its stack only with %+v.
type stackErr struct{}

func (stackErr) Error() string { return "write 000020.sst: no space left on device" }

func (e stackErr) Format(s fmt.State, verb rune) {
	if verb == 'v' && s.Flag('+') {
		fmt.Fprint(s, e.Error()+"\n(1) attached stack trace\n  -- stack trace:")
		return
	}
	fmt.Fprint(s, e.Error())
}

// Corruption found on reads is an error, logged once per interval however
// many reads hit it, with the way out.
func TestCorruptionLogIsAnErrorAndRateLimited(t *testing.T) {
	var buf bytes.Buffer
	f := corruptionLog(slog.New(slog.NewJSONHandler(&buf, nil)))
	for range 50 {
		f(errors.New("pebble: file 000032: block 998979/1581: crc32c checksum mismatch"))
	}
	require.Equal(t, 1, strings.Count(buf.String(), "\n"), buf.String())
	require.Contains(t, buf.String(), `"level":"ERROR"`)
	require.Contains(t, buf.String(), "checksum mismatch")
	require.Contains(t, buf.String(), "remove <data>/views")
}
