package mcpbridge

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/protocol"
)

// TestNewListsTheExecutorConfigsProblemsWithTheBridges: the executors'
// base configuration is checked when the bridge is made, with the bridge's
// own configuration, rather than panic in an executor at Start.
func TestNewListsTheExecutorConfigsProblemsWithTheBridges(t *testing.T) {
	good := func() *Config {
		return &Config{Project: "proj", Servers: []ServerConfig{{Name: "s", Command: []string{"true"}}}}
	}
	for _, tc := range []struct {
		name   string
		cfg    *Config
		exec   executor.Config
		fields []string
	}{
		{name: "zero executor config means the defaults", cfg: good()},
		{
			name:   "negative executor bounds",
			cfg:    good(),
			exec:   executor.Config{MaxInFlight: -1, AckWait: -time.Second},
			fields: []string{"executor.AckWait", "executor.MaxInFlight"},
		},
		{
			name:   "bridge and executor problems together",
			cfg:    &Config{Project: "proj"},
			exec:   executor.Config{MaxInFlight: -1},
			fields: []string{"servers", "executor.MaxInFlight"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validate(tc.cfg, Deps{Executor: tc.exec})
			if tc.fields == nil {
				require.NoError(t, err)
				return
			}
			b, err := New(tc.cfg, Deps{Executor: tc.exec})
			require.Nil(t, b)
			require.ErrorIs(t, err, protocol.ErrBadRequest)
			e, ok := protocol.AsError(err)
			require.True(t, ok, "not a *protocol.Error: %v", err)
			var fields []string
			for _, v := range e.Violations {
				fields = append(fields, v.Field)
			}
			require.Equal(t, tc.fields, fields)
		})
	}
}
