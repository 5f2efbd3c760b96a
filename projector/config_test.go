package projector_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/violationtest"
	"github.com/cgledger/cgledger/projector"
)

func TestConfigValidateListsEveryProblem(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    projector.Config
		fields []string
	}{
		{name: "zero value means the defaults", cfg: projector.Config{}},
		{name: "negative TailSyncInterval is documented", cfg: projector.Config{TailSyncInterval: -1}},
		{
			name:   "every bound negative",
			cfg:    projector.Config{BatchSize: -1, SyncEvery: -2, SkipPollInterval: -time.Second},
			fields: []string{"BatchSize", "SyncEvery", "SkipPollInterval"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.fields == nil {
				require.NoError(t, err)
				return
			}
			require.Equal(t, tc.fields, violationtest.ConfigFields(t, err))
			// New refuses it before it reads the store.
			p, err := projector.New(nil, nil, tc.cfg)
			require.Nil(t, p)
			require.Equal(t, tc.fields, violationtest.ConfigFields(t, err))
		})
	}
}

func TestAPIConfigValidateListsEveryProblem(t *testing.T) {
	require.NoError(t, projector.APIConfig{}.Validate())
	err := projector.APIConfig{RequestTimeout: -time.Second, MaxInFlight: -1, MaxWait: -1}.Validate()
	require.Equal(t, []string{"RequestTimeout", "MaxInFlight", "MaxWait"}, violationtest.ConfigFields(t, err))
	// ServeAPI refuses it before anything else (here: before it asks for
	// the ledger it needs).
	var p projector.Projector
	s, err := p.ServeAPI(t.Context(), nil, nil, projector.APIConfig{MaxInFlight: -1})
	require.Nil(t, s)
	require.Equal(t, []string{"MaxInFlight"}, violationtest.ConfigFields(t, err))
}

func TestStoreOptionsValidate(t *testing.T) {
	require.NoError(t, projector.StoreOptions{}.Validate())
	dir := t.TempDir()
	s, err := projector.OpenStore(dir, projector.StoreOptions{CacheBytes: -1})
	require.Nil(t, s)
	require.Equal(t, []string{"CacheBytes"}, violationtest.ConfigFields(t, err))
}

func TestWaitingConfigValidate(t *testing.T) {
	require.NoError(t, projector.WaitingConfig{}.Validate(), "zero values are the defaults")
	err := projector.WaitingConfig{Grace: -1, CacheFor: -1}.Validate()
	require.Equal(t, []string{"Grace", "CacheFor"}, violationtest.ConfigFields(t, err))
}
