package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Side-effectful mode (-side-effectful): the tool appends one line per
// effect to the -effects file ("<idempotency key> <call>"), and the service
// follows docs/protocol.md "A tool service, step by step" for a
// side_effectful tool: call.get, cancel.get and card.get on every delivery,
// attempt.start before the effect, and on `started: false` the open attempt
// is resolved, never run again by itself: with -reconcile by looking the
// call's idempotency key up in the effects file (done: reported
// `reconciled`; not done: attempt.start with not_done, then run), without
// it reported failed, S-TOOL-OUTCOME-UNKNOWN, `outcome_unknown`.
//
// -crash stops the service (it blocks until killed) at one point of the
// first call it runs: attempt (after attempt.start, before the effect),
// effect (after the effect, before card.put) or card (after card.put,
// before the report). Extra output lines: "attempt <n> <call>",
// "effect <call>", "crash-point <point> <call>", "reconciled <done|not_done>
// <call>", "outcome_unknown <call>", "answered <state> <call>".

// maxReconcileRounds bounds one delivery's reconcile rounds: each is an
// open attempt found not done and the next one taken by someone else
// first, which only a race between services does.
const maxReconcileRounds = 4

type sideEffect struct {
	effects   string
	reconcile bool
	crash     string
	executor  string
}

// crashAt blocks for ever (until the test's SIGKILL) at point, telling
// the consumer the command is in progress, as a live service running a
// long tool does: the command comes back only once the process is gone.
func (s *svc) crashAt(msg jetstream.Msg, point, call string) {
	if s.se.crash != point {
		return
	}
	say("crash-point %s %s", point, call)
	for {
		_ = msg.InProgress()
		time.Sleep(s.ackWait / 3)
	}
}

// effect is the tool's side effect: one line, synced, per run.
func (se *sideEffect) effect(key, call string) error {
	f, err := os.OpenFile(se.effects, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s %s\n", key, call)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// done is the reconcile: did an effect with this idempotency key happen?
// (A payment API is asked the same about its key.)
func (se *sideEffect) done(key string) (bool, error) {
	f, err := os.Open(se.effects)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), key+" ") {
			return true, nil
		}
	}
	return false, sc.Err()
}

func (s *svc) handleSideEffectful(ctx context.Context, msg jetstream.Msg) {
	d, ok := s.receive(msg)
	if !ok {
		return
	}
	project, channel, turn, call, key := d.project, d.channel, d.turn, d.call, d.key
	payload, fail := d.payload, d.fail
	ack := func(what string) { d.ack(ctx, what) }
	ref := map[string]any{"project_id": project, "agent_turn_id": turn, "tool_call_id": call}

	// Step 3: the call as the ledger has it, on every delivery.
	res, err := s.request(ctx, "call.get", nil, ref, msg)
	if err != nil {
		fail("call.get", err)
		return
	}
	var rec struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(res, &rec); err != nil {
		fail("call.get", &refusal{"decode", err.Error()})
		return
	}
	switch rec.State {
	case "woken":
		ack("answered woken " + call)
		return
	case "claimed":
		if _, err := s.request(ctx, "report.resume", nil, ref, msg); err != nil {
			fail("report.resume", err)
			return
		}
		ack("answered claimed " + call)
		return
	}
	res, err = s.request(ctx, "cancel.get", nil, map[string]any{"project_id": project, "channel_id": channel, "agent_turn_id": turn, "tool_call_id": call}, msg)
	if err != nil {
		fail("cancel.get", err)
		return
	}
	var cancel struct {
		Canceled bool `json:"canceled"`
	}
	_ = json.Unmarshal(res, &cancel)
	res, err = s.request(ctx, "card.get", nil, map[string]any{"project_id": project, "card_ids": []string{payload.ToolCallCardID}}, msg)
	if err != nil {
		fail("card.get", err)
		return
	}
	var got struct {
		Cards []struct {
			Card struct {
				Metadata json.RawMessage `json:"metadata"`
			} `json:"card"`
		} `json:"cards"`
	}
	if err := json.Unmarshal(res, &got); err != nil || len(got.Cards) != 1 {
		fail("card.get", &refusal{"missing", fmt.Sprintf("card %s: %s (%v)", payload.ToolCallCardID, res, err)})
		return
	}
	sum := sha256.Sum256([]byte(project + "\x00" + turn + "\x00" + call))
	cardID := func(kind string) string { return kind + "-" + hex.EncodeToString(sum[:12]) }
	metadata := got.Cards[0].Card.Metadata
	finish := func(status, id string, content map[string]any, attemptOutcome string) {
		d.finish(ctx, status, id, content, metadata, attemptOutcome, func() { s.crashAt(msg, "card", call) })
	}
	paid := map[string]any{"status": "success", "result": map[string]any{"paid": true, "idempotency_key": key}}
	if cancel.Canceled {
		finish("canceled", cardID("res-canceled"), map[string]any{"status": "canceled",
			"error": map[string]any{"code": "canceled", "message": "canceled before it ran"}}, "")
		return
	}

	// Step 4: intent before effect.
	start := map[string]any{"project_id": project, "agent_turn_id": turn, "tool_call_id": call, "executor_id": s.se.executor}
	if payload.DeadlineUnixMS > 0 {
		start["deadline_unix_ms"] = payload.DeadlineUnixMS
	}
	for range maxReconcileRounds {
		res, err := s.request(ctx, "attempt.start", nil, start, msg)
		if err != nil {
			fail("attempt.start", err)
			return
		}
		var att struct {
			Started        bool   `json:"started"`
			Attempt        uint64 `json:"attempt"`
			IdempotencyKey string `json:"idempotency_key"`
			ExecutorID     string `json:"executor_id"`
		}
		if err := json.Unmarshal(res, &att); err != nil {
			fail("attempt.start", &refusal{"decode", err.Error()})
			return
		}
		if att.Started {
			say("attempt %d %s", att.Attempt, call)
			s.crashAt(msg, "attempt", call)
			if err := s.se.effect(key, call); err != nil {
				fail("effect", err)
				return
			}
			say("effect %s", call)
			s.crashAt(msg, "effect", call)
			finish("success", cardID("res"), paid, "")
			return
		}
		if !s.se.reconcile {
			say("outcome_unknown %s", call)
			m := fmt.Sprintf("attempt %d of this call started (by %s) and its outcome was lost: it may or may not have taken effect", att.Attempt, att.ExecutorID)
			finish("failed", cardID("res-unknown"), map[string]any{
				"status": "failed",
				"result": map[string]string{"error_code": "internal_error", "error_message": m},
				"error": map[string]any{"code": "internal_error", "message": m, "detail": map[string]any{
					"taxonomy_code": "S-TOOL-OUTCOME-UNKNOWN", "class": "terminal_error", "attempts": att.Attempt,
					"fix_hint": "check the payment upstream with idempotency key " + att.IdempotencyKey + " before calling again",
				}},
			}, "outcome_unknown")
			return
		}
		done, err := s.se.done(att.IdempotencyKey)
		if err != nil {
			fail("reconcile", err)
			return
		}
		if done {
			say("reconciled done %s", call)
			finish("success", cardID("res"), paid, "reconciled")
			return
		}
		say("reconciled not_done %s", call)
		start["not_done"] = att.Attempt
	}
	fail("attempt.start", fmt.Errorf("attempt still taken by others after %d reconcile rounds", maxReconcileRounds))
}
