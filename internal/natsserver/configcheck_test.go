package natsserver_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/internal/violationtest"
)

func TestConfigValidate(t *testing.T) {
	require.NoError(t, natsserver.Config{StoreDir: t.TempDir()}.Validate(), "zero values are the defaults")
	err := natsserver.Config{Port: 65536, SyncInterval: -1, MaxStore: -1, ReadyTimeout: -1}.Validate()
	require.Equal(t, []string{"StoreDir", "Port", "SyncInterval", "MaxStore", "ReadyTimeout"}, violationtest.ConfigFields(t, err))
	_, err = natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), Port: -1})
	require.Equal(t, []string{"Port"}, violationtest.ConfigFields(t, err))
}
