package e2e

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
)

// mountTmpfs mounts a small tmpfs for a data directory, or skips the test
// where the machine does not allow it.
func mountTmpfs(t *testing.T, sizeMB int) string {
	t.Helper()
	return testenv.MountTmpfs(t, sizeMB<<10)
}

func itoa(n int) string { return strconv.Itoa(n) }

// fillTo writes a filler file until the file system of dir has about left
// bytes free.
func fillTo(t *testing.T, dir string, left uint64) string {
	t.Helper()
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(dir, &st))
	free := st.Bavail * uint64(st.Bsize)
	require.Greater(t, free, left, "the file system is already fuller than asked")
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for n := free - left; n > 0; {
		w := min(n, uint64(len(chunk)))
		_, err := f.Write(chunk[:w])
		if errors.Is(err, syscall.ENOSPC) {
			// serve wrote meanwhile: the disk is full, fuller than asked.
			break
		}
		require.NoError(t, err)
		n -= w
	}
	return path
}

// topUp appends to the filler at path until the file system has no room
// left.
func topUp(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			return
		}
	}
}

// readiness returns /readyz's status code and reason.
func readiness(t *testing.T, s *server) (int, string) {
	t.Helper()
	resp, err := http.Get(s.httpURL() + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var body struct {
		Reason string `json:"reason"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Reason
}

// TestFullDiskDegradesAndResumes fills the data directory's disk under a
// running serve: it must stay up, say why it is not ready, refuse writes
// with a clear error and lose nothing; once space returns it resumes by
// itself.
func TestFullDiskDegradesAndResumes(t *testing.T) {
	data := mountTmpfs(t, 64)
	s := startServer(t, data, servetest.FreePort(t), servetest.FreePort(t))
	_, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"before"}`, "--turn", "t1", "--call-id", "c1")
	require.Equal(t, 0, code)

	// Another writer fills the disk to below serve's reserve (10% of 64 MiB).
	filler := fillTo(t, data, 2<<20)
	require.Eventually(t, func() bool {
		code, reason := readiness(t, s)
		return code == http.StatusServiceUnavailable && strings.Contains(reason, "storage nearly full")
	}, time.Minute, 50*time.Millisecond, "serve reports the full disk as not ready")
	code, stderr := s.runStderr(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"full"}`, "--turn", "t1", "--call-id", "c2")
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "storage nearly full", "the refusal names the cause")
	require.Nil(t, s.Cmd.ProcessState, "serve is still running")

	require.NoError(t, os.Remove(filler))
	require.Eventually(t, func() bool {
		code, _ := readiness(t, s)
		return code == http.StatusOK
	}, time.Minute, 50*time.Millisecond, "serve is ready again once the disk has room")
	out, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"after"}`, "--turn", "t1", "--call-id", "c3")
	require.Equal(t, 0, code)
	require.Contains(t, out, `{"text":"after"}`)
	// The call accepted before the disk filled is intact.
	out, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"before"}`, "--turn", "t1", "--call-id", "c1")
	require.Equal(t, 0, code)
	require.Contains(t, out, `{"text":"before"}`)
}

// TestDiskFilledToTheLastByteUnderLoad fills the disk completely while calls
// are being made: serve must not die, every call it acknowledged must keep
// its report, and it must resume once the filler is gone.
func TestDiskFilledToTheLastByteUnderLoad(t *testing.T) {
	fillUnderLoad(t)
}

// TestDiskFullWithoutReserveRestartsInPlace turns the reserve off, so the
// stores themselves meet "no space left" (nats-server disables JetStream,
// Pebble cannot write again): serve must stay up, say so, and restart
// itself in place once the disk has room, losing nothing acknowledged.
func TestDiskFullWithoutReserveRestartsInPlace(t *testing.T) {
	s := fillUnderLoad(t, "--disk-reserve", "off")
	require.Contains(t, s.Log.String(), "restarting serve in place", "the stores broke and serve restarted itself")
}

// fillUnderLoad fills a tmpfs data directory to the last byte while calls
// are made, frees it, and checks that serve resumed and lost nothing.
func fillUnderLoad(t *testing.T, extra ...string) *server {
	t.Helper()
	data := mountTmpfs(t, 48)
	s := startServer(t, data, servetest.FreePort(t), servetest.FreePort(t), extra...)
	type result struct {
		id   string
		code int
	}
	results := make(chan result, 1024)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := "load-" + strconv.Itoa(i)
			code, _ := s.runStderr(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"x"}`, "--turn", "load", "--call-id", id, "--timeout", "5s")
			results <- result{id, code}
		}
	}()
	var seen []result
	require.Eventually(t, func() bool {
		for {
			select {
			case r := <-results:
				seen = append(seen, r)
			default:
				n := 0
				for _, r := range seen {
					if r.code == 0 {
						n++
					}
				}
				return n >= 3
			}
		}
	}, time.Minute, 10*time.Millisecond, "calls succeed before the disk fills")
	filler := fillTo(t, data, 0)
	require.Eventually(t, func() bool {
		// The stores can free space after the fill (Pebble deletes an
		// obsolete file, nats-server compacts a block): keep the disk full
		// until serve notices.
		topUp(t, filler)
		code, _ := readiness(t, s)
		return code == http.StatusServiceUnavailable
	}, time.Minute, 50*time.Millisecond, "serve reports the full disk")
	require.Nil(t, s.Cmd.ProcessState, "serve survives a full disk")
	require.NoError(t, os.Remove(filler))
	require.Eventually(t, func() bool {
		code, _ := readiness(t, s)
		return code == http.StatusOK
	}, time.Minute, 50*time.Millisecond, "serve resumes once the disk has room")
	close(stop)
	<-done
	close(results)
	for r := range results {
		seen = append(seen, r)
	}
	ok := 0
	for _, r := range seen {
		if r.code != 0 {
			continue
		}
		ok++
		// An acknowledged call keeps its report: repeating it answers the
		// original outcome.
		out, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"x"}`, "--turn", "load", "--call-id", r.id, "--timeout", "5s")
		require.Equal(t, 0, code, r.id)
		require.Contains(t, out, "status:     success", r.id)
	}
	require.Positive(t, ok)
	out, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"after"}`, "--turn", "t9", "--call-id", "c9")
	require.Equal(t, 0, code)
	require.Contains(t, out, `{"text":"after"}`)
	return s
}
