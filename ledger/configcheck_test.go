package ledger_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/violationtest"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/stream"
)

func TestConfigValidateListsEveryProblem(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	for _, tc := range []struct {
		name   string
		cfg    ledger.Config
		fields []string
	}{
		{name: "zero value means the defaults", cfg: ledger.Config{}},
		{name: "documented negatives mean none", cfg: ledger.Config{DeadlineGrace: -1, ApprovalLease: -1}},
		{
			name: "every problem at once",
			cfg: ledger.Config{
				Version: "v 1",
				Streams: stream.Config{Stream: "CG_REFUSED", Replicas: -1, DuplicateWindow: -time.Second, MaxMsgSize: -1,
					MaxBytes: -2, MaxAge: -time.Hour, CallRecordTTL: -time.Minute},
				ReportLease: -time.Second, ToolAckWait: -1, ResultWrites: "pipelined", Retention: -time.Hour,
			},
			fields: []string{"Version", "Streams.Replicas", "Streams.DuplicateWindow", "Streams.MaxMsgSize", "Streams.MaxBytes",
				"Streams.MaxAge", "Streams.CallRecordTTL", "ReportLease", "ToolAckWait", "Retention", "ResultWrites"},
		},
		{
			name:   "retention below the minimum TTL",
			cfg:    ledger.Config{Streams: stream.Config{Stream: "CG_REFUSED"}, Retention: time.Millisecond},
			fields: []string{"Retention"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.fields == nil {
				require.NoError(t, err)
				return
			}
			require.Equal(t, tc.fields, violationtest.ConfigFields(t, err))
			l, err := ledger.Open(ctx, e.NC, tc.cfg)
			require.Nil(t, l)
			require.Equal(t, tc.fields, violationtest.ConfigFields(t, err))
			// Refused before anything was provisioned.
			_, err = e.JS.Stream(ctx, "CG_REFUSED")
			require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
		})
	}
}

func TestServiceConfigsValidateListEveryProblem(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)

	require.NoError(t, ledger.APIConfig{}.Validate())
	// A negative MaxInFlight used to panic making the API's semaphore.
	s, err := e.L.ServeAPI(ctx, ledger.APIConfig{MaxInFlight: -1, RequestTimeout: -time.Second})
	require.Nil(t, s)
	require.Equal(t, []string{"RequestTimeout", "MaxInFlight"}, violationtest.ConfigFields(t, err))

	require.NoError(t, ledger.ApprovalKeeperConfig{}.Validate())
	ak, err := e.L.StartApprovalKeeper(ctx, ledger.ApprovalKeeperConfig{Durable: "refused-approvals", AckWait: -1, Workers: -1, FinishAfter: -time.Second})
	require.Nil(t, ak)
	require.Equal(t, []string{"AckWait", "Workers", "FinishAfter"}, violationtest.ConfigFields(t, err))

	require.NoError(t, ledger.DeadlineKeeperConfig{}.Validate())
	dk, err := e.L.StartDeadlineKeeper(ctx, ledger.DeadlineKeeperConfig{Durable: "refused-deadlines", AckWait: -time.Second, Workers: -16})
	require.Nil(t, dk)
	require.Equal(t, []string{"AckWait", "Workers"}, violationtest.ConfigFields(t, err))

	// Neither keeper made its consumer.
	for _, name := range []string{"refused-approvals", "refused-deadlines"} {
		_, err := e.JS.Consumer(ctx, stream.DefaultName, name)
		require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, name)
	}
}
