package projector_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// getJSON, errBody and itoa: the helpers of the tests that read the views
// through the audit API (httpapi.Audit).

func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	want := "application/json"
	if resp.StatusCode >= 400 {
		want = "application/problem+json"
	}
	require.Equal(t, want, resp.Header.Get("Content-Type"))
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(body, out), string(body))
	return resp.StatusCode
}

type errBody struct {
	Error struct {
		Code       string `json:"code"`
		Message    string `json:"message"`
		Violations []struct {
			Field string `json:"field"`
			Code  string `json:"code"`
		} `json:"violations"`
	} `json:"error"`
}

func itoa(n uint64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
