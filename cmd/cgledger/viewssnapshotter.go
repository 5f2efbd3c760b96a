package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/snapshot"
)

// snapshotTmpDir, under the data directory, is where a snapshot's
// checkpoint is made: on the views' file system, so Pebble hard-links the
// store's files instead of copying them. A kill leaves it behind; the next
// start removes it.
const snapshotTmpDir = "snapshots.tmp"

// snapshotRefusedRetry is how soon a scheduled snapshot that was refused
// (the views catching up, the disk short) is tried again.
const snapshotRefusedRetry = time.Minute

// errSnapshotRefused marks a snapshot not started: the views are not caught
// up, or the disk is short. Nothing was written.
var errSnapshotRefused = errors.New("snapshot refused")

// viewsSnapshotter takes snapshots of the views on views_snapshot_every's
// schedule and for views.snapshot (docs/views.md#snapshots), one at a time,
// pruning to views_snapshot_keep after each. A failure is logged and
// counted; serve goes on.
type viewsSnapshotter struct {
	st    *serveState
	every time.Duration
	// busy holds the one snapshot in progress.
	busy chan struct{}

	mu     sync.Mutex
	target snapshot.Target

	total    *prometheus.CounterVec
	lastSeq  prometheus.Gauge
	lastSize prometheus.Gauge
	duration prometheus.Histogram

	// ctx ends at the shutdown's first step (serveState.stopSnapshots):
	// a snapshot in progress, scheduled or asked for, is abandoned rather
	// than holding the shutdown.
	ctx  context.Context
	stop context.CancelFunc
	done chan struct{}
}

// Start registers the metrics, removes what a killed snapshot left, makes
// the snapshot function views.snapshot calls, and starts the schedule.
func (c *viewsSnapshotter) Start(context.Context) error {
	st := c.st
	c.every, _ = parseSnapshotEvery(st.s.ViewsSnapshotEvery) // validated
	c.busy = make(chan struct{}, 1)
	c.total = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cgledger_views_snapshots_total",
		Help: "Snapshots of the views this process tried, by result: ok, failed (logged with why), refused (not started: the views catching up or stopped, or free disk space below the reserve).",
	}, []string{"result"})
	for _, r := range []string{"ok", "failed", "refused"} {
		c.total.WithLabelValues(r)
	}
	c.lastSeq = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cgledger_views_snapshot_last_seq",
		Help: "Checkpoint sequence of the last snapshot of the views this process took (0 before the first).",
	})
	c.lastSize = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cgledger_views_snapshot_last_size_bytes",
		Help: "Size of the last snapshot of the views this process took (0 before the first).",
	})
	c.duration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "cgledger_views_snapshot_duration_seconds",
		Help:    "Time to take, store and prune one snapshot of the views that succeeded.",
		Buckets: prometheus.ExponentialBuckets(0.1, 2.5, 10),
	})
	st.reg.MustRegister(c.total, c.lastSeq, c.lastSize, c.duration)
	if err := os.RemoveAll(filepath.Join(st.s.Data, snapshotTmpDir)); err != nil {
		return fmt.Errorf("remove the checkpoint of a snapshot that did not finish: %w", err)
	}
	st.snapshotNow = func(ctx context.Context) (protocol.ViewsSnapshotResult, error) { return c.take(ctx, "asked") }
	st.snapshotList = c.list
	c.ctx, c.stop = context.WithCancel(st.life)
	c.done = make(chan struct{})
	st.stopSnapshots = c.stop
	go func() {
		defer close(c.done)
		if c.every > 0 {
			c.schedule(c.ctx)
		}
	}()
	return nil
}

// Stop ends the schedule, abandoning a snapshot in progress, and waits
// until none runs: the views close after it.
func (c *viewsSnapshotter) Stop(context.Context) error {
	c.stop()
	<-c.done
	c.busy <- struct{}{} // a snapshot views.snapshot asked for
	return nil
}

