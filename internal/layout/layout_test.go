// Package layout holds the test of the module's dependency rules
// (docs/architecture.md, "Rules"). It has no code of its own.
package layout

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/cgledger/cgledger"

// pkg is what `go list -json` says of a package that the rules read.
type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// rule forbids packages matching from to import packages matching to.
type rule struct {
	from, to string
	why      string
}

// match reports whether path (relative to the module) is pattern or, for
// a pattern ending in "/...", under it; "..." matches every package.
func match(pattern, path string) bool {
	if pattern == "..." {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

// rules are the architecture's dependency rules (docs/architecture.md).
var rules = []rule{
	{from: "ledger", to: "projector", why: "the write side never depends on the views"},
	{from: "ledger", to: "executor", why: "the ledger does not run tools"},
	{from: "ledger", to: "archive", why: "the archive reads the ledger, not the reverse"},
	{from: "ledger/...", to: "replay", why: "replay sits above the ledger and the views"},
	{from: "executor", to: "executor/jina", why: "the executor names no vendor: a vendor's tool registers itself"},
	{from: "protocol", to: "executor/jina", why: "the protocol names no vendor"},
	{from: "executor/...", to: "projector/...", why: "executors never depend on the views"},
	{from: "executor/...", to: "archive", why: "executors never read history"},
	{from: "archive", to: "projector/...", why: "the archive is read by the views, not the reverse"},
	{from: "archive", to: "executor/...", why: "the archive does not run tools"},
	{from: "projector/...", to: "executor/...", why: "the views do not run tools"},
	{from: "projector/...", to: "archive", why: "the views read history through projector.ArchiveReader, which the archive implements"},
	{from: "...", to: "cmd/...", why: "the binary is a leaf: nothing imports it"},
	{from: "protocol", to: "...", why: "the protocol is pure: it imports nothing of ours"},
	{from: "client", to: "ledger/...", why: "the client speaks the wire protocol, not the ledger's Go API"},
	{from: "client", to: "executor/...", why: "the client speaks the wire protocol only"},
	{from: "client", to: "projector/...", why: "the client speaks the wire protocol only"},
	{from: "ledger/...", to: "client", why: "the ledger answers the client, it does not call itself over NATS"},
	{from: "conformance", to: "ledger/...", why: "the conformance checker judges a service through the wire protocol only, as an admin"},
	{from: "conformance", to: "executor/...", why: "the conformance checker runs no tools"},
	{from: "conformance", to: "projector/...", why: "the conformance checker reads the ledger, not the views"},
	{from: "internal/...", to: "ledger/...", why: "internal packages are a leaf layer"},
	{from: "internal/...", to: "projector/...", why: "internal packages are a leaf layer"},
	{from: "internal/...", to: "executor/...", why: "internal packages are a leaf layer"},
	{from: "internal/...", to: "archive", why: "internal packages are a leaf layer"},
	{from: "internal/...", to: "replay", why: "internal packages are a leaf layer"},
	{from: "internal/...", to: "mcpbridge", why: "internal packages are a leaf layer"},
	{from: "mcpbridge", to: "ledger/...", why: "the MCP bridge is a tool service: it reaches the ledger through executor.Ledger and the client"},
	{from: "mcpbridge", to: "projector/...", why: "the MCP bridge never depends on the views"},
	{from: "mcpbridge", to: "archive", why: "the MCP bridge never reads history"},
	{from: "mcpbridge", to: "replay", why: "the MCP bridge never reads history"},
	{from: "mcpbridge", to: "auditweb", why: "the MCP bridge serves tools, not pages"},
	{from: "ledger/...", to: "mcpbridge", why: "only the binary runs the MCP bridge"},
	{from: "executor/...", to: "mcpbridge", why: "only the binary runs the MCP bridge; the bridge builds on the executor"},
	{from: "client", to: "mcpbridge", why: "only the binary runs the MCP bridge"},
	{from: "projector/...", to: "mcpbridge", why: "only the binary runs the MCP bridge"},
	{from: "archive", to: "mcpbridge", why: "only the binary runs the MCP bridge"},
	{from: "replay", to: "mcpbridge", why: "only the binary runs the MCP bridge"},
	{from: "auditweb", to: "mcpbridge", why: "only the binary runs the MCP bridge"},
	{from: "mcpfront", to: "ledger/...", why: "the MCP front door reaches the ledger as a worker does, through the client"},
	{from: "mcpfront", to: "executor/...", why: "the MCP front door does not run tools"},
	{from: "mcpfront", to: "projector/...", why: "the MCP front door answers from the ledger API, not the views"},
	{from: "mcpfront", to: "archive", why: "the MCP front door does not read history"},
	{from: "mcpfront", to: "replay", why: "the MCP front door does not read history"},
	{from: "ledger/...", to: "mcpfront", why: "only the binary wires the MCP front door"},
	{from: "executor/...", to: "mcpfront", why: "only the binary wires the MCP front door"},
	{from: "projector/...", to: "mcpfront", why: "only the binary wires the MCP front door"},
	{from: "client", to: "mcpfront", why: "only the binary wires the MCP front door"},
	{from: "protocol", to: "mcpfront", why: "only the binary wires the MCP front door"},
	{from: "archive", to: "mcpfront", why: "only the binary wires the MCP front door"},
	{from: "internal/...", to: "mcpfront", why: "only the binary wires the MCP front door"},
	{from: "stream", to: "ledger/...", why: "the stream's format and history are below the writer: ledger imports stream"},
	{from: "archive", to: "ledger/...", why: "the archive reads the stream's format and history (package stream), not the writer"},
	{from: "replay", to: "ledger/...", why: "replay imports an export with package stream, not the writer"},
	{from: "executor", to: "ledger/...", why: "the executor reaches the ledger through executor.Ledger; stream names and tool labels are in stream and internal/toollabels"},
	{from: "projector", to: "ledger/...", why: "the views read the stream (package stream) and check their one API operation with protocol; a refusal is recorded through projector.RefusalRecorder"},
	{from: "httpclient", to: "ledger/...", why: "the HTTP client speaks HTTP: its answers are the types of the views, the registry and the protocol, not the writer's"},
	{from: "httpclient", to: "archive", why: "the HTTP client reads history through the server"},
	{from: "httpclient", to: "replay", why: "the HTTP client reads history through the server"},
	{from: "httpclient", to: "client", why: "the HTTP client speaks HTTP, the client NATS: neither builds on the other"},
	{from: "httpclient", to: "mcpbridge", why: "only the binary runs the MCP bridge"},
	{from: "httpclient", to: "mcpfront", why: "only the binary wires the MCP front door"},
	{from: "httpclient", to: "httpapi/...", why: "the HTTP client speaks the documented API, not the server's code"},
	{from: "httpclient", to: "internal/...", why: "the HTTP client is for other modules too: nothing internal in its API"},
	{from: "ledger/...", to: "httpclient", why: "the server never calls itself over HTTP"},
	{from: "projector/...", to: "httpclient", why: "the server never calls itself over HTTP"},
	{from: "executor/...", to: "httpclient", why: "the server never calls itself over HTTP"},
	{from: "ledger/...", to: "snapshot", why: "snapshots sit above the views: the binary wires them"},
	{from: "projector/...", to: "snapshot", why: "snapshots sit above the views: the binary wires them"},
	{from: "executor/...", to: "snapshot", why: "snapshots sit above the views: the binary wires them"},
	{from: "client", to: "httpclient", why: "the client speaks NATS, the HTTP client HTTP: neither builds on the other"},
}

// onlyImports limits the packages of ours that a package may import to
// the listed patterns (and itself).
var onlyImports = []struct {
	from    string
	allowed []string
	why     string
}{
	{from: "stream", allowed: []string{"protocol", "internal/..."}, why: "the stream's format and history are read by every side: they need only the protocol and leaf helpers"},
	{from: "snapshot", allowed: []string{"projector", "protocol", "stream", "internal/..."}, why: "views snapshots are the views' files and the stream's chain: nothing of the writer or the tools"},
}

// harnesses are test harness packages: only tests and other harnesses
// import them.
var harnesses = []string{"ledger/ledgertest", "internal/natstest", "internal/servetest", "internal/testenv", "internal/violationtest", "test/..."}

// importedOnlyBy maps a package to the only packages that may import it.
var importedOnlyBy = map[string]struct{ by, why string }{
	"bench": {by: "cmd/...", why: "the bench is run by the binary's bench verb only"},
}

func list(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("go list: %v\n%s", err, ee.Stderr)
	}
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages of %s", len(pkgs), module)
	}
	return pkgs
}

