package main

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// events is a log of starts and stops, read while a group runs.
type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, s)
}

func (e *events) get() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.list...)
}

// recorder is a component that writes its start and stop into a shared log.
type recorder struct {
	name              string
	log               *events
	startErr, stopErr error
	stopCtxErr        *error
}

func (r *recorder) Start(context.Context) error {
	r.log.add("start " + r.name)
	return r.startErr
}

func (r *recorder) Stop(ctx context.Context) error {
	r.log.add("stop " + r.name)
	if r.stopCtxErr != nil {
		*r.stopCtxErr = ctx.Err()
	}
	return r.stopErr
}

func newRecorded(log *events, names ...string) (*group, map[string]*recorder) {
	g := &group{}
	parts := map[string]*recorder{}
	for _, n := range names {
		r := &recorder{name: n, log: log}
		parts[n] = r
		g.add(n, r)
	}
	return g, parts
}

// TestGroupStartsInOrderAndStopsInReverse: the list is the start order;
// once the context ends, every component stops, last started first.
func TestGroupStartsInOrderAndStopsInReverse(t *testing.T) {
	log := &events{}
	g, parts := newRecorded(log, "nats", "ledger", "executor", "http")
	var stopCtxErr error
	parts["nats"].stopCtxErr = &stopCtxErr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	require.Eventually(t, func() bool { return len(log.get()) == 4 }, 5*time.Second, time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Run returned before the context ended: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	require.Equal(t, []string{"start nats", "start ledger", "start executor", "start http"}, log.get())
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, []string{
		"start nats", "start ledger", "start executor", "start http",
		"stop http", "stop executor", "stop ledger", "stop nats",
	}, log.get())
	require.NoError(t, stopCtxErr, "a stop is not cut short by the cancellation that began it")
}

// TestGroupFailedStartStopsTheStartedInReverse: a start that fails stops
// the components started before it, not itself nor the ones after, and
// its error comes back as it was.
func TestGroupFailedStartStopsTheStartedInReverse(t *testing.T) {
	log := &events{}
	g, parts := newRecorded(log, "lock", "nats", "ledger", "http")
	boom := errors.New("ledger stream missing")
	parts["ledger"].startErr = boom
	err := g.Run(context.Background())
	require.Same(t, boom, err)
	require.Equal(t, []string{"start lock", "start nats", "start ledger", "stop nats", "stop lock"}, log.get())
}

// TestGroupCancelledStartIsTold: a start ended by the context returns
// context.Canceled, which serve reads as a requested stop.
func TestGroupCancelledStartIsTold(t *testing.T) {
	log := &events{}
	ctx, cancel := context.WithCancel(context.Background())
	g := &group{}
	g.add("first", &recorder{name: "first", log: log})
	g.add("waits", hooks{start: func(ctx context.Context) error { cancel(); <-ctx.Done(); return ctx.Err() }})
	require.ErrorIs(t, g.Run(ctx), context.Canceled)
	require.Equal(t, []string{"start first", "stop first"}, log.get())
}

// TestGroupJoinsStopErrors: every component stops even when one fails to,
// and every stop error comes back, named.
func TestGroupJoinsStopErrors(t *testing.T) {
	log := &events{}
	g, parts := newRecorded(log, "a", "b", "c")
	errA, errC := errors.New("a stuck"), errors.New("c stuck")
	parts["a"].stopErr, parts["c"].stopErr = errA, errC
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := g.Run(ctx)
	require.ErrorIs(t, err, errA)
	require.ErrorIs(t, err, errC)
	require.Equal(t, "stop c: c stuck\nstop a: a stuck", err.Error())
	require.Equal(t, []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"}, log.get())

	// A failed start and a failed stop of an earlier component: both.
	g, parts = newRecorded(&events{}, "a", "b")
	boom := errors.New("b cannot start")
	parts["a"].stopErr = errA
	parts["b"].startErr = boom
	err = g.Run(context.Background())
	require.ErrorIs(t, err, boom)
	require.ErrorIs(t, err, errA)
}

// TestHooksMayOmitEitherStep: a part with only a stop (or only a start).
func TestHooksMayOmitEitherStep(t *testing.T) {
	require.NoError(t, hooks{}.Start(context.Background()))
	require.NoError(t, hooks{}.Stop(context.Background()))
}

// TestServeComponentsOrder: serve's components start in the order the
// parts depend on each other and stop in the order serveHelp promises:
// stop pulling commands, drain in-flight calls, stop the API, sync the
// projector checkpoint, drain NATS, stop the embedded server last.
func TestServeComponentsOrder(t *testing.T) {
	names := func(s Settings) []string {
		var out []string
		for _, p := range serveComponents(&serveState{s: s, embedded: s.NATSURL == ""}).parts {
			out = append(out, p.name)
		}
		return out
	}
	s := defaultSettings()
	s.Roles = []string{"api", "executor", "projector", "mcp"}
	s.PProf = "127.0.0.1:0"
	require.Equal(t, []string{
		"data directory lock", "http listener", "security", "http while starting", "embedded nats-server", "nats connection",
		"view store", "ledger", "archive", "storage supervisor", "work context",
		"projector", "views snapshotter", "inbox API", "ledger API", "deadline keeper", "approval keeper", "report sweeper",
		"pprof", "http server", "projector catch-up", "executor", "mcp bridge", "serving",
	}, names(s))

	// Reversed, the shutdown order of the default roles.
	s = defaultSettings()
	got := names(s)
	var stops []string
	for i := len(got) - 1; i >= 0; i-- {
		stops = append(stops, got[i])
	}
	require.Equal(t, []string{
		"serving", "executor", "projector catch-up", "http server",
		"report sweeper", "approval keeper", "deadline keeper", "ledger API", "inbox API", "views snapshotter", "projector",
		"work context", "storage supervisor", "archive", "ledger", "view store",
		"nats connection", "embedded nats-server", "http while starting", "security", "http listener", "data directory lock",
	}, stops)

	// An external server and only the API: no embedded server, no views.
	s = defaultSettings()
	s.NATSURL, s.Roles = "nats://127.0.0.1:4222", []string{"api"}
	require.Equal(t, []string{
		"data directory lock", "http listener", "security", "http while starting", "nats connection",
		"ledger", "archive", "storage supervisor", "work context",
		"ledger API", "deadline keeper", "approval keeper", "report sweeper", "http server", "serving",
	}, names(s))
}
