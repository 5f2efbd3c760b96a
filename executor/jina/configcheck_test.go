package jina

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/violationtest"
)

func TestConfigValidate(t *testing.T) {
	require.NoError(t, Config{}.Validate(), "zero values are the defaults")
	require.NoError(t, Config{AllowedHosts: []string{"api.example:8443", "[::1]"}, AllowLoopbackPorts: []int{8080}}.Validate())
	err := Config{AllowedHosts: []string{"s.jina.ai", " ", "."}, AllowLoopbackPorts: []int{0, 65536}, MaxResponseBytes: -1}.Validate()
	require.Equal(t, []string{"AllowedHosts[1]", "AllowedHosts[2]", "AllowLoopbackPorts[0]", "AllowLoopbackPorts[1]", "MaxResponseBytes"},
		violationtest.ConfigFields(t, err))
	require.Equal(t, []string{"MaxResponseBytes"}, violationtest.ConfigFields(t, Register(nil, Config{MaxResponseBytes: -1})))
}
