package httpclient_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpclient"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/protocol"
)

// binary is the cgledger binary built once for the package's tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "httpclient-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if binary, err = servetest.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestClient runs every kind of route against a real `cgledger serve`:
// typed answers, typed problems (404, 400 with violations, 401), the
// streamed export and a canceled context.
func TestClient(t *testing.T) {
	data := t.TempDir()
	s := servetest.Start(t, binary, data, servetest.FreePort(t), servetest.FreePort(t))
	token, _, err := auth.ReadCreds(filepath.Join(data, "auth", auth.AdminCredsFile))
	require.NoError(t, err)
	c := httpclient.New(s.HTTPURL()+"/", httpclient.WithToken(token), httpclient.WithHTTPClient(&http.Client{Timeout: time.Minute}))
	ctx := context.Background()

	ready, err := c.Ready(ctx)
	require.NoError(t, err)
	require.Equal(t, "ready", ready.Status)
	health, err := c.Health(ctx)
	require.NoError(t, err)
	require.Equal(t, "ok", health.Status)

	// A tool of the project, then a call of it through the binary.
	reg, err := c.RegisterTool(ctx, "demo", []byte("tool_name: shout\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo\nafter_execution: terminate\n"))
	require.NoError(t, err)
	require.Equal(t, "shout", reg.ToolName)
	require.False(t, reg.Unchanged)
	out, _, code := s.Run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--turn", "t1", "--call-id", "c1", "--args", `{"text":"hi"}`)
	require.Equal(t, 0, code, out)

	tool, err := c.Tool(ctx, "demo", "shout")
	require.NoError(t, err)
	require.Equal(t, reg.Seq, tool.Seq)
	tools, err := c.Tools(ctx, "demo", httpclient.List{Limit: 1})
	require.NoError(t, err)
	require.Len(t, tools.Items, 1)
	require.NotEmpty(t, tools.NextCursor)

	// The views catch up with the call's report.
	require.Eventually(t, func() bool {
		st, err := c.CallState(ctx, "demo", "t1", "c1", httpclient.AsOf{})
		return err == nil && st.Call.ReportedSeq > 0
	}, 30*time.Second, 50*time.Millisecond)

	projects, err := c.Projects(ctx, httpclient.List{})
	require.NoError(t, err)
	require.Equal(t, "demo", projects.Items[0].ProjectID)
	calls, err := c.Calls(ctx, "demo", httpclient.CallFilter{Tool: "echo"}, httpclient.List{Limit: 10})
	require.NoError(t, err)
	require.Len(t, calls.Items, 1)
	require.Equal(t, "c1", calls.Items[0].ToolCallID)
	story, err := c.CallStory(ctx, "demo", "c1", "t1", httpclient.AsOf{})
	require.NoError(t, err)
	require.NotEmpty(t, story.Items)
	timeline, err := c.Timeline(ctx, "demo", "t1", httpclient.AsOf{Seq: calls.AsOfSeq})
	require.NoError(t, err)
	require.NotEmpty(t, timeline.Items)
	inbox, err := c.Inbox(ctx, "demo", "alice", "all", httpclient.List{})
	require.NoError(t, err)
	require.Len(t, inbox.Items, 1)
	cards, err := c.TurnCards(ctx, "demo", "t1", httpclient.List{})
	require.NoError(t, err)
	require.NotEmpty(t, cards.Items)
	var first struct {
		CardID string `json:"card_id"`
	}
	require.NoError(t, json.Unmarshal(cards.Items[0].Card, &first))
	card, err := c.Card(ctx, "demo", first.CardID, httpclient.AsOf{})
	require.NoError(t, err)
	require.NotEmpty(t, card.Versions)
	history, err := c.ProjectTool(ctx, "demo", "shout", httpclient.AsOf{})
	require.NoError(t, err)
	require.Equal(t, reg.Seq, history.Current.Seq)
	overview, err := c.Overview(ctx, "demo", httpclient.OverviewRange{Buckets: 4}, httpclient.AsOf{})
	require.NoError(t, err)
	require.NotEmpty(t, overview.Buckets)

	digest, err := c.Digest(ctx)
	require.NoError(t, err)
	link, err := c.ChainLink(ctx, digest.AppliedSeq)
	require.NoError(t, err)
	require.Equal(t, digest.ChainHead, link.Link)
	rep, err := c.Verify(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)

	// The export streams one line per entry.
	body, err := c.Export(ctx, 1)
	require.NoError(t, err)
	lines := 0
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines++
	}
	require.NoError(t, sc.Err())
	require.NoError(t, body.Close())
	require.Greater(t, lines, 2)

	// 404: a typed problem with the protocol's code.
	_, err = c.CallState(ctx, "demo", "t1", "nope", httpclient.AsOf{})
	var p *httpclient.Problem
	require.ErrorAs(t, err, &p)
	require.Equal(t, http.StatusNotFound, p.Status)
	require.NotEmpty(t, p.Code)
	require.True(t, httpclient.IsNotFound(err))
	require.Contains(t, string(p.Body), `"code"`)

	// 400: every violation listed.
	_, err = c.Calls(ctx, "demo", httpclient.CallFilter{Status: "bogus", From: time.Unix(2000, 0), To: time.Unix(1000, 0)}, httpclient.List{})
	require.ErrorAs(t, err, &p)
	require.Equal(t, http.StatusBadRequest, p.Status)
	require.Equal(t, protocol.CodeBadRequest, p.Code)
	require.GreaterOrEqual(t, len(p.Violations), 2, p.Violations)
	require.True(t, errors.Is(err, protocol.ErrBadRequest), "the problem unwraps to the protocol's error")

	// 401: no token.
	_, err = httpclient.New(s.HTTPURL()).Projects(ctx, httpclient.List{})
	require.ErrorAs(t, err, &p)
	require.Equal(t, http.StatusUnauthorized, p.Status)
	require.Equal(t, protocol.Code("unauthenticated"), p.Code)
	require.NotEmpty(t, p.Title)
	require.True(t, strings.HasSuffix(p.Type, "unauthenticated"), p.Type)

	// The answer hook sees the body as received.
	var raw []byte
	_, err = httpclient.New(s.HTTPURL(), httpclient.WithToken(token), httpclient.WithAnswerHook(func(b []byte) { raw = b })).Digest(ctx)
	require.NoError(t, err)
	require.Contains(t, string(raw), digest.Digest)

	// A canceled context ends the request with a transport error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = c.Digest(cctx)
	var te *httpclient.TransportError
	require.ErrorAs(t, err, &te)
	require.ErrorIs(t, err, context.Canceled)

	// Nothing listens: a transport error, not a problem.
	_, err = httpclient.New("http://127.0.0.1:" + fmt.Sprint(servetest.FreePort(t))).Digest(ctx)
	require.ErrorAs(t, err, &te)
	require.False(t, strings.Contains(err.Error(), "HTTP "), err.Error())
}
