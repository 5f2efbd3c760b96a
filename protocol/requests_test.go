package protocol_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// requestParsers validate one request each, as the operation of the same
// name reads it: the headers and body in, every violation out. "card" is
// the card of a card.put, "command" a tool command as a tool service
// receives it (subject=...), "tool.register" a definition (project=...).
var requestParsers = map[string]func(td *datadriven.TestData, h nats.Header, body []byte) (protocol.Violations, error){
	protocol.OpReport: func(_ *datadriven.TestData, h nats.Header, body []byte) (protocol.Violations, error) {
		_, vs := protocol.ParseReport(h, body)
		return vs, nil
	},
	protocol.OpReportResult: func(_ *datadriven.TestData, h nats.Header, body []byte) (protocol.Violations, error) {
		_, vs := protocol.ParseReportResult(h, body)
		return vs, nil
	},
	"card": func(_ *datadriven.TestData, _ nats.Header, body []byte) (protocol.Violations, error) {
		var vs protocol.Violations
		protocol.DecodeCard("card", body, &vs)
		return vs, nil
	},
	"command": func(td *datadriven.TestData, h nats.Header, body []byte) (protocol.Violations, error) {
		_, err := protocol.ParseToolCommand(arg(td, "subject"), h, body)
		return nil, err
	},
	protocol.OpToolRegister: func(td *datadriven.TestData, _ nats.Header, body []byte) (protocol.Violations, error) {
		_, err := protocol.ParseToolYAML(arg(td, "project"), body)
		return nil, err
	},
	protocol.OpCommandReject:      bodyParser(protocol.ParseCommandRejection),
	protocol.OpAttemptStart:       bodyParser(protocol.ParseAttemptStart),
	protocol.OpPrepare:            bodyParser(protocol.ParsePrepare),
	protocol.OpCommit:             bodyParser(protocol.ParseDecision),
	protocol.OpAbort:              bodyParser(protocol.ParseDecision),
	protocol.OpApprove:            bodyParser(protocol.ParseApprovalRequest),
	protocol.OpDeny:               bodyParser(protocol.ParseApprovalRequest),
	protocol.OpCallCancel:         bodyParser(protocol.ParseOperatorCancelRequest),
	protocol.OpCallResolve:        bodyParser(protocol.ParseResolveRequest),
	protocol.OpCallRedrive:        bodyParser(protocol.ParseRedriveRequest),
	protocol.OpToolPause:          bodyParser(protocol.ParseToolPauseRequest),
	protocol.OpToolResume:         bodyParser(protocol.ParseToolPauseRequest),
	protocol.OpConformanceCommand: bodyParser(protocol.ParseConformanceCommand),
	protocol.OpConformanceObserve: bodyParser(protocol.ParseConformanceObserve),
	protocol.OpRosterSet:          bodyParser(protocol.ParseRosterEntry),
	protocol.OpCardPut:            bodyParser(protocol.ParseCardPut),
	protocol.OpCardGet:            bodyParser(protocol.ParseCardGetRequest),
	protocol.OpRosterGet:          bodyParser(protocol.ParseRosterGetRequest),
	protocol.OpCallGet:            bodyParser(protocol.ParseCallGetRequest),
	protocol.OpCancelGet:          bodyParser(protocol.ParseCancelGetRequest),
	protocol.OpToolGet:            bodyParser(protocol.ParseToolGetRequest),
	protocol.OpToolList:           bodyParser(protocol.ParseToolListRequest),
	protocol.OpProjectorSkip:      bodyParser(protocol.ParseSkipRequest),
	protocol.OpViewsSnapshot: func(_ *datadriven.TestData, _ nats.Header, body []byte) (protocol.Violations, error) {
		return protocol.ParseViewsSnapshotRequest(body), nil
	},
	protocol.OpViewsSnapshotList: func(_ *datadriven.TestData, _ nats.Header, body []byte) (protocol.Violations, error) {
		return protocol.ParseViewsSnapshotRequest(body), nil
	},
	protocol.OpToolConsumer: func(_ *datadriven.TestData, _ nats.Header, body []byte) (protocol.Violations, error) {
		return protocol.ParseToolConsumerRequest(body), nil
	},
	// dispatch reads a dispatch as a ledger serving v1 does: what the
	// ledger's state answers (the checks asked for) is not run.
	protocol.OpDispatch: func(_ *datadriven.TestData, h nats.Header, body []byte) (protocol.Violations, error) {
		_, _, vs := protocol.ParseDispatch(protocol.DefaultVersion, h, body)
		return vs, nil
	},
	protocol.OpConsume: bodyParser(protocol.ParseConsumeRequest),
	protocol.OpCancel:  bodyParser(protocol.ParseCancelRequest),
	protocol.OpResume:  bodyParser(protocol.ParseResumeRequest),
	// identity reads a call's identity headers (the whole input), as
	// dispatch, report and a tool command do; require-call and require-step
	// require CG-Tool-Call-Id and CG-Step-Id.
	"identity": func(td *datadriven.TestData, _ nats.Header, _ []byte) (protocol.Violations, error) {
		h, _ := splitRequest(td.Input + "\n\n")
		_, vs := protocol.ParseIdentity(h, protocol.IdentityRules{RequireToolCallID: td.HasArg("require-call"), RequireStepID: td.HasArg("require-step")})
		return vs, nil
	},
	// request checks a request on an API subject before its operation
	// reads it (CheckRequest): the subject's tokens, the reply, the header
	// block and the body against the subject's project and actor.
	"request": func(td *datadriven.TestData, h nats.Header, body []byte) (protocol.Violations, error) {
		subject := arg(td, "subject")
		op := subject[strings.LastIndex(subject, ".")+1:]
		if toks := strings.SplitN(subject, ".", 5); len(toks) == 5 {
			op = toks[4]
		}
		var reply string
		reply = arg(td, "reply")
		_, e, _ := protocol.CheckRequest(op, &nats.Msg{Subject: subject, Reply: reply, Header: h, Data: body})
		if e == nil {
			return nil, nil
		}
		return nil, e
	},
}

