package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cgledger/cgledger/internal/diskspace"
	"github.com/cgledger/cgledger/internal/natsserver"
)

// lockFile is the file in the data directory that one serve holds locked
// while it owns the directory's stores.
const lockFile = "serve.lock"

// preflight checks, before anything starts, what would otherwise fail later
// with an error that does not name its cause: a data directory that cannot
// be created or written, another serve already using it, and ports in use.
// The returned function releases the lock.
func preflight(s Settings, embedded bool) (func(), error) {
	release := func() {}
	ownsStores := embedded || s.has("projector")
	if ownsStores {
		if err := os.MkdirAll(s.Data, 0o700); err != nil {
			return release, fmt.Errorf("data directory %s cannot be created: %w", s.Data, err)
		}
		if err := writable(s.Data); err != nil {
			return release, fmt.Errorf("data directory %s is not writable (check its permissions and that its file system is not read-only or full): %w", s.Data, err)
		}
		unlock, err := lockData(s.Data)
		if err != nil {
			return release, err
		}
		release = unlock
	}
	if embedded {
		if err := portFree(s.NATSListen); err != nil {
			release()
			return func() {}, fmt.Errorf("nats_listen %s: %w", s.NATSListen, err)
		}
	}
	return release, nil
}

// lockData takes an exclusive lock on the data directory's lock file and
// writes this process's id into it, so a second serve names the first.
func lockData(dir string) (func(), error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data directory %s: open %s: %w", dir, lockFile, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			pid := strings.TrimSpace(string(holder))
			if pid == "" {
				pid = "unknown"
			}
			return nil, fmt.Errorf("data directory %s is in use by another cgledger serve (pid %s, lock %s); stop it or use another --data", dir, pid, path)
		}
		return nil, fmt.Errorf("data directory %s: lock %s: %w", dir, lockFile, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}

// portFree reports a listen address another process already holds. Port 0
// (any free port) and -1 (no listener) are always free.
func portFree(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("bad address: %w", err)
	}
	if port == "0" || port == "-1" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("port in use or not allowed: %w", err)
	}
	return ln.Close()
}

// storageTrouble says why the data directory cannot take writes now, or nil
// when it can: too little free space, or the embedded server's stream or
// JetStream failed by a write error. Readiness reports it and the ledger
// refuses writes with it (a failed stream answers no publish: better said at
// once than timed out).
func storageTrouble(g *diskspace.Guard, srv *server.Server, sl *natsserver.StorageLog) error {
	if g != nil {
		if err := g.Check(); err != nil {
			return err
		}
	}
	if sl != nil {
		if f := sl.Failure(); f != "" {
			return fmt.Errorf("the embedded server could not write to disk (%s); serve restarts itself in place once the disk has room", f)
		}
	}
	if srv != nil && !srv.JetStreamEnabled() {
		return errors.New("JetStream is disabled on the embedded server after a storage error (full or read-only disk); serve restarts itself in place once the disk has room")
	}
	return nil
}
