package dashboards_test

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/testenv"
)

// promtool finds Prometheus's promtool (Debian's prometheus package, which
// `make test` installs when it can). Without it the rule tests skip, except
// in CI (testenv).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		testenv.Skip(t, "promtool not installed (apt-get install prometheus): %v", err)
	}
	return p
}

// TestRulesPassPromtool checks the generated rule file and unit-tests the
// burn-rate and projector alerts (dashboards/rules_test.yml) with promtool.
func TestRulesPassPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = filepath.Join("..", "..", "dashboards")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %v:\n%s", args, out)
	}
}
