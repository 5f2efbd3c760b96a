// Command toolsvc is the external tool service of the fault suite: a
// separate process that speaks the wire protocol of docs/protocol.md ("A
// tool service, step by step") with nothing but a NATS client and JSON. It
// pulls its tool's durable consumer (tool.consumer), reads each call's
// arguments (card.get), writes a tool.result card whose id and content
// derive from the call (card.put), reports (report) and acks the command.
// Everything it does is safe to repeat, so a SIGKILL at any point is undone
// by the command's redelivery.
//
// A call's arguments may ask for an outcome: {"fail": "<error code>"} makes
// it report status failed with that error code, {"delay_ms": N} makes it
// answer N ms later (after the deadline, to be refused as late).
//
// It prints one line per event on standard output, which the tests count:
// "ready" once it pulls, "reported <turn> <call> duplicate=<bool>" after each
// accepted report, "refused <op> <turn> <call>: <error>" for a refusal.
//
// With -side-effectful it serves a side_effectful tool instead, with intent
// before effect (attempt.start) and reconcile: see sideeffect.go.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var out sync.Mutex

func say(format string, args ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Printf(format+"\n", args...)
}

type reply struct {
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// refusal is an answer that is final: the same request gets it again.
type refusal struct{ code, message string }

func (r *refusal) Error() string { return r.code + ": " + r.message }

type svc struct {
	nc       *nats.Conn
	project  string
	target   string
	sourceID string
	// se is the side-effectful mode's settings (sideeffect.go); nil
	// outside it.
	se *sideEffect
	// ackWait is the consumer's ack wait (tool.consumer's ack_wait_ms).
	ackWait time.Duration
}

// request sends one API request, retrying timeouts, lost connections and
// `internal` (docs/durability.md) for up to a minute; msg, when given, is
// told the call is in progress so its ack wait restarts.
func (s *svc) request(ctx context.Context, op string, h nats.Header, body any, msg jetstream.Msg) (json.RawMessage, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	subject := "cgledger.v1." + s.project + "." + s.target + "." + op
	giveUp := time.Now().Add(time.Minute)
	backoff := 100 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := s.nc.RequestMsgWithContext(rctx, &nats.Msg{Subject: subject, Header: h, Data: data})
		cancel()
		if err == nil {
			var r reply
			if err := json.Unmarshal(m.Data, &r); err != nil {
				return nil, fmt.Errorf("%s: decode reply: %w", op, err)
			}
			if r.OK {
				return r.Result, nil
			}
			if r.Error == nil {
				return nil, fmt.Errorf("%s: reply without result or error", op)
			}
			if r.Error.Code != "internal" {
				return nil, &refusal{r.Error.Code, r.Error.Message}
			}
			err = errors.New(r.Error.Message)
		}
		if time.Now().After(giveUp) || ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if msg != nil {
			_ = msg.InProgress()
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (s *svc) handle(ctx context.Context, msg jetstream.Msg) {
	if s.se != nil {
		s.handleSideEffectful(ctx, msg)
		return
	}
	d, ok := s.receive(msg)
	if !ok {
		return
	}
	res, err := s.request(ctx, "card.get", nil, map[string]any{"project_id": d.project, "card_ids": []string{d.payload.ToolCallCardID}}, msg)
	if err != nil {
		d.fail("card.get", err)
		return
	}
	var got struct {
		Cards []struct {
			Card struct {
				AgentTurnID string          `json:"agent_turn_id"`
				ToolCallID  string          `json:"tool_call_id"`
				Content     json.RawMessage `json:"content"`
				Metadata    json.RawMessage `json:"metadata"`
			} `json:"card"`
		} `json:"cards"`
		Missing []string `json:"missing"`
	}
	if err := json.Unmarshal(res, &got); err != nil || len(got.Cards) != 1 {
		d.fail("card.get", &refusal{"missing", fmt.Sprintf("card %s: %s (%v)", d.payload.ToolCallCardID, res, err)})
		return
	}
	cc := got.Cards[0].Card
	var content struct {
		Arguments json.RawMessage `json:"arguments"`
	}
	_ = json.Unmarshal(cc.Content, &content)
	var args struct {
		DelayMS int64  `json:"delay_ms"`
		Fail    string `json:"fail"`
	}
	_ = json.Unmarshal(content.Arguments, &args)
	if args.DelayMS > 0 {
		// An answer after the call's deadline: the ledger refuses it as late.
		select {
		case <-time.After(time.Duration(args.DelayMS) * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}

	// The result card is a function of the call, so a repeat after a crash
	// puts the same card (answered as a duplicate).
	sum := sha256.Sum256([]byte(d.project + "\x00" + d.turn + "\x00" + d.call))
	result := map[string]any{"status": "success", "result": map[string]json.RawMessage{"echo": content.Arguments}}
	status := "success"
	if args.Fail != "" {
		status = "failed"
		result = map[string]any{"status": status, "result": nil, "error": map[string]string{"code": args.Fail, "message": "asked to fail"}}
	}
	d.finish(ctx, status, "res-"+hex.EncodeToString(sum[:12]), result, cc.Metadata, "", nil)
}

func main() {
	url := flag.String("nats-url", nats.DefaultURL, "NATS server")
	creds := flag.String("creds", "", "credential file (cgledger creds issue --role tool --tool TARGET)")
	inboxPrefix := flag.String("inbox-prefix", "", "inbox prefix of the credential")
	project := flag.String("project", "", "project id")
	target := flag.String("target", "", "tool target")
	sourceID := flag.String("source-id", "svc.faults", "author_id of result cards")
	workers := flag.Int("workers", 4, "commands handled at once")
	sideEffectful := flag.Bool("side-effectful", false, "serve a side_effectful tool that appends its effects to -effects (sideeffect.go)")
	effects := flag.String("effects", "", "with -side-effectful: the file of effects")
	reconcile := flag.Bool("reconcile", false, "with -side-effectful: reconcile an open attempt from the effects file")
	crash := flag.String("crash", "none", "with -side-effectful: attempt | effect | card | none (block there until killed)")
	flag.Parse()

	opts := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond), nats.RetryOnFailedConnect(true)}
	if *creds != "" {
		opts = append(opts, nats.UserCredentials(*creds))
	}
	if *inboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(*inboxPrefix))
	}
	nc, err := nats.Connect(*url, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(3)
	}
	defer nc.Close()
	s := &svc{nc: nc, project: *project, target: *target, sourceID: *sourceID}
	if *sideEffectful {
		s.se = &sideEffect{effects: *effects, reconcile: *reconcile, crash: *crash, executor: fmt.Sprintf("%s-%d", *sourceID, os.Getpid())}
	}
	ctx := context.Background()

	res, err := s.request(ctx, "tool.consumer", nil, map[string]any{}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tool.consumer:", err)
		os.Exit(1)
	}
	var ci struct {
		Stream    string `json:"stream"`
		Consumer  string `json:"consumer"`
		APIPrefix string `json:"api_prefix"`
		AckWaitMS int64  `json:"ack_wait_ms"`
	}
	if err := json.Unmarshal(res, &ci); err != nil || ci.AckWaitMS <= 0 {
		fmt.Fprintln(os.Stderr, "tool.consumer:", string(res), err)
		os.Exit(1)
	}
	s.ackWait = time.Duration(ci.AckWaitMS) * time.Millisecond
	js, err := jetstream.NewWithAPIPrefix(nc, ci.APIPrefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, "jetstream:", err)
		os.Exit(1)
	}
	cons, err := js.Consumer(ctx, ci.Stream, ci.Consumer)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(*workers))
	if err != nil {
		fmt.Fprintln(os.Stderr, "pull:", err)
		os.Exit(1)
	}
	say("ready %s/%s", ci.Stream, ci.Consumer)
	work := make(chan jetstream.Msg)
	for range *workers {
		go func() {
			for msg := range work {
				s.handle(ctx, msg)
			}
		}()
	}
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			fmt.Fprintln(os.Stderr, "next:", err)
			continue
		}
		work <- msg
	}
}
