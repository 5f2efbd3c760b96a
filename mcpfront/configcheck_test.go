package mcpfront_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/violationtest"
	"github.com/cgledger/cgledger/mcpfront"
)

func TestConfigValidate(t *testing.T) {
	require.NoError(t, mcpfront.Config{Project: "p", Agent: "a"}.Validate(), "zero values are the defaults")
	err := mcpfront.Config{Project: "p", Agent: "a", ProgressInterval: -1, CloseStreamAfter: -1}.Validate()
	require.Equal(t, []string{"ProgressInterval", "CloseStreamAfter"}, violationtest.ConfigFields(t, err))
	_, err = mcpfront.New(mcpfront.Config{Project: "p", Agent: "a", ProgressInterval: -1})
	require.Equal(t, []string{"ProgressInterval"}, violationtest.ConfigFields(t, err))
}

func TestHTTPConfigValidate(t *testing.T) {
	require.NoError(t, mcpfront.HTTPConfig{}.Validate(), "zero values are the defaults")
	err := mcpfront.HTTPConfig{ProgressInterval: -1, CloseStreamAfter: -1, MaxMessageBytes: -1, SessionTimeout: -1}.Validate()
	require.Equal(t, []string{"ProgressInterval", "CloseStreamAfter", "MaxMessageBytes", "SessionTimeout"}, violationtest.ConfigFields(t, err))
}
