package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// maxCardIDs bounds one GetCards call.
const maxCardIDs = protocol.MaxCardIDs

// PutCard validates and stores a card. Cards are immutable: putting an
// identical card again returns the original (Duplicate), a different card
// under an existing id is a conflict. The card is readable by id as soon as
// PutCard returns.
func (l *Ledger) PutCard(ctx context.Context, card protocol.Card) (protocol.PutCardResult, error) {
	return l.putCardTyped(ctx, callerOf(ctx), card)
}

// putCardTyped is PutCard for by (nil: the ledger's own card).
func (l *Ledger) putCardTyped(ctx context.Context, by *protocol.Caller, card protocol.Card) (protocol.PutCardResult, error) {
	data, err := json.Marshal(card)
	if err != nil {
		return protocol.PutCardResult{}, fmt.Errorf("put card: encode: %w", err)
	}
	return l.putCardJSON(ctx, by, data)
}

// putCardJSON is PutCard for a card given as JSON, as received over the API.
func (l *Ledger) putCardJSON(ctx context.Context, by *protocol.Caller, data []byte) (protocol.PutCardResult, error) {
	r, vs := protocol.ParseCardPut(data)
	if err := protocol.BadRequest("card", vs); err != nil {
		e, _ := protocol.AsError(err)
		return protocol.PutCardResult{}, l.reject(ctx, by, protocol.OpCardPut, r.ProjectID, protocol.Unrouted, e, protocol.NewRejectedRequest("", nil, data))
	}
	c, stored := r.Card, r.Stored
	return l.putCard(ctx, by, protocol.OpCardPut, c, stored, "", func() protocol.RejectedRequest { return protocol.NewRejectedRequest("", nil, data) })
}

// putCard stores a validated card. channel, when known, routes a rejection.
// stored is the card's JSON encoding when the caller has it already
// (protocol.DecodeCardStored), else nil: the card is encoded here.
func (l *Ledger) putCard(ctx context.Context, by *protocol.Caller, op string, c *protocol.Card, stored []byte, channel string, req func() protocol.RejectedRequest) (protocol.PutCardResult, error) {
	data := stored
	if data == nil {
		var err error
		if data, err = json.Marshal(c); err != nil {
			return protocol.PutCardResult{}, fmt.Errorf("put card %s: encode: %w", c.CardID, err)
		}
	}
	if len(data) > int(l.streams.MaxMsgSize)-4096 {
		var vs protocol.Violations
		vs.Add("card", protocol.VTooLarge, "card is %d bytes; the limit is %d", len(data), int(l.streams.MaxMsgSize)-4096)
		return protocol.PutCardResult{}, l.reject(ctx, by, op, c.ProjectID, channel, protocol.NewError(protocol.CodeBadRequest, vs, "card %s is too large", c.CardID), req())
	}
	msg := &nats.Msg{Subject: protocol.CardSubject(l.version, c.ProjectID, c.CardID), Data: data, Header: nats.Header{}}
	msg.Header.Set(protocol.HeaderProjectID, c.ProjectID)
	msg.Header.Set(protocol.HeaderAgentTurnID, c.AgentTurnID)
	msg.Header.Set(protocol.HeaderToolCallID, c.ToolCallID)
	ack, err := l.appendEntry(ctx, by, protocol.KindCard, msg, jetstream.WithExpectLastSequencePerSubject(0))
	switch {
	case err == nil:
		l.cache.cards.put(msg.Subject, &protocol.StoredCard{Card: *c, Seq: ack.Sequence})
		return protocol.PutCardResult{CardID: c.CardID, Seq: ack.Sequence}, nil
	case isWrongLastSeq(err):
		existing, gerr := l.storedEntry(ctx, msg.Subject)
		if gerr != nil {
			return protocol.PutCardResult{}, fmt.Errorf("put card %s: exists but cannot be read: %w", c.CardID, gerr)
		}
		if _, ok := decodeCardEntry(existing, c.ProjectID, c.CardID); !ok {
			// Not the ledger's: compare with the first message instead.
			first, ferr := l.firstForSubject(ctx, msg.Subject)
			if ferr != nil {
				return protocol.PutCardResult{}, fmt.Errorf("put card %s: exists but cannot be read: %w", c.CardID, ferr)
			}
			if first != nil {
				existing = first
			}
		}
		if _, ok := decodeCardEntry(existing, c.ProjectID, c.CardID); !ok {
			var vs protocol.Violations
			vs.Add("card.card_id", protocol.VConflict, "the subject of card %s holds a message that is not a card entry (ledger seq %d); choose another card_id", c.CardID, existing.Sequence)
			return protocol.PutCardResult{}, l.reject(ctx, by, op, c.ProjectID, channel, protocol.NewError(protocol.CodeConflict, vs, "card id %s is taken by a foreign message", c.CardID), req())
		}
		if bytes.Equal(existing.Data, data) {
			return protocol.PutCardResult{CardID: c.CardID, Seq: existing.Sequence, Duplicate: true}, nil
		}
		var vs protocol.Violations
		vs.Add("card.card_id", protocol.VConflict, "card %s already exists at ledger seq %d with different content; cards are immutable", c.CardID, existing.Sequence)
		return protocol.PutCardResult{}, l.reject(ctx, by, op, c.ProjectID, channel, protocol.NewError(protocol.CodeConflict, vs, "card %s already exists with different content", c.CardID), req())
	case isTooLarge(err):
		var vs protocol.Violations
		vs.Add("card", protocol.VTooLarge, "card exceeds the stream's maximum message size (%d bytes)", l.streams.MaxMsgSize)
		return protocol.PutCardResult{}, l.reject(ctx, by, op, c.ProjectID, channel, protocol.NewError(protocol.CodeBadRequest, vs, "card %s is too large", c.CardID), req())
	default:
		return protocol.PutCardResult{}, fmt.Errorf("put card %s: %w", c.CardID, err)
	}
}

