package protocol

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
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
			CheckDuplicateKeys("p", []byte(tc.doc), &vs, tc.opaque...)
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
		CheckDuplicateKeys("p", []byte(b.String()), &vs)
		require.Len(t, vs, maxDuplicateKeyViolations+1)
		require.Equal(t, "p", vs[len(vs)-1].Field, "the last violation says more were left out")
	})
	t.Run("nesting up to the limit", func(t *testing.T) {
		doc := strings.Repeat(`{"a":`, MaxJSONDepth) + "1" + strings.Repeat("}", MaxJSONDepth)
		var vs Violations
		CheckDuplicateKeys("p", []byte(doc), &vs)
		require.Empty(t, vs)
	})
	t.Run("nesting past the limit", func(t *testing.T) {
		const depth = 5000
		doc := strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
		var vs Violations
		CheckDuplicateKeys("p", []byte(doc), &vs)
		require.Len(t, vs, 1)
		require.Equal(t, VTooLarge, vs[0].Code)
		require.LessOrEqual(t, len(vs[0].Field), MaxViolationText, "the path fits")
	})
	t.Run("a deep path too long for a field keeps its end", func(t *testing.T) {
		const depth = 300
		doc := strings.Repeat(`{"abcdefgh":`, depth) + "1" + strings.Repeat("}", depth)
		var vs Violations
		CheckDuplicateKeys("p", []byte(doc), &vs)
		require.Len(t, vs, 1)
		require.Equal(t, VTooLarge, vs[0].Code)
		require.Len(t, vs[0].Field, MaxViolationText)
		require.True(t, strings.HasPrefix(vs[0].Field, "...") && !strings.HasPrefix(vs[0].Field, "...."), "a cut path starts with one ...: %s", vs[0].Field)
		require.True(t, strings.HasSuffix(vs[0].Field, ".abcdefgh.abcdefgh"), "and keeps its end: %s", vs[0].Field)
	})
	t.Run("a long repeated key keeps its end", func(t *testing.T) {
		long := strings.Repeat("k", 600) + "END"
		var vs Violations
		CheckDuplicateKeys("p", []byte(`{"x":{"`+long+`":1,"`+long+`":2}}`), &vs)
		require.Len(t, vs, 1)
		require.Len(t, vs[0].Field, MaxViolationText)
		require.True(t, strings.HasPrefix(vs[0].Field, "...") && strings.HasSuffix(vs[0].Field, "kkkEND"), vs[0].Field)
	})
}

// TestNoDuplicateKeysAgreesWithExactScan checks the fast scan against the
// exact one on generated documents: when it says a document is clean the
// exact scan finds nothing, and it does say so for every clean document
// whose member names have no escapes (else it would save nothing).
func TestNoDuplicateKeysAgreesWithExactScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 13))
	var escapedKey bool
	var gen func(b *strings.Builder, depth int)
	str := func(b *strings.Builder, key bool) {
		names := []string{"a", "b", "c", "d", `q\"x`, `\u0061`, "é", `s\\`}
		s := names[rng.IntN(len(names))]
		if key && strings.Contains(s, `\`) {
			escapedKey = true
		}
		b.WriteString(`"` + s + `"`)
	}
	ws := func(b *strings.Builder) {
		if rng.IntN(4) == 0 {
			b.WriteString([]string{" ", "\n", "\t ", "\r\n"}[rng.IntN(4)])
		}
	}
	gen = func(b *strings.Builder, depth int) {
		ws(b)
		switch k := rng.IntN(9); {
		case k < 3 && depth < 6:
			b.WriteString("{")
			for i := range rng.IntN(5) {
				if i > 0 {
					b.WriteString(",")
				}
				ws(b)
				str(b, true)
				ws(b)
				b.WriteString(":")
				gen(b, depth+1)
			}
			ws(b)
			b.WriteString("}")
		case k < 5 && depth < 6:
			b.WriteString("[")
			for i := range rng.IntN(4) {
				if i > 0 {
					b.WriteString(",")
				}
				gen(b, depth+1)
			}
			b.WriteString("]")
		case k == 5:
			str(b, false)
		default:
			b.WriteString([]string{"0", "-1.5e3", "true", "false", "null", "1e999"}[rng.IntN(6)])
		}
		ws(b)
	}
	fast, clean := 0, 0
	for range 20000 {
		escapedKey = false
		var b strings.Builder
		b.WriteString("{")
		str(&b, true)
		b.WriteString(":")
		gen(&b, 1)
		b.WriteString("}")
		doc := []byte(b.String())
		require.True(t, json.Valid(doc), "generated %s", doc)
		var vs Violations
		checkDuplicateKeysExact("p", doc, &vs)
		ok := noDuplicateKeys(doc)
		if ok {
			fast++
			require.Empty(t, vs, "the fast scan passed %s", doc)
		}
		if len(vs) == 0 && !escapedKey {
			clean++
			require.True(t, ok, "the fast scan sent a clean document to the exact scan: %s", doc)
		}
	}
	require.Greater(t, clean, 1000, "the generator makes clean documents")
	require.GreaterOrEqual(t, fast, clean)
	require.False(t, noDuplicateKeys([]byte(strings.Repeat("[", MaxJSONDepth+1)+strings.Repeat("]", MaxJSONDepth+1))), "too deep goes to the exact scan")
	big := "{"
	for i := range fastDupMaxKeys + 1 {
		big += fmt.Sprintf(`"k%d":1,`, i)
	}
	require.False(t, noDuplicateKeys([]byte(big+`"end":1}`)), "a large object goes to the exact scan")
}

// FuzzNoDuplicateKeys: the fast scan never passes a document in which the
// exact scan finds a violation.
func FuzzNoDuplicateKeys(f *testing.F) {
	for _, s := range []string{`{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `{"a":[{"b":1},{"b":1}]}`, `{"a":"}\"{","a":0}`, `{"x":{"y":{"x":1,"y":2}}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !json.Valid(doc) || !noDuplicateKeys(doc) {
			return
		}
		var vs Violations
		checkDuplicateKeysExact("p", doc, &vs)
		require.Empty(t, vs, "the fast scan passed %q", doc)
	})
}

// TestParseObjectDeeperThanTheDecoder: past encoding/json's own limit
// (10000 levels) a document is still refused for its depth, not as
// invalid JSON.
func TestParseObjectDeeperThanTheDecoder(t *testing.T) {
	doc := `{"x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`
	var vs Violations
	_, ok := ParseObject("body", []byte(doc), &vs)
	require.False(t, ok)
	require.Len(t, vs, 1)
	require.Equal(t, VTooLarge, vs[0].Code)
	require.True(t, strings.HasPrefix(vs[0].Field, "...") || strings.HasPrefix(vs[0].Field, "body.x"), vs[0].Field)
}