func bodyParser[T any](parse func([]byte) (T, protocol.Violations)) func(*datadriven.TestData, nats.Header, []byte) (protocol.Violations, error) {
	return func(_ *datadriven.TestData, _ nats.Header, body []byte) (protocol.Violations, error) {
		_, vs := parse(body)
		return vs, nil
	}
}

func arg(td *datadriven.TestData, key string) string {
	a, ok := td.Arg(key)
	if !ok || len(a.Vals) == 0 {
		return ""
	}
	return a.Vals[0]
}

// headerLine is one header of a case's input: Name: value.
var headerLine = regexp.MustCompile(`^([!-9;-~]+): ?(.*)$`)

// splitRequest reads a case's input: the header lines (Name: value), a
// blank line, then the body. An input without that blank line after header
// lines is all body (a YAML definition looks like headers). A value
// "<empty>" is an empty header.
func splitRequest(input string) (nats.Header, []byte) {
	lines := strings.Split(input, "\n")
	h := nats.Header{}
	i := 0
	for ; i < len(lines); i++ {
		m := headerLine.FindStringSubmatch(lines[i])
		if m == nil {
			break
		}
		v := m[2]
		if v == "<empty>" {
			v = ""
		}
		h[m[1]] = append(h[m[1]], v)
	}
	if i == 0 || i == len(lines) || lines[i] != "" {
		return nil, []byte(input)
	}
	return h, []byte(strings.Join(lines[i+1:], "\n"))
}

// TestRequests runs the cases of testdata/requests: a request's headers and
// body in, its violations out (field code: message), or "ok". Regenerate the
// expected output with go test ./protocol -run TestRequests -rewrite.
func TestRequests(t *testing.T) {
	datadriven.Walk(t, "testdata/requests", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			parse, ok := requestParsers[td.Cmd]
			if !ok {
				td.Fatalf(t, "no request %q", td.Cmd)
			}
			h, body := splitRequest(td.Input)
			vs, err := parse(td, h, body)
			var b strings.Builder
			if err != nil {
				e, ok := protocol.AsError(err)
				if !ok {
					return "error: " + err.Error() + "\n"
				}
				fmt.Fprintf(&b, "%s: %s\n", e.Code, e.Message)
				vs = e.Violations
			}
			for _, v := range vs {
				fmt.Fprintf(&b, "%s %s: %s\n", v.Field, v.Code, v.Message)
			}
			if b.Len() == 0 {
				return "ok\n"
			}
			return b.String()
		})
	})
}

// TestEveryWriteHasCases: every write operation of the table, and every
// read the ledger serves, has request cases in testdata/requests, run
// through its protocol parser.
func TestEveryWriteHasCases(t *testing.T) {
	files, err := filepath.Glob("testdata/requests/*.txt")
	require.NoError(t, err)
	cmds := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, blk := range strings.Split("\n"+string(b), "\n\n") {
			for _, line := range strings.Split(strings.TrimSpace(blk), "\n") {
				if line != "" && !strings.HasPrefix(line, "#") {
					cmds[strings.Fields(line)[0]] = true
					break
				}
			}
		}
	}
	for _, o := range protocol.Operations {
		if !o.Write && o.Server != protocol.ServerLedger {
			// The views' reads parse their own requests.
			continue
		}
		require.Contains(t, requestParsers, o.Name)
		require.True(t, cmds[o.Name], "%s has no case in testdata/requests", o.Name)
	}
}
