package stream_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/internal/violationtest"
	"github.com/cgledger/cgledger/stream"
)

func TestConfigValidateListsEveryProblem(t *testing.T) {
	require.NoError(t, stream.Config{}.Validate())
	require.Equal(t, []string{"Replicas"}, violationtest.ConfigFields(t, stream.Config{Replicas: -3}.Validate()))
	require.Equal(t, []string{"Replicas", "DuplicateWindow", "MaxMsgSize", "MaxBytes", "MaxAge", "CallRecordTTL"},
		violationtest.ConfigFields(t, stream.Config{Replicas: -1, DuplicateWindow: -time.Second, MaxMsgSize: -1,
			MaxBytes: -2, MaxAge: -time.Hour, CallRecordTTL: -time.Minute}.Validate()))
}

func TestImportConfigValidateListsEveryProblem(t *testing.T) {
	require.NoError(t, stream.ImportConfig{}.Validate())
	require.NoError(t, stream.ImportConfig{InFlight: 1, Progress: func(uint64) {}}.Validate())
	require.Equal(t, []string{"InFlight"}, violationtest.ConfigFields(t, stream.ImportConfig{InFlight: -1}.Validate()))

	// ImportVerified refuses it before it reads the file or the stream.
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	ctx := ctxT(t)
	require.NoError(t, stream.Provision(ctx, js, stream.Config{}))
	read := false
	r := readFunc(func([]byte) (int, error) { read = true; return 0, nil })
	_, err = stream.ImportVerified(ctx, js, stream.DefaultName, r, stream.ImportConfig{InFlight: -8})
	require.Equal(t, []string{"InFlight"}, violationtest.ConfigFields(t, err))
	require.False(t, read, "the file was read")
	_, err = stream.ImportVerified(ctx, js, stream.DefaultName, strings.NewReader(""), stream.ImportConfig{})
	require.ErrorIs(t, err, stream.ErrBadExport, "the zero value is usable")
}

// readFunc is an io.Reader made of a function.
type readFunc func([]byte) (int, error)

func (f readFunc) Read(b []byte) (int, error) { return f(b) }
