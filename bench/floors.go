package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/replay"
	"github.com/cgledger/cgledger/stream"
)

// The floors of --rebuild: the work a rebuild and a replay do, from the
// same entries held in memory, so that the price of reading them (from
// the stream, from the export file) is what the ratio shows.

// memEntries reads the ledger stream, sequences 1 to last, into memory as
// the projector receives it (outside any timing), held encoded
// (heldEntries): the floors decode them as they go, inside their timing.
func memEntries(ctx context.Context, js jetstream.JetStream, last uint64) (*heldEntries, error) {
	s, err := js.Stream(ctx, stream.DefaultName)
	if err != nil {
		return nil, err
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return nil, err
	}
	defer it.Stop()
	entries := newHeldEntries(int(last))
	for uint64(entries.len()) < last {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return nil, err
		}
		meta, err := m.Metadata()
		if err != nil {
			return nil, err
		}
		entries.add(protocol.Entry{Seq: meta.Sequence.Stream, Subject: m.Subject(), Headers: m.Headers(), Data: m.Data(), Time: meta.Timestamp})
	}
	return entries, nil
}

// applyFloor is a rebuild's floor: the projector applying entries from
// memory into a fresh store in dir, with the projector's batch size and
// pipelined commits, then the store synced (as a rebuild ends). It
// returns the store, open, for its digest.
func applyFloor(entries *heldEntries, dir string) (*projector.Store, error) {
	store, err := projector.OpenStore(dir, projector.StoreOptions{})
	if err != nil {
		return nil, err
	}
	if err := applyHeld(store, entries, 0, entries.len()); err != nil {
		store.Close()
		return nil, err
	}
	if err := store.Sync(); err != nil {
		store.Close()
		return nil, err
	}
	return store, nil
}

// applyHeld applies entries from to to (exclusive) to store as the
// projector does (projector.EntryApplier: its batch size, pipelined
// commits), decoding them as it goes.
func applyHeld(store *projector.Store, entries *heldEntries, from, to int) error {
	x, err := projector.NewEntryApplier(store, projector.DefaultBatchSize)
	if err != nil {
		return err
	}
	if err := entries.each(from, to, func(batch []protocol.Entry) error { return x.Apply(batch...) }); err != nil {
		_ = x.Close()
		return err
	}
	return x.Close()
}

// replayFloor is a replay's floor: a fresh embedded server in dir (as a
// replay starts one) storing the entries raw (asynchronous publishes, at
// most rawInFlight awaiting their ack, as the import's window) while, on the other
// goroutine, the projector applies them from memory into a fresh store
// (applyFloor); then the views' digest, which a replay reports. It returns
// the digest.
func replayFloor(ctx context.Context, entries *heldEntries, dir string) (string, error) {
	store, err := replayFloorStore(ctx, entries, dir)
	if err != nil {
		return "", err
	}
	return digestOf(store)
}

// replayFloorStore is replayFloor up to the digest.
func replayFloorStore(ctx context.Context, entries *heldEntries, dir string) (*projector.Store, error) {
	srv, err := natsserver.Start(natsserver.Config{StoreDir: filepath.Join(dir, "jetstream"), ServerName: "cgledger-bench-floor"})
	if err != nil {
		return nil, err
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := nats.Connect("nats://" + srv.Addr().String())
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*rawInFlight))
	if err != nil {
		return nil, err
	}
	if err := stream.Provision(ctx, js, stream.Config{}); err != nil {
		return nil, err
	}
	var store *projector.Store
	var applyErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		store, applyErr = applyFloor(entries, filepath.Join(dir, "views"))
	}()
	pubErr := storeRaw(ctx, js, entries)
	wg.Wait()
	if pubErr != nil || applyErr != nil {
		if store != nil {
			store.Close()
		}
		if pubErr != nil {
			return nil, fmt.Errorf("store raw: %w", pubErr)
		}
		return nil, applyErr
	}
	return store, nil
}

// storeRaw publishes entries as the import stores them (subject, data,
// headers without JetStream's own Nats-*), pipelined, until every ack is in.
func storeRaw(ctx context.Context, js jetstream.JetStream, entries *heldEntries) error {
	var window []jetstream.PubAckFuture
	// settle waits for the oldest acks until at most keep await theirs.
	settle := func(keep int) error {
		for len(window) > keep {
			select {
			case <-window[0].Ok():
			case err := <-window[0].Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
			window = window[1:]
		}
		return nil
	}
	err := entries.each(0, entries.len(), func(batch []protocol.Entry) error {
		for _, e := range batch {
			m := &nats.Msg{Subject: e.Subject, Data: e.Data, Header: stream.ImportedHeaders(e.Headers)}
			ack, err := js.PublishMsgAsync(m)
			if err != nil {
				return fmt.Errorf("entry %d: %w", e.Seq, err)
			}
			window = append(window, ack)
			if err := settle(rawInFlight - 1); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return settle(0)
}

// rawInFlight is how many raw publishes await their ack at most, as the
// import's window.
const rawInFlight = 1024

// exportStream writes a full export of the ledger stream to path, what
// `cgledger export` writes and `cgledger replay` reads.
func exportStream(ctx context.Context, js jetstream.JetStream, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := stream.Export(ctx, js, stream.DefaultName, f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// replayOnce replays the export at file in a fresh workspace under dir, as
// `cgledger replay` does, and returns the views' digest.
func replayOnce(ctx context.Context, file, dir string) (string, error) {
	res, err := replay.Run(ctx, file, replay.Options{Dir: dir})
	if err != nil {
		return "", err
	}
	return res.Digest, nil
}

// digestOf returns store's view digest and closes it.
func digestOf(store *projector.Store) (string, error) {
	d, err := store.DigestNow()
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	return d.Digest, err
}
