package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// floorWorkload is the ledger's message floor (issue 30): the messages the
// ledger's connections and their peers send for one e2e external call, on
// raw JetStream and core NATS with nothing else (no JSON parsing, no
// validation, no Pebble, no memory of calls). Per call:
//
//   - dispatch: a core NATS request to a responder in this process, which
//     creates the call key in a KV bucket and appends the tool.call card
//     together, then appends the command, then replies;
//   - the tool service pulls the command (durable pull consumer), asks for
//     the tool.call card (request/reply; the responder makes a direct get
//     of the card's subject, as card.get does), then sends report.result
//     (request/reply; the responder appends the result card, then the
//     report, two sequential appends as the ledger does on one replica,
//     then the wakeup entry, then replies) and acks the command;
//   - the deadline keeper (a second durable consumer of the commands) gets
//     the command, hands it back with a delay (NakWithDelay) and acks it on
//     the same delivery's reply subject, as the ledger's keeper does for a
//     call its process reports;
//   - the worker waits for the wakeup (a core subscription to the wakeup
//     entries' subject, as a worker subscribes), then sends inbox.consume
//     (request/reply; the responder appends the consumed entry, replies);
//   - the projector, an ordered consumer (as projector/ reads: no acks),
//     receives every stored entry in batched pulls.
//
// Entries and the call record are copies of a real call's (headers and
// bodies, taken from the ledger's stream after one external call), with
// their subjects and ids made unique per call; requests and replies are the
// client's and the API's encodings of the same call. The ledger side (the
// responders, the keeper, the projector) has a connection of its own, so
// msgs counts what it sends, as the account counters do for the ledger.
type floorWorkload struct {
	ledger, worker, tool *nats.Conn
	js                   jetstream.JetStream // the ledger side's
	st                   jetstream.Stream
	kv                   jetstream.KeyValue
	stop                 []func()
	seq                  atomic.Int64

	waiters waiters

	t floorTemplates
}

// floorTemplates are the bytes of one real external call.
type floorTemplates struct {
	// id is the copied call's tool call id.
	id                                                  string
	card, command, resultCard, report, wakeup, consumed *nats.Msg
	record                                              []byte
	dispatchReq, cardGetReq, resultReq, consumeReq      *nats.Msg
	dispatchReply, resultReply, consumeReply            []byte
	cardGetReplyHead                                    []byte
}

// The floor's stream, bucket and subjects. The stream is configured as the
// ledger's is on one replica where that changes the server's work per
// message: file storage, direct gets, a duplicate window (the command
// carries a Nats-Msg-Id), per-message TTLs allowed.
const (
	floorStream     = "BENCH_FLOOR"
	floorBucket     = "BENCH_FLOOR_CALLS"
	floorAPI        = "floorapi."
	floorCmdFilter  = "floor.cmd.>"
	floorWakeFilter = "floor.wake.*"
	// floorKeeperDelay is the keeper's hand-back delay; the ack that
	// follows it at once (as the ledger's keeper acks a call its process
	// reported) makes it matter only for a lost ack.
	floorKeeperDelay = 100 * time.Millisecond
)

