package configcheck_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/configcheck"
	"github.com/cgledger/cgledger/internal/violationtest"
	"github.com/cgledger/cgledger/protocol"
)

func TestNonNegative(t *testing.T) {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "Zero", 0)
	configcheck.NonNegative(&vs, "Count", -1)
	configcheck.NonNegative(&vs, "Wait", -time.Second)
	require.Equal(t, []string{"Count", "Wait"}, violationtest.ConfigFields(t, protocol.BadRequest("test config", vs)))
	require.Contains(t, vs[1].Message, "got -1s")
}
