package protocol_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// docSection returns the text of doc from the line starting with heading
// to the next heading of the same or a higher level.
func docSection(t *testing.T, file, heading string) string {
	t.Helper()
	b, err := os.ReadFile("../docs/" + file)
	require.NoError(t, err)
	s := string(b)
	i := strings.Index(s, "\n"+heading+"\n")
	require.GreaterOrEqual(t, i, 0, "%s has no %q", file, heading)
	s = s[i+len(heading)+2:]
	level := strings.SplitN(heading, " ", 2)[0]
	for _, h := range []string{"\n" + level + " ", "\n" + level[:len(level)-1] + " "} {
		if len(h) > 2 {
			if j := strings.Index(s, h); j >= 0 {
				s = s[:j]
			}
		}
	}
	return s
}

// tableColumn lists the backquoted codes in column col (0-based) of the
// rows of the markdown tables in text, matching pattern.
func tableColumn(text string, col int, pattern *regexp.Regexp) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| ---") {
			continue
		}
		// The first cell is what precedes the leading "|".
		cells := strings.Split(line, "|")
		if col+1 >= len(cells) {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[col+1], -1) {
			if pattern.MatchString(m[1]) && !slices.Contains(out, m[1]) {
				out = append(out, m[1])
			}
		}
	}
	return out
}

func catalogued(kind protocol.CodeKind) []string {
	var out []string
	for _, c := range protocol.CodesOf(kind) {
		out = append(out, c.Code)
	}
	return out
}

// sameCodes fails naming each code documented but not catalogued and each
// catalogued but not documented.
func sameCodes(t *testing.T, where string, kind protocol.CodeKind, documented []string) {
	t.Helper()
	cat := catalogued(kind)
	require.NotEmpty(t, documented, "no %s codes found in %s", kind, where)
	for _, c := range documented {
		if !slices.Contains(cat, c) {
			t.Errorf("%s lists %s code %q, which protocol.Codes does not", where, kind, c)
		}
	}
	for _, c := range cat {
		if !slices.Contains(documented, c) {
			t.Errorf("protocol.Codes has %s code %q, which %s does not list", kind, c, where)
		}
	}
}

// TestCodesMatchTheDocs: the catalogue and the docs' tables list the same
// codes, both ways: the API's error codes (docs/protocol.md, "Errors"),
// the taxonomy and L0 codes of the outcome table (docs/executor.md,
// "Outcomes and their L0 mapping") and the problem types with their
// statuses (docs/audit-api.md, "Errors").
func TestCodesMatchTheDocs(t *testing.T) {
	word := regexp.MustCompile(`^[a-z_]+$`)
	errs := docSection(t, "protocol.md", "## Errors")
	errs = errs[:strings.Index(errs, "Violation codes")]
	sameCodes(t, "docs/protocol.md (Errors)", protocol.KindError, tableColumn(errs, 0, word))

	outcomes := docSection(t, "executor.md", "## Outcomes and their L0 mapping")
	sameCodes(t, "docs/executor.md (Outcomes and their L0 mapping)", protocol.KindTaxonomy,
		tableColumn(outcomes, 1, regexp.MustCompile(`^[A-Z]-[A-Z]+-[A-Z0-9-]*[A-Z0-9]$`)))
	sameCodes(t, "docs/executor.md (Outcomes and their L0 mapping)", protocol.KindL0, tableColumn(outcomes, 4, word))
	require.ElementsMatch(t, protocol.RecommendedErrorCodes(), catalogued(protocol.KindL0))

	problems := docSection(t, "audit-api.md", "### Errors")
	i := strings.Index(problems, "Statuses and codes:")
	require.GreaterOrEqual(t, i, 0)
	var documented []string
	statuses := map[string]int{}
	for _, m := range regexp.MustCompile("([1-5][0-9][0-9])\\s+`([a-z_]+)`").FindAllStringSubmatch(problems[i:], -1) {
		documented = append(documented, m[2])
		statuses[m[2]] = int(m[1][0]-'0')*100 + int(m[1][1]-'0')*10 + int(m[1][2]-'0')
	}
	sameCodes(t, "docs/audit-api.md (Errors)", protocol.KindProblem, documented)
	for _, c := range protocol.CodesOf(protocol.KindProblem) {
		if s, ok := statuses[c.Code]; ok {
			require.Equal(t, s, c.Status, "status of problem %s", c.Code)
		}
	}
}

// TestCodesAreWhole: every code has a meaning, is catalogued once per kind,
// and only the problem types have a status.
func TestCodesAreWhole(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range protocol.Codes {
		k := string(c.Kind) + "/" + c.Code
		require.False(t, seen[k], "%s is catalogued twice", k)
		seen[k] = true
		require.NotEmpty(t, c.Meaning, k)
		require.Equal(t, c.Kind == protocol.KindProblem, c.Status != 0, k)
	}
}
