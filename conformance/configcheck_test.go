package conformance_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/conformance"
	"github.com/cgledger/cgledger/internal/violationtest"
)

func TestConfigValidate(t *testing.T) {
	require.NoError(t, conformance.Config{}.Validate(), "zero values are the defaults")
	err := conformance.Config{Grace: -1, Settle: -1}.Validate()
	require.Equal(t, []string{"Grace", "Settle"}, violationtest.ConfigFields(t, err))
	_, err = conformance.Run(context.Background(), conformance.Config{Settle: -1})
	require.Equal(t, []string{"Settle"}, violationtest.ConfigFields(t, err))
}
