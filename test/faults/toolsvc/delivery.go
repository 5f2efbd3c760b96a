package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// delivery is one command as the service received it: what every step of
// docs/protocol.md "A tool service, step by step" needs, with the answers a
// step gives the command (fail, ack) and the last two steps (result card
// and report) in one place for both modes.
type delivery struct {
	s                *svc
	msg              jetstream.Msg
	h                nats.Header
	project, channel string
	turn, call, key  string
	payload          struct {
		ToolCallCardID string `json:"tool_call_card_id"`
		ToolName       string `json:"tool_name"`
		AfterExecution string `json:"after_execution"`
		DeadlineUnixMS int64  `json:"deadline_unix_ms"`
	}
}

// receive reads a command (cg.v1.<project>.<channel>.cmd.tool.<target>...);
// one it cannot read is terminated, and ok is false.
func (s *svc) receive(msg jetstream.Msg) (d *delivery, ok bool) {
	tok := strings.Split(msg.Subject(), ".")
	if len(tok) < 7 {
		say("refused command %s: bad subject", msg.Subject())
		_ = msg.Term()
		return nil, false
	}
	d = &delivery{s: s, msg: msg, h: msg.Headers(), project: tok[2], channel: tok[3]}
	d.turn, d.call, d.key = d.h.Get("CG-Agent-Turn-Id"), d.h.Get("CG-Tool-Call-Id"), d.h.Get("CG-Idempotency-Key")
	if err := json.Unmarshal(msg.Data(), &d.payload); err != nil {
		say("refused command %s %s: payload: %v", d.turn, d.call, err)
		_ = msg.Term()
		return nil, false
	}
	return d, true
}

// fail answers a step that failed: a refusal is final (terminate), anything
// else comes back (nak).
func (d *delivery) fail(op string, err error) {
	var r *refusal
	if errors.As(err, &r) {
		say("refused %s %s %s: %v", op, d.turn, d.call, err)
		_ = d.msg.Term()
		return
	}
	say("failed %s %s %s: %v", op, d.turn, d.call, err)
	_ = d.msg.Nak()
}

// ack acknowledges the command for good and says what was done.
func (d *delivery) ack(ctx context.Context, what string) {
	if err := d.msg.DoubleAck(ctx); err != nil {
		say("failed ack %s %s: %v", d.turn, d.call, err)
		return
	}
	say("%s", what)
}

// finish puts the result card and reports it (steps 5 and 6), then acks.
// afterCard, when set, runs between the two (a crash point).
func (d *delivery) finish(ctx context.Context, status, cardID string, content any, metadata json.RawMessage, attemptOutcome string, afterCard func()) {
	card := map[string]any{
		"card_id": cardID, "project_id": d.project, "type": "tool.result",
		"author_id": d.s.sourceID, "function_name": d.payload.ToolName,
		"agent_turn_id": d.turn, "tool_call_id": d.call,
		"content": content, "metadata": metadata,
	}
	if _, err := d.s.request(ctx, "card.put", nil, card, d.msg); err != nil {
		d.fail("card.put", err)
		return
	}
	if afterCard != nil {
		afterCard()
	}
	rh := nats.Header{}
	for _, k := range []string{"CG-Agent-Id", "CG-Agent-Turn-Id", "CG-Turn-Epoch", "CG-Tool-Call-Id", "CG-Step-Id"} {
		if v := d.h.Get(k); v != "" {
			rh.Set(k, v)
		}
	}
	rh.Set("CG-Project-Id", d.project)
	rh.Set("CG-Channel-Id", d.channel)
	rh.Set("CG-Source-Id", d.s.sourceID)
	rh.Set("CG-Source-Function", d.payload.ToolName)
	body := map[string]string{"status": status, "after_execution": d.payload.AfterExecution, "tool_result_card_id": cardID}
	if attemptOutcome != "" {
		body["attempt_outcome"] = attemptOutcome
	}
	res, err := d.s.request(ctx, "report", rh, body, d.msg)
	if err != nil {
		d.fail("report", err)
		return
	}
	var outcome struct {
		Duplicate bool `json:"duplicate"`
	}
	_ = json.Unmarshal(res, &outcome)
	d.ack(ctx, fmt.Sprintf("reported %s %s duplicate=%t", d.turn, d.call, outcome.Duplicate))
}