func newFloorWorkload(ctx context.Context, e *env, connect func(auth.Grant) (*nats.Conn, error)) (*floorWorkload, error) {
	f := &floorWorkload{}
	var err error
	if f.t, err = floorTemplatesOf(ctx, e); err != nil {
		return nil, fmt.Errorf("a real call to copy: %w", err)
	}
	for _, c := range []**nats.Conn{&f.ledger, &f.worker, &f.tool} {
		if *c, err = connect(auth.Grant{Role: auth.RoleLedger, Label: "bench floor"}); err != nil {
			f.close()
			return nil, err
		}
		f.stop = append(f.stop, (*c).Close)
	}
	if err := f.start(ctx); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

func (f *floorWorkload) close() {
	for i := len(f.stop) - 1; i >= 0; i-- {
		f.stop[i]()
	}
}

// sent is the number of messages the ledger side has sent the server.
func (f *floorWorkload) sent() uint64 { return f.ledger.Stats().OutMsgs }

func (f *floorWorkload) start(ctx context.Context) error {
	js, err := jetstream.New(f.ledger)
	if err != nil {
		return err
	}
	f.js = js
	if f.st, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: floorStream, Subjects: []string{"floor.>"}, Storage: jetstream.FileStorage,
		Duplicates: 2 * time.Minute, AllowDirect: true, AllowMsgTTL: true}); err != nil {
		return fmt.Errorf("floor stream: %w", err)
	}
	if f.kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: floorBucket, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("floor bucket: %w", err)
	}
	// The ledger side: the API responders, one goroutine per request as
	// the ledger's API server serves them concurrently.
	for op, h := range map[string]func(context.Context, *nats.Msg) error{
		"dispatch": f.dispatch, "card_get": f.cardGet, "report_result": f.reportResult, "consume": f.consume,
	} {
		sub, err := f.ledger.Subscribe(floorAPI+op, func(m *nats.Msg) {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := h(ctx, m); err != nil {
					_ = m.Respond([]byte(`{"ok":false}`))
				}
			}()
		})
		if err != nil {
			return err
		}
		f.stop = append(f.stop, func() { _ = sub.Unsubscribe() })
	}
	// The deadline keeper: every command once handed back, then acked.
	keeper, err := js.CreateOrUpdateConsumer(ctx, floorStream, jetstream.ConsumerConfig{Durable: "floor-keeper", FilterSubject: floorCmdFilter,
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: -1, MaxDeliver: -1, AckWait: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("floor keeper: %w", err)
	}
	kc, err := keeper.Consume(func(m jetstream.Msg) {
		if md, err := m.Metadata(); err == nil && md.NumDelivered == 1 {
			// The ledger's keeper hands a command back until its deadline
			// and acknowledges it, on the same delivery's reply subject,
			// once its process reports the call (ledger/keeperacks.go):
			// two messages and no second delivery.
			_ = m.NakWithDelay(floorKeeperDelay)
			_ = f.ledger.Publish(m.Reply(), []byte("+ACK"))
			return
		}
		_ = m.Ack()
	}, jetstream.PullMaxMessages(64))
	if err != nil {
		return fmt.Errorf("floor keeper: %w", err)
	}
	f.stop = append(f.stop, kc.Stop)
	// The projector: every entry, ordered, in batched pulls, no acks.
	proj, err := f.st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return fmt.Errorf("floor projector: %w", err)
	}
	it, err := proj.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return fmt.Errorf("floor projector: %w", err)
	}
	go func() {
		for {
			if _, err := it.Next(); errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
		}
	}()
	f.stop = append(f.stop, it.Stop)
	// The tool service: pull the commands, read the card, report.result, ack.
	tjs, err := jetstream.New(f.tool)
	if err != nil {
		return err
	}
	tool, err := tjs.CreateOrUpdateConsumer(ctx, floorStream, jetstream.ConsumerConfig{Durable: "floor-tool", FilterSubject: floorCmdFilter,
		AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return fmt.Errorf("floor tool consumer: %w", err)
	}
	tc, err := tool.Consume(func(m jetstream.Msg) { go f.serve(m) }, jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("floor tool consumer: %w", err)
	}
	f.stop = append(f.stop, tc.Stop)
	// The worker's wakeups.
	ws, err := f.worker.Subscribe(floorWakeFilter, func(m *nats.Msg) {
		f.waiters.wake(m.Header.Get(protocol.HeaderToolCallID))
	})
	if err != nil {
		return err
	}
	f.stop = append(f.stop, func() { _ = ws.Unsubscribe() })
	for _, c := range []*nats.Conn{f.ledger, f.worker, f.tool} {
		if err := c.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// call is one external call as a worker makes it: dispatch, wait for the
// wakeup, consume.
func (f *floorWorkload) call(ctx context.Context) error {
	id := "call-" + strconv.FormatInt(f.seq.Add(1), 10)
	woken := f.waiters.expect(id)
	defer f.waiters.forget(id)
	if err := f.request(ctx, f.worker, f.t.dispatchReq, id); err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	select {
	case <-woken:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := f.request(ctx, f.worker, f.t.consumeReq, id); err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	return nil
}

// serve is the tool service's handling of one command.
func (f *floorWorkload) serve(m jetstream.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := m.Headers().Get(protocol.HeaderToolCallID)
	if f.request(ctx, f.tool, f.t.cardGetReq, id) != nil || f.request(ctx, f.tool, f.t.resultReq, id) != nil {
		_ = m.Nak()
		return
	}
	_ = m.Ack()
}

// request sends a copy of tmpl for call id and waits for an ok reply.
func (f *floorWorkload) request(ctx context.Context, nc *nats.Conn, tmpl *nats.Msg, id string) error {
	resp, err := nc.RequestMsgWithContext(ctx, f.withID(tmpl, tmpl.Subject, id))
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(resp.Data, []byte(`{"ok":true`)) {
		return errors.New("refused")
	}
	return nil
}

// withID is a copy of tmpl on subject for call id: every header value that
// names the copied call (its CG-Tool-Call-Id, its Nats-Msg-Id, which the
// stream deduplicates on) names id instead; the data is shared.
func (f *floorWorkload) withID(tmpl *nats.Msg, subject, id string) *nats.Msg {
	h := make(nats.Header, len(tmpl.Header))
	for k, v := range tmpl.Header {
		if len(v) == 1 && strings.Contains(v[0], f.t.id) {
			v = []string{strings.Replace(v[0], f.t.id, id, 1)}
		}
		h[k] = v
	}
	return &nats.Msg{Subject: subject, Header: h, Data: tmpl.Data}
}

func (f *floorWorkload) dispatch(ctx context.Context, m *nats.Msg) error {
	id := m.Header.Get(protocol.HeaderToolCallID)
	card, err := f.js.PublishMsgAsync(f.withID(f.t.card, "floor.card."+id, id), jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithExpectStream(floorStream))
	if err != nil {
		return err
	}
	if _, err := f.kv.Create(ctx, id, f.t.record); err != nil {
		return err
	}
	select {
	case a := <-card.Ok():
		if err := stored(a, nil); err != nil {
			return err
		}
	case err := <-card.Err():
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := stored(f.js.PublishMsg(ctx, f.withID(f.t.command, "floor.cmd."+id, id), jetstream.WithExpectStream(floorStream))); err != nil {
		return err
	}
	return m.Respond(f.t.dispatchReply)
}

// stored refuses an append the stream took as a duplicate (a Nats-Msg-Id
// seen before): the floor must store every entry of every call.
func stored(a *jetstream.PubAck, err error) error {
	if err == nil && a.Duplicate {
		return errors.New("an entry was taken as a duplicate")
	}
	return err
}

func (f *floorWorkload) cardGet(ctx context.Context, m *nats.Msg) error {
	got, err := f.st.GetLastMsgForSubject(ctx, "floor.card."+m.Header.Get(protocol.HeaderToolCallID))
	if err != nil {
		return err
	}
	reply := make([]byte, 0, len(f.t.cardGetReplyHead)+len(got.Data)+64)
	reply = append(append(reply, f.t.cardGetReplyHead...), got.Data...)
	reply = append(strconv.AppendUint(append(reply, `,"seq":`...), got.Sequence, 10), `}],"missing":null}}`...)
	return m.Respond(reply)
}

func (f *floorWorkload) reportResult(ctx context.Context, m *nats.Msg) error {
	id := m.Header.Get(protocol.HeaderToolCallID)
	for _, e := range []struct {
		tmpl    *nats.Msg
		subject string
		first   bool
	}{{f.t.resultCard, "floor.card.r" + id, true}, {f.t.report, "floor.rep." + id, true}, {f.t.wakeup, "floor.wake." + id, false}} {
		opts := []jetstream.PublishOpt{jetstream.WithExpectStream(floorStream)}
		if e.first {
			opts = append(opts, jetstream.WithExpectLastSequencePerSubject(0))
		}
		if err := stored(f.js.PublishMsg(ctx, f.withID(e.tmpl, e.subject, id), opts...)); err != nil {
			return err
		}
	}
	return m.Respond(f.t.resultReply)
}

func (f *floorWorkload) consume(ctx context.Context, m *nats.Msg) error {
	id := m.Header.Get(protocol.HeaderToolCallID)
	if err := stored(f.js.PublishMsg(ctx, f.withID(f.t.consumed, "floor.consumed."+id, id), jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithExpectStream(floorStream))); err != nil {
		return err
	}
	return m.Respond(f.t.consumeReply)
}

// floorTemplatesOf makes one external call through the ledger and copies
// its stored entries and call record; the requests and replies are encoded
// as the client and the API encode them for that call.
func floorTemplatesOf(ctx context.Context, e *env) (floorTemplates, error) {
	var t floorTemplates
	if err := e.callTool(ctx, extTool); err != nil {
		return t, err
	}
	n := e.seq.Load()
	turn, id := "turn-"+strconv.FormatInt(n/100, 10), "call-"+strconv.FormatInt(n, 10)
	t.id = id
	st, err := e.js.Stream(ctx, stream.DefaultName)
	if err != nil {
		return t, err
	}
	last := st.CachedInfo().State.LastSeq
	byKind := map[protocol.EntryKind][]*nats.Msg{}
	for seq := last; seq > 0 && seq+40 > last; seq-- {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			return t, fmt.Errorf("read entry %d: %w", seq, err)
		}
		if m.Header.Get(protocol.HeaderToolCallID) != id && !bytes.Contains(m.Data, []byte(`"`+id+`"`)) {
			continue
		}
		k := protocol.EntryKind(m.Header.Get(protocol.HeaderEntryKind))
		byKind[k] = append([]*nats.Msg{{Header: storedHeaders(m.Header), Data: m.Data}}, byKind[k]...)
	}
	one := func(k protocol.EntryKind, i int) (*nats.Msg, error) {
		if len(byKind[k]) <= i {
			return nil, fmt.Errorf("call %s: no %s entry #%d among the stream's last 40", id, k, i+1)
		}
		return byKind[k][i], nil
	}
	for _, p := range []struct {
		to *(*nats.Msg)
		k  protocol.EntryKind
		i  int
	}{{&t.card, protocol.KindCard, 0}, {&t.command, protocol.KindCommand, 0}, {&t.resultCard, protocol.KindCard, 1},
		{&t.report, protocol.KindReport, 0}, {&t.wakeup, protocol.KindWakeup, 0}, {&t.consumed, protocol.KindConsumed, 0}} {
		if *p.to, err = one(p.k, p.i); err != nil {
			return t, err
		}
	}
	kst, err := e.js.Stream(ctx, "KV_"+stream.DefaultBucket)
	if err != nil {
		return t, err
	}
	for seq := kst.CachedInfo().State.LastSeq; seq > 0 && len(t.record) == 0; seq-- {
		rec, err := kst.GetMsg(ctx, seq)
		if err != nil {
			return t, fmt.Errorf("a call record: %w", err)
		}
		t.record = rec.Data
	}
	if len(t.record) == 0 {
		return t, errors.New("no call record in the bucket")
	}

	// The requests, as client.Client encodes them.
	ident := protocol.Identity{AgentID: "agent", AgentTurnID: turn, TurnEpoch: 1, ToolCallID: id}
	var call protocol.Card
	if err := json.Unmarshal(t.card.Data, &call); err != nil {
		return t, fmt.Errorf("the tool.call card: %w", err)
	}
	sub := protocol.ToolCommandSubject(protocol.DefaultVersion, "bench", "main", extTool)
	dispatch, err := json.Marshal(protocol.DispatchBody{Subject: sub, Card: t.card.Data, Payload: t.command.Data})
	if err != nil {
		return t, err
	}
	t.dispatchReq = &nats.Msg{Subject: floorAPI + "dispatch", Header: ident.Header(), Data: dispatch}
	cardGet, err := json.Marshal(map[string]any{"project_id": "bench", "card_ids": []string{call.CardID}})
	if err != nil {
		return t, err
	}
	// The card.get and consume requests carry no identity headers; the
	// floor's responders find the call by this one alone.
	byID := nats.Header{protocol.HeaderToolCallID: []string{id}}
	t.cardGetReq = &nats.Msg{Subject: floorAPI + "card_get", Header: byID, Data: cardGet}
	card, rep := resultOf(extTool, "bench", "main", ident, call)
	result, err := json.Marshal(protocol.ReportResultBody{Card: card, Report: rep.Payload})
	if err != nil {
		return t, err
	}
	h := ident.Header()
	h.Set(protocol.HeaderProjectID, rep.ProjectID)
	h.Set(protocol.HeaderChannelID, rep.ChannelID)
	h.Set(protocol.HeaderSourceID, rep.SourceID)
	h.Set(protocol.HeaderSourceFunction, rep.SourceFunction)
	t.resultReq = &nats.Msg{Subject: floorAPI + "report_result", Header: h, Data: result}
	consume, err := json.Marshal(protocol.ConsumeRequest{ProjectID: "bench", AgentID: "agent", AgentTurnID: turn, ToolCallID: id})
	if err != nil {
		return t, err
	}
	t.consumeReq = &nats.Msg{Subject: floorAPI + "consume", Header: byID, Data: consume}

	// The replies, as the API encodes them (sequences of the size a
	// running ledger's have).
	const seq = 1_234_567
	reply := func(v any) ([]byte, error) {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		return json.Marshal(protocol.APIReply{OK: true, Result: b})
	}
	if t.dispatchReply, err = reply(protocol.DispatchResult{Subject: sub, ToolCallCardID: call.CardID, CardSeq: seq, CommandSeq: seq + 1,
		ToolDefSeq: seq, ToolVersion: "1", DeadlineUnixMS: time.Now().UnixMilli()}); err != nil {
		return t, err
	}
	out := protocol.ReportResultOutcome{CardSeq: seq + 2, ReportOutcome: protocol.ReportOutcome{Seq: seq + 3, AgentTurnID: turn, ToolCallID: id,
		ToolResultCardID: card.CardID, Status: protocol.StatusSuccess, AfterExecution: protocol.AfterSuspend, EffectiveAfterExecution: protocol.AfterSuspend,
		Wakeup: protocol.WakeupOutcome{Subject: protocol.WakeupSubject(protocol.DefaultVersion, "bench", "main", "bench-worker"), WorkerTarget: "bench-worker", Seq: seq + 4}}}
	if t.resultReply, err = reply(out); err != nil {
		return t, err
	}
	if t.consumeReply, err = reply(protocol.ConsumeResult{Seq: seq + 5, ReportSeq: seq + 3}); err != nil {
		return t, err
	}
	t.cardGetReplyHead = []byte(`{"ok":true,"result":{"cards":[{"time":"` + time.Now().UTC().Format(time.RFC3339Nano) + `","card":`)
	return t, nil
}

// storedHeaders is h as the entry was stored: without the headers a read
// adds (its stream, sequence, subject and time), and with the command's
// check that its tool is not paused made on the floor's stream.
func storedHeaders(h nats.Header) nats.Header {
	out := nats.Header{}
	for k, v := range h {
		switch k {
		case "Nats-Stream", "Nats-Sequence", "Nats-Subject", "Nats-Time-Stamp":
			continue
		case "Nats-Expected-Last-Subject-Sequence-Subject":
			v = []string{"floor.pause"}
		}
		out[k] = v
	}
	return out
}
