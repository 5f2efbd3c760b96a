package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Deadlines of the condition waits: generous, for a loaded two-core machine.
const (
	readyTimeout  = 2 * time.Minute
	settleTimeout = 3 * time.Minute
	pollInterval  = 100 * time.Millisecond
)

var (
	portsMu sync.Mutex
	ports   = map[int]bool{}
)

// freePort returns a port free now and never returned before in this run
// (the kernel may hand a closed port out again at once, and the faults'
// processes listen on several each).
func freePort(t *testing.T) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !ports[port] {
			ports[port] = true
			return port
		}
	}
}

// waitFor polls cond until it holds or the timeout passes, and returns
// whether it held.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
}

// logBuffer keeps the last max bytes a child process wrote, and counts the
// complete lines that start with each watched prefix.
type logBuffer struct {
	mu      sync.Mutex
	b       []byte
	partial []byte
	counts  map[string]int
}

const logKeep = 1 << 20

func newLogBuffer(watch ...string) *logBuffer {
	lb := &logBuffer{counts: map[string]int{}}
	for _, w := range watch {
		lb.counts[w] = 0
	}
	return lb
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if len(l.b) > 2*logKeep {
		l.b = append([]byte(nil), l.b[len(l.b)-logKeep:]...)
	}
	if len(l.counts) > 0 {
		l.partial = append(l.partial, p...)
		for {
			i := bytes.IndexByte(l.partial, '\n')
			if i < 0 {
				break
			}
			line := l.partial[:i]
			for w := range l.counts {
				if bytes.HasPrefix(line, []byte(w)) {
					l.counts[w]++
				}
			}
			l.partial = l.partial[i+1:]
		}
	}
	return len(p), nil
}

func (l *logBuffer) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[prefix]
}

func (l *logBuffer) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.b) > n {
		return "...\n" + string(l.b[len(l.b)-n:])
	}
	return string(l.b)
}

// proc is a child process the test starts, kills with SIGKILL and restarts
// with the same arguments. An exit the test did not cause is recorded: a
// crash is a finding.
type proc struct {
	t    *testing.T
	name string
	bin  string
	args []string
	env  []string
	log  *logBuffer

	mu         sync.Mutex
	cmd        *exec.Cmd
	done       chan struct{}
	killing    bool
	starts     int
	unexpected []string
}

func newProc(t *testing.T, name, bin string, env []string, log *logBuffer, args ...string) *proc {
	p := &proc{t: t, name: name, bin: bin, args: args, env: env, log: log}
	if p.log == nil {
		p.log = newLogBuffer()
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", p.name, p.log.tail(16<<10))
		}
	})
	return p
}

// start runs the process; it must not be running.
func (p *proc) start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Nil(p.t, p.done, "%s is already running", p.name)
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	fmt.Fprintf(p.log, "=== start %d: %s %s\n", p.starts+1, p.bin, strings.Join(p.args, " "))
	require.NoError(p.t, cmd.Start(), "start %s", p.name)
	p.starts++
	done := make(chan struct{})
	p.cmd, p.done, p.killing = cmd, done, false
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		if !p.killing {
			p.unexpected = append(p.unexpected, fmt.Sprintf("%s (start %d) exited by itself: %v", p.name, p.starts, err))
		}
		p.mu.Unlock()
		close(done)
	}()
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill() {
	p.t.Helper()
	p.mu.Lock()
	done, cmd := p.done, p.cmd
	require.NotNil(p.t, done, "%s is not running", p.name)
	p.killing = true
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
	fmt.Fprintf(p.log, "=== killed with SIGKILL\n")
	p.mu.Lock()
	p.done, p.cmd = nil, nil
	p.mu.Unlock()
}

func (p *proc) stop() {
	p.mu.Lock()
	running := p.done != nil
	p.mu.Unlock()
	if running {
		p.kill()
	}
}

// exited reports whether the running process has exited (by itself).
func (p *proc) exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return true
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// requireNoCrash fails the test if the process ever exited without being killed.
func (p *proc) requireNoCrash() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Empty(p.t, p.unexpected, "%s exited without being killed", p.name)
}

var httpClient = &http.Client{Timeout: 3 * time.Second}

