// Command payexec is the side-effect gate's executor process: the Go
// executor on a client.Client (as docs/executor.md "In another process"
// shows), serving one side_effectful tool, pay, that appends one line per
// effect to a file. The test kills it with SIGKILL at a chosen point of a
// call and starts it again.
//
// Flags: -nats-url, -effects (the file), -reconcile (give pay a reconcile
// that looks its call's idempotency key up in the file), -crash (before:
// block before the effect; after: block after it, before the report; none).
// It prints "ready" once pulling, and "attempt <n> <call>" then
// "effect <call>" as the tool runs.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/protocol"
)

var out sync.Mutex

func say(format string, args ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Printf(format+"\n", args...)
}

type pay struct {
	effects string
	crash   string
}

func (p *pay) Run(ctx context.Context, call *executor.Call) executor.Outcome {
	say("attempt %d %s", call.Attempt, call.ToolCallID)
	if p.crash == "before" {
		select {} // until killed, before the effect
	}
	f, err := os.OpenFile(p.effects, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return executor.Terminal("S-TOOL-CONFIG", err.Error(), "fix the effects file")
	}
	_, err = fmt.Fprintf(f, "%s %s\n", call.IdempotencyKey, call.ToolCallID)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return executor.Terminal("S-TOOL-CONFIG", err.Error(), "fix the effects file")
	}
	say("effect %s", call.ToolCallID)
	if p.crash == "after" {
		select {} // until killed, after the effect and before the report
	}
	return executor.Success(map[string]any{"paid": true})
}

// reconcilingPay reconciles by looking the call's key up in the file, as a
// payment API is asked about an idempotency key.
type reconcilingPay struct{ *pay }

func (p reconcilingPay) Reconcile(_ context.Context, call *executor.Call) (bool, executor.Outcome, error) {
	f, err := os.Open(p.effects)
	if os.IsNotExist(err) {
		return false, executor.Outcome{}, nil
	}
	if err != nil {
		return false, executor.Outcome{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), call.IdempotencyKey+" ") {
			say("reconciled done %s", call.ToolCallID)
			return true, executor.Success(map[string]any{"paid": true}), nil
		}
	}
	say("reconciled not_done %s", call.ToolCallID)
	return false, executor.Outcome{}, sc.Err()
}

func main() {
	url := flag.String("nats-url", "", "NATS URL of the ledger")
	effects := flag.String("effects", "", "file pay appends its effects to")
	reconcile := flag.Bool("reconcile", false, "give pay a reconcile")
	crash := flag.String("crash", "none", "before | after | none")
	flag.Parse()
	nc, err := nats.Connect(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(2)
	}
	ex, err := executor.New(client.New(nc), nc, executor.Config{AckWait: time.Second, SourceID: "payexec"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "executor:", err)
		os.Exit(2)
	}
	var tool executor.Tool = &pay{effects: *effects, crash: *crash}
	if *reconcile {
		tool = reconcilingPay{&pay{effects: *effects, crash: *crash}}
	}
	def := &protocol.ToolDefinition{
		ToolName: "pay", Parameters: []byte(`{"type":"object"}`), TargetSubject: protocol.ToolTargetTemplate("pay"),
		AfterExecution: protocol.AfterSuspend, Determinism: protocol.DeterminismSideEffectful,
		Limits: protocol.ToolLimits{TimeoutMSDefault: 60_000, TimeoutMSMax: 60_000, ConcurrencyMax: 4},
		Retry:  protocol.RetryPolicy{MaxAttempts: 3, BaseMS: 10, CapMS: 100},
	}
	if err := ex.Register("pay", tool, def); err != nil {
		fmt.Fprintln(os.Stderr, "register:", err)
		os.Exit(2)
	}
	if err := ex.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "start:", err)
		os.Exit(2)
	}
	say("ready")
	select {} // until killed
}
