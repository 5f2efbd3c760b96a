package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
	"github.com/cgledger/cgledger/protocol"
)

// TestAuditwebLargeTurn loads a turn of 1,000 calls in the audit page and
// checks it stays usable: every call has its lane, the last lane opens on a
// click with its phases and entries, the turn's raw entries open, and a
// lane's story follows. The times it takes are logged, not asserted (the
// machine running it is shared).
func TestAuditwebLargeTurn(t *testing.T) {
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		testenv.Skip(t, "chromium not installed (make tools, or apt-get install chromium): %v", err)
	}
	const calls = 1000
	dir := artifactsDir(t)
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))

	// The calls, dispatched as the admin from a few connections at once;
	// the built-in echo runs and reports each.
	creds := filepath.Join(s.Data, "auth", "admin.creds")
	_, inbox, err := auth.ReadCreds(creds)
	require.NoError(t, err)
	nc, err := nats.Connect(s.natsURL(), nats.UserCredentials(creds), nats.CustomInboxPrefix(inbox))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	cl := client.New(nc, client.WithActor("alice"), client.WithTimeout(30*time.Second))
	started := time.Now()
	ids := make(chan int)
	errs := make(chan error, calls)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ids {
				id := fmt.Sprintf("c%04d", i)
				card := "cc-big-" + id
				_, err := cl.Dispatch(context.Background(), protocol.DispatchRequest{
					Subject:  protocol.ToolCommandSubject(protocol.DefaultVersion, "demo", "main", "echo"),
					Identity: protocol.Identity{AgentID: "alice", AgentTurnID: "big", TurnEpoch: 1, ToolCallID: id},
					Card: protocol.Card{CardID: card, ProjectID: "demo", Type: protocol.CardToolCall, AuthorID: "alice", AgentTurnID: "big", ToolCallID: id,
						Content:  json.RawMessage(fmt.Sprintf(`{"tool_name":"echo","arguments":{"i":%d}}`, i)),
						Metadata: protocol.CardMetadata{TraceID: fmt.Sprintf("%032x", i+1), ParentStepID: "big", StepID: "step-" + id}},
					Payload: protocol.ToolCommandPayload{ToolCallCardID: card, ToolName: "echo", AfterExecution: protocol.AfterSuspend, TimeoutMS: 60000},
				})
				if err != nil {
					errs <- fmt.Errorf("dispatch %s: %w", id, err)
				}
			}
		}()
	}
	for i := range calls {
		ids <- i
	}
	close(ids)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	auditor := s.issue(t, "--project", "demo", "--role", "auditor")
	// Every call reported and its wakeup decided, in the views, before the
	// page looks (so that the answer it renders is the whole turn).
	require.Eventually(t, func() bool {
		var cs struct {
			Items []struct {
				Status        string `json:"status"`
				WakeupSkipped bool   `json:"wakeup_skipped"`
				WakeupSeq     uint64 `json:"wakeup_seq"`
			} `json:"items"`
		}
		apiGet(t, auditor, s.httpURL()+"/v1/projects/demo/calls?limit=1000", &cs)
		for _, c := range cs.Items {
			if c.Status == "" || !c.WakeupSkipped && c.WakeupSeq == 0 {
				return false
			}
		}
		return len(cs.Items) == calls
	}, 2*time.Minute, 100*time.Millisecond, "every call reported")
	t.Logf("%d calls dispatched, run and reported in %s", calls, time.Since(started).Round(time.Millisecond))
	tl := apiTimeline(t, auditor, s.httpURL()+"/v1/projects/demo/turns/big/timeline")

	b, browserProblems := newBrowser(t, chrome, dir, 4*time.Minute)
	b.do(chromedp.Navigate(s.httpURL() + "/ui/"))
	b.waitView(`[data-view=signin]`)
	b.do(chromedp.Evaluate[chromedp.Void](`sessionStorage.setItem('cgledger.audit.jwt', ` + jsString(auditor.JWT) + `)`))

	step := time.Now()
	b.do(chromedp.Evaluate[chromedp.Void](`location.hash = '#/p/demo/turns/big'`))
	b.waitView(fmt.Sprintf(`[data-view=timeline][data-ready=true][data-calls="%d"][data-count="%d"]`, calls, len(tl.Items)))
	t.Logf("turn of %d calls (%d entries): shown %s after asking; the picture took %s ms to build; polled every %s ms",
		calls, len(tl.Items), time.Since(step).Round(time.Millisecond), b.eval(`document.querySelector('[data-testid=view]').dataset.renderMs`),
		b.eval(`document.querySelector('[data-testid=view]').dataset.live`))
	require.Equal(t, fmt.Sprint(calls), b.eval(`String(document.querySelectorAll('[data-testid=view] [data-testid=call-lane][data-status=success]').length)`))
	b.viewShot("large-turn")

	// The last lane, scrolled to and opened with one click.
	last := fmt.Sprintf(`[data-testid=call-lane][data-call=c%04d]`, calls-1)
	step = time.Now()
	b.do(chromedp.ScrollIntoView(chromedp.CSS(last)), chromedp.Click(chromedp.CSS(last+` > summary`)))
	b.wait(last + ` [data-testid=phase-table]`)
	t.Logf("the last lane opened in %s", time.Since(step).Round(time.Millisecond))
	require.NotEqual(t, "0", b.eval(`String(document.querySelectorAll('`+last+` [data-testid=lane-entry]').length)`))
	b.viewShot("large-turn-last-lane")

	// Every raw entry, one click away.
	step = time.Now()
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=all-entries-open]`)))
	b.waitView(`[data-view=timeline] [data-testid=all-entries] [data-testid=timeline-entry]`)
	require.Equal(t, fmt.Sprint(len(tl.Items)), b.eval(`String(document.querySelectorAll('[data-testid=all-entries] [data-testid=timeline-entry]').length)`))
	t.Logf("all %d raw entries shown in %s", len(tl.Items), time.Since(step).Round(time.Millisecond))

	// And on to a call's story.
	step = time.Now()
	b.do(chromedp.Click(chromedp.CSS(last + ` [data-testid=lane-story-link]`)))
	b.waitView(fmt.Sprintf(`[data-view=story][data-ready=true] [data-testid=call-lane][data-call=c%04d]`, calls-1))
	t.Logf("a call's story from the large turn in %s", time.Since(step).Round(time.Millisecond))
	b.viewShot("large-turn-story")

	require.Empty(t, browserProblems(), "the page ran without script errors or CSP refusals")
}

// viewShot saves a PNG of what the window shows (a full-page shot of a
// thousand lanes would be tens of thousands of pixels tall).
func (b *browser) viewShot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	b.shots++
	path := filepath.Join(b.dir, fmt.Sprintf("large-%02d-%s.png", b.shots, name))
	require.NoError(b.t, os.WriteFile(path, png, 0o644))
	b.t.Logf("screenshot: %s", path)
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