func httpOK(url string) bool {
	resp, err := httpClient.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// serve is a `cgledger serve` process.
type serve struct {
	*proc
	data     string
	httpPort int
	natsPort int // embedded server only
	natsURL  string
	auth     bool
}

// newEmbeddedServe prepares serve with its embedded nats-server and
// authentication on (the default).
func newEmbeddedServe(t *testing.T, name string, extra ...string) *serve {
	s := &serve{data: t.TempDir(), httpPort: freePort(t), natsPort: freePort(t), auth: true}
	s.natsURL = fmt.Sprintf("nats://127.0.0.1:%d", s.natsPort)
	args := append([]string{"serve", "--data", s.data, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", s.natsPort),
		"--http-listen", fmt.Sprintf("127.0.0.1:%d", s.httpPort), "--log-format", "json"}, extra...)
	s.proc = newProc(t, name, cgledgerBin, nil, nil, args...)
	return s
}

// newExternalServe prepares serve against an existing NATS server or
// cluster, without authentication.
func newExternalServe(t *testing.T, name, natsURL string, extra ...string) *serve {
	s := &serve{data: t.TempDir(), httpPort: freePort(t), natsURL: natsURL}
	args := append([]string{"serve", "--data", s.data, "--nats-url", natsURL, "--no-auth",
		"--http-listen", fmt.Sprintf("127.0.0.1:%d", s.httpPort), "--log-format", "json"}, extra...)
	s.proc = newProc(t, name, cgledgerBin, nil, nil, args...)
	return s
}

func (s *serve) httpURL() string { return fmt.Sprintf("http://127.0.0.1:%d", s.httpPort) }

// waitReady waits until GET /readyz answers 200.
func (s *serve) waitReady() {
	s.t.Helper()
	ok := waitFor(readyTimeout, func() bool { return s.exited() || httpOK(s.httpURL()+"/readyz") })
	require.False(s.t, s.exited(), "%s exited before it was ready", s.name)
	require.True(s.t, ok, "%s ready within %s", s.name, readyTimeout)
}

func (s *serve) startReady() {
	s.t.Helper()
	s.start()
	s.waitReady()
}

// cli runs a client verb against s and returns stdout, stderr and the exit code.
func (s *serve) cli(args ...string) (string, string, int) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cgledgerBin, args...)
	cmd.Env = append(os.Environ(), "CGLEDGER_NATS_URL="+s.natsURL, "CGLEDGER_SERVER="+s.httpURL(), "CGLEDGER_DATA="+s.data)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(s.t, err)
	}
	return out.String(), errOut.String(), code
}

// natsServer is a standalone nats-server process with JetStream, optionally
// one node of a cluster.
type natsServer struct {
	*proc
	serverName string
	port       int
	monPort    int
	store      string
}

func newNATSServer(t *testing.T, serverName string, clusterArgs ...string) *natsServer {
	n := &natsServer{serverName: serverName, port: freePort(t), monPort: freePort(t), store: t.TempDir()}
	args := append([]string{"-a", "127.0.0.1", "-p", fmt.Sprint(n.port), "-m", fmt.Sprint(n.monPort),
		"-n", serverName, "-js", "-sd", n.store}, clusterArgs...)
	n.proc = newProc(t, serverName, natsServerBin, nil, nil, args...)
	return n
}

func (n *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// waitHealthy waits until the server's /healthz says JetStream is ok (on a
// cluster: the node is current with the meta leader and its assets).
func (n *natsServer) waitHealthy() {
	n.t.Helper()
	u := fmt.Sprintf("http://127.0.0.1:%d/healthz", n.monPort)
	ok := waitFor(readyTimeout, func() bool { return n.exited() || httpOK(u) })
	require.False(n.t, n.exited(), "%s exited before it was healthy", n.name)
	require.True(n.t, ok, "%s healthy within %s", n.name, readyTimeout)
}

// leadsFormedCluster reports whether n is the JetStream meta leader and sees
// every other node of a size-node cluster current (its /jsz). A node's
// /healthz can be ok while the leader still counts a peer offline, and a
// stream created then fails to place its replicas.
func (n *natsServer) leadsFormedCluster(size int) bool {
	resp, err := httpClient.Get(fmt.Sprintf("http://127.0.0.1:%d/jsz", n.monPort))
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var jsz struct {
		Meta *struct {
			Leader   string `json:"leader"`
			Replicas []struct {
				Name    string `json:"name"`
				Current bool   `json:"current"`
				Offline bool   `json:"offline"`
			} `json:"replicas"`
		} `json:"meta_cluster"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&jsz) != nil || jsz.Meta == nil || jsz.Meta.Leader != n.serverName {
		return false
	}
	others := 0
	for _, r := range jsz.Meta.Replicas {
		if r.Name == n.serverName {
			continue
		}
		if !r.Current || r.Offline {
			return false
		}
		others++
	}
	return others == size-1
}
