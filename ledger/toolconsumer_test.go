package ledger_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestToolConsumerWorksAsAnsweredWithoutAuth: on a server without
// credentials (serve --no-auth) the consumer tool.consumer names is pulled
// under the api_prefix it answers, as with credentials, and the answer
// carries the pull limits a service sizes its pulls by, as the consumer
// has them.
func TestToolConsumerWorksAsAnsweredWithoutAuth(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	ctx := ctxT(t)
	_, err := e.l.RegisterToolYAML(ctx, project, []byte(strings.ReplaceAll(toolYAML, "probe", "echo")))
	require.NoError(t, err)
	c := newCall("turn-tc", "call-tc", 1)
	_, err = e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)

	svc := e.srv.Connect(t)
	r := request(t, svc, protocol.APISubject(project, "echo", protocol.OpToolConsumer), nil, `{}`)
	require.True(t, r.OK, "%+v", r.Error)
	var tc struct {
		Stream        string `json:"stream"`
		Consumer      string `json:"consumer"`
		APIPrefix     string `json:"api_prefix"`
		MaxAckPending int    `json:"max_ack_pending"`
		MaxWaiting    int    `json:"max_waiting"`
		AckWaitMS     int64  `json:"ack_wait_ms"`
	}
	require.NoError(t, json.Unmarshal(r.Result, &tc))
	require.Equal(t, "cgledger.js.API", tc.APIPrefix, "one prefix, with credentials or without")

	js, err := jetstream.NewWithAPIPrefix(svc, tc.APIPrefix)
	require.NoError(t, err)
	cons, err := js.Consumer(ctx, tc.Stream, tc.Consumer)
	require.NoError(t, err, "the answered prefix reaches the consumer")
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(30*time.Second))
	require.NoError(t, err)
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
		require.NoError(t, m.Ack())
	}
	require.NoError(t, batch.Error())
	require.Len(t, got, 1)
	require.Equal(t, c.id, got[0].Headers().Get(protocol.HeaderToolCallID))

	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, 1000, info.Config.MaxAckPending)
	require.Equal(t, 512, info.Config.MaxWaiting)
	require.Equal(t, info.Config.MaxAckPending, tc.MaxAckPending)
	require.Equal(t, info.Config.MaxWaiting, tc.MaxWaiting)
	require.Equal(t, info.Config.AckWait.Milliseconds(), tc.AckWaitMS)
}

// TestToolConsumerBodyIsTheDocumentedObject: the body names nothing, but a
// body that is not a JSON object is refused, listed as for every request;
// an empty body is the same as {}.
func TestToolConsumerBodyIsTheDocumentedObject(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	ctx := ctxT(t)
	_, err := e.l.RegisterToolYAML(ctx, project, []byte(strings.ReplaceAll(toolYAML, "probe", "echo")))
	require.NoError(t, err)
	subj := protocol.APISubject(project, "echo", protocol.OpToolConsumer)
	for _, body := range []string{`[1]`, `"x"`, `{"a":1,"a":2}`, `{`} {
		r := request(t, e.nc, subj, nil, body)
		require.False(t, r.OK, body)
		require.Equal(t, "bad_request", r.Error.Code, "%s: %+v", body, r.Error)
		require.NotEmpty(t, r.Error.Violations, body)
		require.True(t, strings.HasPrefix(r.Error.Violations[0].Field, "body"), "%s: %+v", body, r.Error.Violations)
	}
	for _, body := range []string{``, `{}`, `{"unknown":1}`} {
		r := request(t, e.nc, subj, nil, body)
		require.True(t, r.OK, "%q: %+v", body, r.Error)
	}
}
