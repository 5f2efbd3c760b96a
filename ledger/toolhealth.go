package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// ToolHealthTTL is how old the consumer snapshot a dispatch of a tool with
// health.fail_fast_after_ms judges by may be before it is refreshed (in the
// background: the dispatch does not wait for it). So a tool service that
// starts pulling is seen within about this long, plus one listing of the
// stream's consumers.
const ToolHealthTTL = time.Second

// toolHealthSyncAfter is how old a snapshot may be before a dispatch waits
// for a fresh one rather than judging by it.
const toolHealthSyncAfter = 30 * time.Second

// toolHealth is what the ledger knows of who pulls tool commands: a
// snapshot of the stream's consumers, taken at most every ToolHealthTTL
// and only for tools that ask (health.fail_fast_after_ms). The zero value
// is ready to use.
type toolHealth struct {
	mu         sync.Mutex
	taken      time.Time
	consumers  []consumerActivity
	refreshing bool
	// waiting remembers, per consumer, the last snapshot that saw a pull
	// request waiting: a busy service has none waiting while it works.
	waiting map[string]time.Time
	// registered is the time of each tool definition entry (by sequence):
	// the start of the wait when nothing ever pulled.
	registered map[uint64]time.Time
}

type consumerActivity struct {
	name    string
	filters []string
	// pulling: a pull request was waiting when the snapshot was taken (a
	// service is pulling now, however short fail_fast_after_ms).
	pulling  bool
	lastPull time.Time
}

// toolUnavailable reports whether no consumer of subject (a tool command
// subject) is pulled: none had a pull request waiting at the last snapshot,
// and none was seen with one, delivered a command or was created, nor was
// the definition (entry defSeq) registered, within failFast.
func (l *Ledger) toolUnavailable(ctx context.Context, subject string, defSeq uint64, failFast time.Duration) (bool, error) {
	h := &l.health
	h.mu.Lock()
	stale := time.Since(h.taken)
	reg, haveReg := h.registered[defSeq]
	h.mu.Unlock()
	if stale > toolHealthSyncAfter {
		if err := l.refreshToolHealth(ctx); err != nil {
			return false, err
		}
	} else if stale > ToolHealthTTL {
		l.refreshToolHealthAsync()
	}
	if !haveReg {
		m, err := l.stream.GetMsg(ctx, defSeq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			// Expired: registered longer ago than any retention, which
			// gives no grace.
		case err != nil:
			return false, fmt.Errorf("tool health: read definition entry %d: %w", defSeq, err)
		default:
			reg = m.Time
			if t, ok := protocol.EntryTime(m.Header); ok {
				reg = t
			}
		}
		h.mu.Lock()
		if h.registered == nil {
			h.registered = map[uint64]time.Time{}
		}
		h.registered[defSeq] = reg
		h.mu.Unlock()
	}
	last := reg
	h.mu.Lock()
	for _, c := range h.consumers {
		if !protocol.ServesTool(c.filters, subject) {
			continue
		}
		if c.pulling {
			h.mu.Unlock()
			return false, nil
		}
		if c.lastPull.After(last) {
			last = c.lastPull
		}
	}
	h.mu.Unlock()
	return time.Since(last) > failFast, nil
}

func (l *Ledger) refreshToolHealthAsync() {
	h := &l.health
	h.mu.Lock()
	if h.refreshing {
		h.mu.Unlock()
		return
	}
	h.refreshing = true
	h.mu.Unlock()
	l.bg.start()
	go func() {
		defer l.bg.done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.refreshToolHealth(ctx); err != nil {
			l.log.Warn("tool health: list consumers", "err", err)
		}
		h.mu.Lock()
		h.refreshing = false
		h.mu.Unlock()
	}()
}

