package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/stream"
)

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

func TestHTTPAuditAPI(t *testing.T) {
	e, s, q := scenarioViews(t)
	srv := httptest.NewServer(httpapi.Audit(q, httpapi.AuditConfig{
		Verify: func(ctx context.Context) (stream.VerifyReport, error) { return s.VerifyStream(ctx, e.JS, "") },
	}))
	t.Cleanup(srv.Close)
	base := srv.URL + "/v1/projects/proj"

	var tl projector.Timeline
	require.Equal(t, 200, getJSON(t, base+"/turns/turn-special/timeline", &tl))
	require.NotEmpty(t, tl.Items)
	require.Equal(t, "turn-special", tl.AgentTurnID)

	var old projector.Timeline
	require.Equal(t, 200, getJSON(t, base+"/turns/turn-special/timeline?as_of_seq="+itoa(tl.Items[2].Seq), &old))
	require.Len(t, old.Items, 3)
	require.Equal(t, tl.Items[2].Seq, old.AsOfSeq)

	var story projector.CallStory
	require.Equal(t, 200, getJSON(t, base+"/calls/override?turn=turn-special", &story))
	require.Equal(t, 1, story.Calls[0].Duplicates)

	var state struct {
		AsOfSeq uint64              `json:"as_of_seq"`
		Call    projector.CallState `json:"call"`
	}
	require.Equal(t, 200, getJSON(t, base+"/turns/turn-special/calls/pending", &state))
	require.Equal(t, projector.StateDispatched, state.Call.State)

	var calls projector.Page[projector.CallState]
	require.Equal(t, 200, getJSON(t, base+"/calls?tool=search&status=success&limit=2", &calls))
	require.Len(t, calls.Items, 2)
	require.NotEmpty(t, calls.NextCursor)
	var more projector.Page[projector.CallState]
	require.Equal(t, 200, getJSON(t, base+"/calls?tool=search&status=success&limit=2&cursor="+calls.NextCursor, &more))
	require.Len(t, more.Items, 2)
	require.NotEqual(t, calls.Items[0].ToolCallID, more.Items[0].ToolCallID)

	var inbox projector.Page[projector.InboxEntry]
	require.Equal(t, 200, getJSON(t, base+"/agents/alice/inbox?state=pending", &inbox))
	require.Len(t, inbox.Items, 5)
	// An Inbox cursor belongs to its agent and its state filter.
	var first projector.Page[projector.InboxEntry]
	require.Equal(t, 200, getJSON(t, base+"/agents/alice/inbox?state=pending&limit=1", &first))
	require.NotEmpty(t, first.NextCursor)
	var next projector.Page[projector.InboxEntry]
	require.Equal(t, 200, getJSON(t, base+"/agents/alice/inbox?state=pending&limit=1&cursor="+first.NextCursor, &next))
	require.Equal(t, inbox.Items[1].ReportSeq, next.Items[0].ReportSeq)
	for _, other := range []string{"/agents/bob/inbox?state=pending", "/agents/alice/inbox?state=consumed", "/agents/alice/inbox?state=all", "/agents/alice/inbox?x="} {
		var refused map[string]any
		require.Equal(t, 400, getJSON(t, base+other+"&cursor="+first.NextCursor, &refused), other)
		require.Contains(t, fmt.Sprint(refused["violations"]), "cursor", other)
	}
	var all projector.Page[projector.InboxEntry]
	require.Equal(t, 200, getJSON(t, base+"/agents/alice/inbox?limit=1", &all))
	require.Equal(t, 200, getJSON(t, base+"/agents/alice/inbox?state=all&limit=1&cursor="+all.NextCursor, &next), "no state and all are one filter")

	var card projector.CardResult
	require.Equal(t, 200, getJSON(t, base+"/cards/rc-turn-special-override-success", &card))
	var roster map[string]any
	require.Equal(t, 200, getJSON(t, base+"/agents/bob/roster", &roster))
	require.Equal(t, "worker-bob", roster["worker_target"])

	var d projector.DigestResult
	require.Equal(t, 200, getJSON(t, srv.URL+"/v1/digest", &d))
	want, err := s.Digest()
	require.NoError(t, err)
	require.Equal(t, want, d.Digest)
	var v stream.VerifyReport
	require.Equal(t, 200, getJSON(t, srv.URL+"/v1/verify", &v))
	require.True(t, v.OK)
	require.Equal(t, d.ChainHead, v.Head)

	var eb errBody
	require.Equal(t, 400, getJSON(t, base+"/calls?as_of_seq=abc&limit=5000&from=yesterday&status=meh", &eb))
	require.Equal(t, "bad_request", eb.Error.Code)
	require.Len(t, eb.Error.Violations, 4, "every parameter problem at once: %+v", eb.Error.Violations)
	eb = errBody{}
	require.Equal(t, 400, getJSON(t, base+"/calls?as_of_seq=0&limit=abc&cursor=zz!", &eb))
	require.Len(t, eb.Error.Violations, 3, "as_of_seq 0, the limit and a cursor that is no cursor, at once: %+v", eb.Error.Violations)
	eb = errBody{}
	require.Equal(t, 400, getJSON(t, srv.URL+"/v1/projects?limit=abc&cursor=zz!", &eb))
	require.Len(t, eb.Error.Violations, 2, "%+v", eb.Error.Violations)
	eb = errBody{}
	require.Equal(t, 404, getJSON(t, base+"/turns/no-such-turn/timeline", &eb))
	require.Equal(t, "not_found", eb.Error.Code)
	eb = errBody{}
	require.Equal(t, 404, getJSON(t, srv.URL+"/v1/nothing-here", &eb))
	eb = errBody{}
	require.Equal(t, 400, getJSON(t, base+"/agents/bob/inbox?state=eaten", &eb))
	require.Equal(t, "state", eb.Error.Violations[0].Field)
	// Times the index cannot hold are refused, not read as "before
	// everything" (int64 nanoseconds overflow after 2262).
	eb = errBody{}
	require.Equal(t, 400, getJSON(t, base+"/turns/turn-special/timeline?as_of=9999-12-31T23:59:59Z", &eb))
	require.Equal(t, "as_of", eb.Error.Violations[0].Field)
}

func itoa(n uint64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
