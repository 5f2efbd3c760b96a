package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
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
	started := time.Now()
	dispatchEchoCalls(t, s, "big", calls)
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