// refreshToolHealth lists the stream's consumers: one request per page.
func (l *Ledger) refreshToolHealth(ctx context.Context) error {
	now := time.Now()
	lister := l.stream.ListConsumers(ctx)
	var acts []consumerActivity
	seenWaiting := map[string]bool{}
	for ci := range lister.Info() {
		a := consumerActivity{name: ci.Name, filters: ci.Config.FilterSubjects, lastPull: ci.Created}
		if ci.Config.FilterSubject != "" {
			a.filters = append(a.filters, ci.Config.FilterSubject)
		}
		if ci.Delivered.Last != nil && ci.Delivered.Last.After(a.lastPull) {
			a.lastPull = *ci.Delivered.Last
		}
		if ci.NumWaiting > 0 || ci.PushBound {
			seenWaiting[ci.Name] = true
			a.pulling = true
		}
		acts = append(acts, a)
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("list consumers: %w", err)
	}
	h := &l.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiting == nil {
		h.waiting = map[string]time.Time{}
	}
	for name := range seenWaiting {
		h.waiting[name] = now
	}
	live := make(map[string]time.Time, len(acts))
	for i := range acts {
		if t, ok := h.waiting[acts[i].name]; ok {
			live[acts[i].name] = t
			if t.After(acts[i].lastPull) {
				acts[i].lastPull = t
			}
		}
	}
	h.waiting = live
	h.consumers, h.taken = acts, now
	return nil
}

// answerUnavailable records a call's outcome as failed with
// S-TOOL-UNAVAILABLE through the ordinary report path, as the ledger
// itself: a result card by protocol.LedgerSourceID, a report, a wakeup.
func (l *Ledger) answerUnavailable(ctx context.Context, rec *protocol.CallRecord, failFast time.Duration) error {
	// Not as the dispatching caller: the report is the ledger's own, which
	// no caller check applies to.
	msg := fmt.Sprintf("no tool service pulled the commands of tool %s for %d ms (its health.fail_fast_after_ms)", rec.ToolName, failFast.Milliseconds())
	content, err := json.Marshal(map[string]any{
		"status": protocol.StatusFailed,
		"result": map[string]any{"error_code": protocol.ErrorCodeUpstreamUnavailable, "error_message": msg},
		"error": map[string]any{"code": protocol.ErrorCodeUpstreamUnavailable, "message": msg, "detail": map[string]any{
			"taxonomy_code": protocol.CodeToolUnavailable, "class": "retryable_error", "attempts": 0,
			"fix_hint": "start a tool service (or executor) for the tool, then dispatch the call again",
		}},
	})
	if err != nil {
		return fmt.Errorf("tool unavailable: encode result: %w", err)
	}
	sum := sha256.Sum256([]byte(rec.ProjectID + "\x00" + rec.AgentTurnID + "\x00" + rec.ToolCallID))
	card := protocol.Card{
		CardID: "unavail-" + hex.EncodeToString(sum[:16]), ProjectID: rec.ProjectID, Type: protocol.CardToolResult,
		AuthorID: protocol.LedgerSourceID, FunctionName: rec.ToolName, AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID,
		Content: content, Metadata: rec.CardMetadata,
	}
	if _, err := l.putCardTyped(ctx, nil, card); err != nil {
		return fmt.Errorf("tool unavailable: result card: %w", err)
	}
	id := protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, StepID: rec.StepID}
	_, err = l.reportTyped(ctx, nil, protocol.ReportRequest{
		ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, Identity: id, SourceID: protocol.LedgerSourceID, SourceFunction: rec.ToolName,
		Payload: protocol.ReportPayload{Status: protocol.StatusFailed, AfterExecution: rec.AfterExecution, ToolResultCardID: card.CardID, StepID: rec.StepID},
	})
	if e, refused := protocol.AsError(err); refused && e.Code == protocol.CodeConflict {
		// Answered otherwise meanwhile (a tool service did report): that
		// outcome stands.
		l.log.Info("tool unavailable: the call has another outcome", "call", rec.ToolCallID, "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("tool unavailable: report: %w", err)
	}
	l.m.toolUnavailable.WithLabelValues(l.callToolLabel(rec)).Inc()
	return nil
}
