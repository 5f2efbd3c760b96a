package ledger

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckDuplicateKeys(t *testing.T) {
	for _, tc := range []struct {
		name   string
		doc    string
		opaque []string
		want   []string // field/code
	}{
		{"none", `{"a":1,"b":{"a":1},"c":[{"a":1},{"a":2}]}`, nil, nil},
		{"empty containers", `{"a":{},"b":[],"c":[[],{}],"d":{"e":{}}}`, nil, nil},
		{"top level", `{"a":1,"a":1}`, nil, []string{"p.a/duplicate"}},
		{"reported once per key", `{"a":1,"a":2,"a":3}`, nil, []string{"p.a/duplicate"}},
		{"escaped spelling of the same key", `{"a":1,"\u0061":2}`, nil, []string{"p.a/duplicate"}},
		{"same key in sibling objects is fine", `{"x":{"a":1},"y":{"a":1}}`, nil, nil},
		{"nested in arrays", `{"l":[1,[{"k":0,"k":0}],{"m":[{},{"z":1,"z":2}]}]}`, nil,
			[]string{"p.l[1][0].k/duplicate", "p.l[2].m[1].z/duplicate"}},
		{"after a container value", `{"a":{"b":[1,2]},"a":3}`, nil, []string{"p.a/duplicate"}},
		{"huge numbers are fine", `{"n":1e999,"m":-1e-999}`, nil, nil},
		{"opaque members are skipped", `{"card":{"a":1,"a":2},"payload":[{"b":1,"b":1}],"x":{"c":1,"c":1}}`, []string{"card", "payload"},
			[]string{"p.x.c/duplicate"}},
		{"opaque member repeated itself", `{"card":1,"card":{"a":1,"a":1}}`, []string{"card"}, []string{"p.card/duplicate"}},
		{"opaque applies only at the top", `{"x":{"card":{"a":1,"a":1}}}`, []string{"card"}, []string{"p.x.card.a/duplicate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var vs Violations
			checkDuplicateKeys("p", []byte(tc.doc), &vs, tc.opaque...)
			var got []string
			for _, v := range vs {
				require.NotEmpty(t, v.Message)
				got = append(got, v.Field+"/"+v.Code)
			}
			require.Equal(t, tc.want, got)
		})
	}
	t.Run("capped", func(t *testing.T) {
		var b strings.Builder
		b.WriteString("{")
		for i := range maxDuplicateKeyViolations + 50 {
			fmt.Fprintf(&b, `"k%d":1,"k%d":2,`, i, i)
		}
		b.WriteString(`"end":0}`)
		var vs Violations
		checkDuplicateKeys("p", []byte(b.String()), &vs)
		require.Len(t, vs, maxDuplicateKeyViolations+1)
		require.Equal(t, "p", vs[len(vs)-1].Field, "the last violation says more were left out")
	})
	t.Run("nesting up to the limit", func(t *testing.T) {
		doc := strings.Repeat(`{"a":`, MaxJSONDepth) + "1" + strings.Repeat("}", MaxJSONDepth)
		var vs Violations
		checkDuplicateKeys("p", []byte(doc), &vs)
		require.Empty(t, vs)
	})
	t.Run("nesting past the limit", func(t *testing.T) {
		const depth = 5000
		doc := strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
		var vs Violations
		checkDuplicateKeys("p", []byte(doc), &vs)
		require.Len(t, vs, 1)
		require.Equal(t, VTooLarge, vs[0].Code)
		require.LessOrEqual(t, len(vs[0].Field), MaxViolationText+3, "the path is cut")
	})
}