// schedule takes a snapshot every c.every, skipping one when the newest in
// the target is younger than that (another replica sharing the bucket took
// it), and trying a refused one again a minute later.
func (c *viewsSnapshotter) schedule(ctx context.Context) {
	t := time.NewTimer(c.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if age, ok := c.newestAge(ctx); ok && age < c.every {
			t.Reset(c.every - age)
			continue
		}
		_, err := c.take(ctx, "scheduled")
		next := c.every
		if errors.Is(err, errSnapshotRefused) {
			next = min(c.every, snapshotRefusedRetry)
		}
		t.Reset(next)
	}
}

// newestAge is the age of the newest snapshot in the target; false when
// there is none or the target cannot be read (take then tells).
func (c *viewsSnapshotter) newestAge(ctx context.Context) (time.Duration, bool) {
	t, err := c.openTarget(ctx)
	if err != nil {
		return 0, false
	}
	list, err := t.List(ctx)
	if err != nil || len(list) == 0 {
		return 0, false
	}
	now := time.Now()
	var newest time.Time
	for _, m := range list {
		// A snapshot dated ahead of this clock by more than a skew (a
		// replica's wrong clock, a planted manifest) says nothing of when
		// the last one was taken: trusted, it would put every turn off.
		if m.Created.After(now.Add(snapshotClockSkew)) {
			continue
		}
		if m.Created.After(newest) {
			newest = m.Created
		}
	}
	if newest.IsZero() {
		return 0, false
	}
	return max(now.Sub(newest), 0), true
}

// snapshotClockSkew is how far ahead of this clock a snapshot's creation
// time may be and still count for the schedule.
const snapshotClockSkew = time.Minute

// openTarget opens the target once (creating the Object Store bucket).
func (c *viewsSnapshotter) openTarget(ctx context.Context) (snapshot.Target, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.target != nil {
		return c.target, nil
	}
	t, err := c.st.snapshotTarget(ctx, true)
	if err != nil {
		return nil, err
	}
	c.target = t
	return t, nil
}

// refusal says why no snapshot may start now, or "".
func (c *viewsSnapshotter) refusal() string {
	st := c.st
	switch {
	case !st.ready0.Load():
		return "the views are still catching up with the ledger"
	case st.storeBroken.Load():
		return "the view store failed a write"
	}
	if st.guard != nil {
		// Before the projector's state: a short disk stops it too.
		if err := st.guard.Check(); err != nil {
			return fmt.Sprintf("free disk space is short: %v", err)
		}
	}
	if reason, _ := st.projErr.Load().(string); reason != "" {
		return "the projector is stopped: " + reason
	}
	return ""
}

// take takes one snapshot, stores it, prunes the older ones and answers
// its manifest; why ("scheduled", "asked") is logged.
func (c *viewsSnapshotter) take(asked context.Context, why string) (protocol.ViewsSnapshotResult, error) {
	log := c.st.log
	ctx, cancel := context.WithCancel(asked)
	defer cancel()
	defer context.AfterFunc(c.ctx, cancel)()
	select {
	case c.busy <- struct{}{}:
		defer func() { <-c.busy }()
	case <-ctx.Done():
		return protocol.ViewsSnapshotResult{}, c.interrupted(asked, fmt.Errorf("waiting for the snapshot in progress: %w", ctx.Err()))
	}
	if reason := c.refusal(); reason != "" {
		c.total.WithLabelValues("refused").Inc()
		log.Warn("views snapshot not started", "why", why, "reason", reason)
		return protocol.ViewsSnapshotResult{}, fmt.Errorf("%w: %s", errSnapshotRefused, reason)
	}
	log.Info("views snapshot: taking", "why", why)
	start := time.Now()
	res, err := c.takeStored(ctx)
	if err != nil {
		err = c.interrupted(asked, err)
		c.total.WithLabelValues("failed").Inc()
		log.Error("views snapshot failed", "why", why, "err", err, "duration", time.Since(start).Round(time.Millisecond))
		return res, err
	}
	took := time.Since(start)
	res.DurationMS = took.Milliseconds()
	c.total.WithLabelValues("ok").Inc()
	c.lastSeq.Set(float64(res.AppliedSeq))
	c.lastSize.Set(float64(res.Size))
	c.duration.Observe(took.Seconds())
	log.Info("views snapshot taken", "why", why, "snapshot", res.Name, "applied_seq", res.AppliedSeq, "size", res.Size,
		"duration", took.Round(time.Millisecond), "target", res.Target, "pruned", res.Pruned)
	return res, nil
}