func rel(path string) (string, bool) {
	if path == module {
		return ".", true
	}
	return strings.CutPrefix(path, module+"/")
}

// TestDependencyRules fails naming every import that breaks a rule.
func TestDependencyRules(t *testing.T) {
	for _, p := range list(t) {
		from, _ := rel(p.ImportPath)
		isHarness := slices.ContainsFunc(harnesses, func(h string) bool { return match(h, from) })
		for _, imp := range p.Imports {
			to, ours := rel(imp)
			if !ours {
				continue
			}
			for _, r := range rules {
				if match(r.from, from) && match(r.to, to) && from != to {
					t.Errorf("%s imports %s: %s", from, to, r.why)
				}
			}
			if only, ok := importedOnlyBy[to]; ok && !match(only.by, from) && from != to {
				t.Errorf("%s imports %s: %s", from, to, only.why)
			}
			if !isHarness && slices.ContainsFunc(harnesses, func(h string) bool { return match(h, to) }) {
				t.Errorf("%s imports the test harness %s outside its tests", from, to)
			}
		}
	}
}

// TestOnlyImports fails naming every import of ours outside what a
// package may import (onlyImports).
func TestOnlyImports(t *testing.T) {
	for _, p := range list(t) {
		from, _ := rel(p.ImportPath)
		for _, o := range onlyImports {
			if !match(o.from, from) {
				continue
			}
			for _, imp := range p.Imports {
				to, ours := rel(imp)
				if !ours || to == from || slices.ContainsFunc(o.allowed, func(a string) bool { return match(a, to) }) {
					continue
				}
				t.Errorf("%s imports %s: %s", from, to, o.why)
			}
		}
	}
}

