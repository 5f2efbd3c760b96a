GO ?= go

.PHONY: test vet tools build fuzz bench

## test: vet and run every test with the race detector (the README's test command).
test: vet tools
	$(GO) test -race -count=1 ./...

## tools: promtool (Debian's prometheus package) for the alert rule tests, chromium for the
## audit web page's browser test, the npm MCP servers of test/mcp/servers for the MCP bridge tests,
## and the MCP clients of test/mcp/clients (npm ci: the TypeScript SDK, the conformance suite and
## the Node 22 it needs), when they can be installed.
tools:
	@command -v promtool >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		(apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1 || \
		 (apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1))) || \
		echo "promtool not installed: the alert rule tests will skip (apt-get install prometheus)"
	@command -v chromium >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		(apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || \
		 (apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends chromium >/dev/null 2>&1))) || \
		echo "chromium not installed: the audit web page test will skip (apt-get install chromium)"
	@command -v npm >/dev/null 2>&1 && (cd test/mcp/servers && npm ci --no-audit --no-fund --silent >/dev/null 2>&1) || \
		echo "MCP test servers not installed: the MCP bridge tests will skip (npm ci in test/mcp/servers)"
	@(cd test/mcp/clients && { [ node_modules/.package-lock.json -nt package-lock.json ] || \
		{ command -v npm >/dev/null 2>&1 && npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1; }; }) || \
		echo "npm ci in test/mcp/clients failed: the MCP TypeScript client and conformance tests will skip"

vet:
	$(GO) vet ./...

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)

## build: the cgledger binary in bin/, stamped with version and commit.
build:
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o bin/cgledger ./cmd/cgledger

## fuzz: run each fuzz target for FUZZTIME (default 30s).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./protocol -run '^$$' -fuzz '^FuzzParseSubject$$' -fuzztime $(FUZZTIME)
	$(GO) test ./protocol -run '^$$' -fuzz '^FuzzParseIdentity$$' -fuzztime $(FUZZTIME)
	$(GO) test ./protocol -run '^$$' -fuzz '^FuzzParseToolCommand$$' -fuzztime $(FUZZTIME)
	$(GO) test ./protocol -run '^$$' -fuzz '^FuzzParseCard$$' -fuzztime $(FUZZTIME)
	$(GO) test ./protocol -run '^$$' -fuzz '^FuzzParseReport$$' -fuzztime $(FUZZTIME)

## bench: the tool call against raw JetStream side by side (cgledger bench), then the Go
## benchmarks of the ledger and projector, each with its raw baseline in the same run.
bench:
	$(GO) run ./cmd/cgledger bench
	$(GO) test ./ledger -run '^$$' -bench . -benchtime 2s
	$(GO) test ./projector -run '^$$' -bench . -benchtime 2s

## faults: the fault suite's long profile (test/faults/): FAULTS_ITERATIONS SIGKILLs per fault
## under load, then the checker's line per fault; CGLEDGER_FAULTS_SEED=N replays a run's kill points.
.PHONY: faults
FAULTS_ITERATIONS ?= 30
faults:
	CGLEDGER_FAULTS_ITERATIONS=$(FAULTS_ITERATIONS) $(GO) test -count=1 -v -timeout 60m -run . ./test/faults/
