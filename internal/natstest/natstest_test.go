package natstest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
)

// recordingTB captures Fatalf instead of stopping the goroutine, so a test
// can check that the harness fails a test rather than panicking.
type recordingTB struct {
	testing.TB
	fatal string
}

func (r *recordingTB) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }
func (r *recordingTB) Helper()                           {}

func TestStartFailsTheTestWhenTheServerCannotStart(t *testing.T) {
	notADir := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(notADir, []byte("x"), 0o600))
	rec := &recordingTB{TB: t}
	require.NotPanics(t, func() {
		s := natstest.Start(rec, natstest.WithStoreDir(filepath.Join(notADir, "store")))
		require.Nil(t, s)
	})
	require.Contains(t, rec.fatal, "natstest: start server")
}

func TestRestartKeepsStreamsOnTheSameStore(t *testing.T) {
	start := time.Now()
	srv := natstest.Start(t)
	t.Logf("embedded JetStream server started in %s", time.Since(start))
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := t.Context()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "s.a", []byte("one"))
	require.NoError(t, err)
	url := srv.URL()

	srv.Restart(t)
	require.Equal(t, url, srv.URL(), "same port after restart")
	require.Eventually(t, nc.IsConnected, time.Minute, 10*time.Millisecond)
	s, err := js.Stream(ctx, "S")
	require.NoError(t, err)
	msg, err := s.GetLastMsgForSubject(ctx, "s.a")
	require.NoError(t, err)
	require.Equal(t, "one", string(msg.Data))
}