// TestRulesMatchPackages keeps the rules honest: every pattern names a
// package that exists, so a rename cannot silently void a rule.
func TestRulesMatchPackages(t *testing.T) {
	var paths []string
	for _, p := range list(t) {
		r, _ := rel(p.ImportPath)
		paths = append(paths, r)
	}
	exists := func(pattern string) bool {
		return pattern == "..." || slices.ContainsFunc(paths, func(p string) bool { return match(pattern, p) })
	}
	for _, r := range rules {
		if !exists(r.from) || !exists(r.to) {
			t.Errorf("rule %s -> %s names no package", r.from, r.to)
		}
	}
	for _, o := range onlyImports {
		if !exists(o.from) {
			t.Errorf("import limit of %s names no package", o.from)
		}
		for _, a := range o.allowed {
			if !exists(a) {
				t.Errorf("import limit of %s allows %s, which names no package", o.from, a)
			}
		}
	}
	for to, only := range importedOnlyBy {
		if !exists(to) || !exists(only.by) {
			t.Errorf("rule %s only by %s names no package", to, only.by)
		}
	}
	for _, h := range harnesses {
		if !exists(h) {
			t.Errorf("harness %s names no package", h)
		}
	}
}

// noHTTP are the packages that do not serve HTTP and so do not import
// net/http outside their tests: their routes are httpapi's, over their
// exported queries and operations.
var noHTTP = []string{"projector", "executor", "docs", "ledger"}

// httpapiUsers are the only packages that import httpapi (the router):
// the binary wires it. httpapi/problem, problem+json alone, is for every
// layer that answers HTTP errors (auditweb's file server, mcpfront's MCP
// transport).
var httpapiUsers = []string{"cmd/...", "httpapi/..."}

// TestOnlyHTTPAPIServes fails naming every package of noHTTP that imports
// net/http (or under it) in its code, and every package but httpapiUsers
// that imports httpapi in its code.
func TestOnlyHTTPAPIServes(t *testing.T) {
	for _, p := range list(t) {
		from, _ := rel(p.ImportPath)
		for _, imp := range p.Imports {
			if slices.Contains(noHTTP, from) && (imp == "net/http" || strings.HasPrefix(imp, "net/http/")) {
				t.Errorf("%s imports %s: only httpapi serves HTTP", from, imp)
			}
			if to, ours := rel(imp); ours && to == "httpapi" &&
				!slices.ContainsFunc(httpapiUsers, func(u string) bool { return match(u, from) }) {
				t.Errorf("%s imports httpapi: only the binary wires the router", from)
			}
		}
	}
}
