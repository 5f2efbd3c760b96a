package projector

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMarshalCallStateMatchesEncodingJSON fills every field of CallState
// (found by reflection, so a new field is covered without editing this
// test) with zero or random values, including strings encoding/json
// escapes, and compares the bytes with json.Marshal's.
func TestMarshalCallStateMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 17))
	strs := []string{"", "a", "turn-0001", "dispatched", `q"uote`, `back\slash`, "<b>&amp;</b>", "tab\tnew\nline", "\x00\x1f",
		"héllo", "日本", "\u2028\u2029", "bad\xffutf8", "emoji 🎉", "\x7f"}
	zones := []*time.Location{time.UTC, time.FixedZone("plus", 5*3600+1800), time.FixedZone("odd", 37)}
	typ := reflect.TypeOf(CallState{})
	for i := range 20000 {
		var st CallState
		v := reflect.ValueOf(&st).Elem()
		for f := range typ.NumField() {
			if rng.IntN(3) == 0 {
				continue
			}
			fv := v.Field(f)
			switch fv.Kind() {
			case reflect.String:
				fv.SetString(strs[rng.IntN(len(strs))])
			case reflect.Uint64:
				fv.SetUint([]uint64{1, 42, 1 << 40, ^uint64(0)}[rng.IntN(4)])
			case reflect.Int:
				fv.SetInt([]int64{-3, 1, 7, 1 << 40}[rng.IntN(4)])
			case reflect.Bool:
				fv.SetBool(true)
			case reflect.Pointer:
				if fv.Type() != reflect.TypeOf(&time.Time{}) {
					t.Fatalf("CallState.%s: a pointer field of a type this test does not fill", typ.Field(f).Name)
				}
				tm := time.Unix(rng.Int64N(1<<34), rng.Int64N(1e9)*int64(rng.IntN(2))).In(zones[rng.IntN(len(zones))])
				if i%1000 == 0 {
					tm = time.Date(10000+rng.IntN(5), 1, 1, 0, 0, 0, 0, time.UTC)
				}
				fv.Set(reflect.ValueOf(&tm))
			default:
				t.Fatalf("CallState.%s: kind %s is not filled by this test; add it", typ.Field(f).Name, fv.Kind())
			}
		}
		want, werr := json.Marshal(&st)
		got, gerr := marshalCallState(&st)
		if werr != nil {
			require.Error(t, gerr, "json.Marshal refused %+v", st)
			continue
		}
		require.NoError(t, gerr)
		require.Equal(t, string(want), string(got))
	}
}