// interrupted says why a snapshot asked with the context asked was cut
// short, when it was, rather than leave the asker a bare "context
// canceled" (docs/protocol.md#viewssnapshot: the message says why no
// snapshot could be taken). The snapshotter stops at the shutdown's first
// step, and views.snapshot's API server with serve's life: a request's
// context is canceled, rather than past its deadline, only by that.
func (c *viewsSnapshotter) interrupted(asked context.Context, err error) error {
	switch {
	case c.ctx.Err() != nil || errors.Is(asked.Err(), context.Canceled):
		return fmt.Errorf("serve shut down while taking the snapshot (ask again once a serve runs): %w", err)
	case errors.Is(asked.Err(), context.DeadlineExceeded):
		return fmt.Errorf("the snapshot took longer than the request's time: %w", err)
	}
	return err
}

// takeStored makes the checkpoint under the data directory, stores it in
// the target and prunes.
func (c *viewsSnapshotter) takeStored(ctx context.Context) (protocol.ViewsSnapshotResult, error) {
	st := c.st
	target, err := c.openTarget(ctx)
	if err != nil {
		return protocol.ViewsSnapshotResult{}, fmt.Errorf("open the snapshot target: %w", err)
	}
	root := filepath.Join(st.s.Data, snapshotTmpDir)
	if err := os.MkdirAll(root, 0o750); err != nil {
		return protocol.ViewsSnapshotResult{}, fmt.Errorf("snapshot checkpoint directory: %w", err)
	}
	tmp, err := os.MkdirTemp(root, "take-")
	if err != nil {
		return protocol.ViewsSnapshotResult{}, fmt.Errorf("snapshot checkpoint directory: %w", err)
	}
	defer func() {
		_ = os.RemoveAll(tmp)
		// Removed only when empty: no other snapshot is being taken.
		_ = os.Remove(root)
	}()
	host, _ := os.Hostname()
	m, err := snapshot.Take(ctx, st.store, target, snapshot.TakeOptions{Stream: st.l.StreamName(), Host: host, TempDir: tmp})
	if err != nil {
		return protocol.ViewsSnapshotResult{}, fmt.Errorf("take a snapshot into %s: %w", target, err)
	}
	res := manifestResult(m, target.String())
	removed, err := snapshot.Prune(ctx, target, st.s.ViewsSnapshotKeep)
	if err != nil {
		// The snapshot is stored: a failed prune is tried again after the
		// next one.
		st.log.Warn("views snapshot: prune failed", "snapshot", m.Name, "keep", st.s.ViewsSnapshotKeep, "err", err)
	}
	res.Pruned = removed
	return res, nil
}

// manifestResult is the views.snapshot answer of a manifest.
func manifestResult(m snapshot.Manifest, target string) protocol.ViewsSnapshotResult {
	return protocol.ViewsSnapshotResult{
		Name: m.Name, Version: m.Version, ViewsFormat: m.ViewsFormat, Stream: m.Stream, AppliedSeq: m.AppliedSeq,
		ChainHead: m.ChainHead, Digest: m.Digest, Created: m.Created, Host: m.Host, Size: m.Size, Files: len(m.Files),
		Target: target,
	}
}

// list answers views.snapshot.list: the snapshots in the target, newest
// first.
func (c *viewsSnapshotter) list(ctx context.Context) (protocol.ViewsSnapshotListResult, error) {
	target, err := c.openTarget(ctx)
	if err != nil {
		return protocol.ViewsSnapshotListResult{}, fmt.Errorf("open the snapshot target: %w", err)
	}
	ms, err := target.List(ctx)
	if err != nil {
		return protocol.ViewsSnapshotListResult{}, fmt.Errorf("list the snapshots in %s: %w", target, err)
	}
	out := protocol.ViewsSnapshotListResult{Target: target.String(), Snapshots: make([]protocol.ViewsSnapshotResult, 0, len(ms))}
	for _, m := range ms {
		out.Snapshots = append(out.Snapshots, manifestResult(m, out.Target))
	}
	return out, nil
}