// GetCard returns one card by id, or an error matching ErrUnknownCard.
func (l *Ledger) GetCard(ctx context.Context, project, cardID string) (*protocol.StoredCard, error) {
	var vs protocol.Violations
	protocol.CheckIdent(&vs, "project_id", project, true)
	protocol.CheckIdent(&vs, "card_id", cardID, true)
	if err := protocol.BadRequest("card lookup", vs); err != nil {
		return nil, err
	}
	subject := protocol.CardSubject(l.version, project, cardID)
	// The newest message is the cheap read and, normally, the only one.
	msg, err := l.lastForSubject(ctx, subject)
	if err != nil {
		return nil, fmt.Errorf("get card %s: %w", cardID, err)
	}
	if msg == nil {
		return nil, protocol.NewError(protocol.CodeUnknownCard, nil, "card %s not found in project %s", cardID, project)
	}
	sc, ok := decodeCardEntry(msg, project, cardID)
	if !ok {
		// Someone else published on the subject; the ledger's card, if
		// any, is the first message there.
		if msg, err = l.firstForSubject(ctx, subject); err != nil {
			return nil, fmt.Errorf("get card %s: %w", cardID, err)
		}
		if msg != nil {
			sc, ok = decodeCardEntry(msg, project, cardID)
		}
	}
	if !ok {
		// Whatever it is, it is not a card: the id does not name one.
		l.log.Warn("card subject holds a message that is not a card entry", "project", project, "card_id", cardID, "seq", msg.Sequence)
		return nil, protocol.NewError(protocol.CodeUnknownCard, nil, "card %s not found in project %s (its subject holds a message that is not a card entry)", cardID, project)
	}
	c := *sc
	l.cache.cards.put(subject, &c)
	return sc, nil
}

// firstForSubject reads the oldest entry on an exact subject, or (nil, nil)
// when there is none. The ledger writes a card only to an empty subject, so
// the first message is the only one on it the ledger can have written;
// anything after it was published by someone else and must not hide it.
func (l *Ledger) firstForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	msg, err := l.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	return msg, nil
}

// decodeCardEntry returns the card stored in msg, or ok=false when msg is not
// a card entry for (project, cardID): a client allowed to publish on cg.>
// can put anything on a card subject, and an empty or foreign object must
// not be served as a card.
func decodeCardEntry(msg *jetstream.RawStreamMsg, project, cardID string) (*protocol.StoredCard, bool) {
	if protocol.HeaderGet(msg.Header, protocol.HeaderEntryKind) != string(protocol.KindCard) {
		return nil, false
	}
	sc := &protocol.StoredCard{Seq: msg.Sequence, Time: msg.Time.UTC()}
	if err := json.Unmarshal(msg.Data, &sc.Card); err != nil {
		return nil, false
	}
	c := &sc.Card
	if c.CardID != cardID || c.ProjectID != project || (c.Type != protocol.CardToolCall && c.Type != protocol.CardToolResult) ||
		len(c.Content) == 0 || c.Content[0] != '{' {
		return nil, false
	}
	return sc, true
}

// GetCards returns the cards with the given ids in request order, and the ids
// that do not exist. Lookups run concurrently.
func (l *Ledger) GetCards(ctx context.Context, project string, ids []string) ([]protocol.StoredCard, []string, error) {
	var vs protocol.Violations
	protocol.CheckIdent(&vs, "project_id", project, true)
	if len(ids) == 0 {
		vs.Add("card_ids", protocol.VRequired, "at least one card id is required")
	}
	if len(ids) > maxCardIDs {
		vs.Add("card_ids", protocol.VTooLarge, "at most %d card ids per request, got %d", maxCardIDs, len(ids))
	}
	for i, id := range ids {
		protocol.CheckIdent(&vs, fmt.Sprintf("card_ids[%d]", i), id, true)
	}
	if err := protocol.BadRequest("card lookup", vs); err != nil {
		return nil, nil, err
	}
	type res struct {
		card *protocol.StoredCard
		err  error
	}
	out := make([]res, len(ids))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i].card, out[i].err = l.GetCard(ctx, project, id)
		}()
	}
	wg.Wait()
	var cards []protocol.StoredCard
	var missing []string
	for i, r := range out {
		switch {
		case r.err == nil:
			cards = append(cards, *r.card)
		case isCode(r.err, protocol.CodeUnknownCard):
			missing = append(missing, ids[i])
		default:
			return nil, nil, r.err
		}
	}
	return cards, missing, nil
}

func isCode(err error, code protocol.Code) bool {
	e, ok := protocol.AsError(err)
	return ok && e.Code == code
}
