package executor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/violationtest"
)

func TestConfigValidateListsEveryProblem(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    executor.Config
		fields []string
	}{
		{name: "zero value means the defaults", cfg: executor.Config{}},
		{name: "explicit values", cfg: executor.Config{AckWait: time.Second, MaxDeliver: 1, MaxInFlight: 1, DrainTimeout: time.Second}},
		{name: "negative MaxInFlight", cfg: executor.Config{MaxInFlight: -1}, fields: []string{"MaxInFlight"}},
		{
			name:   "every bound negative",
			cfg:    executor.Config{AckWait: -time.Second, MaxDeliver: -1, MaxInFlight: -64, DrainTimeout: -time.Millisecond},
			fields: []string{"AckWait", "MaxDeliver", "MaxInFlight", "DrainTimeout"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.fields == nil {
				require.NoError(t, err)
				return
			}
			require.Equal(t, tc.fields, violationtest.ConfigFields(t, err))
			// New refuses it with the same list, before it touches the
			// ledger or the connection (it used to panic making a
			// channel of negative size).
			x, err := executor.New(nil, nil, tc.cfg)
			require.Nil(t, x)
			require.Equal(t, tc.fields, violationtest.ConfigFields(t, err))
		})
	}
}
