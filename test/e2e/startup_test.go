package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
)

// serveFails runs serve expecting it to exit with an error, and returns
// what it printed.
func serveFails(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, append([]string{"serve"}, args...)...).CombinedOutput()
	require.Error(t, err, "serve must fail: %s", out)
	require.NoError(t, ctx.Err(), "serve must exit by itself: %s", out)
	return string(out)
}

func TestServeRefusesADataDirectoryInUse(t *testing.T) {
	data := t.TempDir()
	s := startServer(t, data, servetest.FreePort(t), servetest.FreePort(t))
	out := serveFails(t, "--data", data, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", servetest.FreePort(t)), "--http-listen", fmt.Sprintf("127.0.0.1:%d", servetest.FreePort(t)))
	require.Contains(t, out, "is in use by another cgledger serve")
	require.Contains(t, out, "pid "+strconv.Itoa(s.Cmd.Process.Pid))
	// The first serve is unharmed.
	_, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"still here"}`)
	require.Equal(t, 0, code)
}

func TestServeNamesAReadOnlyDataDirectory(t *testing.T) {
	data := filepath.Join(t.TempDir(), "ro")
	require.NoError(t, os.Mkdir(data, 0o500))
	t.Cleanup(func() { _ = os.Chmod(data, 0o700) })
	if os.Geteuid() == 0 {
		// Root writes through directory permissions: make the file system
		// itself read-only, with a read-only bind mount of the directory.
		if out, err := exec.Command("mount", "--bind", "-o", "ro", data, data).CombinedOutput(); err != nil {
			testenv.Skip(t, "cannot bind-mount read-only here: %v: %s", err, out)
		}
		t.Cleanup(func() { _ = exec.Command("umount", "-l", data).Run() })
	}
	out := serveFails(t, "--data", data, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", servetest.FreePort(t)), "--http-listen", fmt.Sprintf("127.0.0.1:%d", servetest.FreePort(t)))
	require.Contains(t, out, "data directory "+data+" is not writable")
}

func TestServeNamesAPortInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	out := serveFails(t, "--data", t.TempDir(), "--nats-listen", taken.Addr().String(), "--http-listen", fmt.Sprintf("127.0.0.1:%d", servetest.FreePort(t)))
	require.Contains(t, out, "nats_listen "+taken.Addr().String())
	out = serveFails(t, "--data", t.TempDir(), "--nats-listen", fmt.Sprintf("127.0.0.1:%d", servetest.FreePort(t)), "--http-listen", taken.Addr().String())
	require.Contains(t, out, "http_listen")
	require.Contains(t, out, taken.Addr().String())
}

func TestServeNamesADataDirectoryItCannotCreate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o600))
	data := filepath.Join(file, "data")
	out := serveFails(t, "--data", data, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", servetest.FreePort(t)), "--http-listen", fmt.Sprintf("127.0.0.1:%d", servetest.FreePort(t)))
	require.Contains(t, out, "data directory "+data+" cannot be created")
}
