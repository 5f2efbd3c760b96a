package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

// TestAuditwebInChromium drives the audit web page (/ui/) in headless
// Chromium as an auditor would: sign in by pasting a .creds file, open a
// project, filter and page its calls, read a turn's timeline entry by entry
// (checked against the API), follow a call to its story, go back in time
// with the as-of control, and check the chain. It saves a screenshot of each
// step under CGLEDGER_ARTIFACTS (default <repo>/artifacts/auditweb/).
func TestAuditwebInChromium(t *testing.T) {
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		testenv.Skip(t, "chromium not installed (make tools, or apt-get install chromium): %v", err)
	}
	dir := artifactsDir(t)
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))

	// The static page is open and locked down; the root redirects to it.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(s.httpURL() + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusFound, resp.StatusCode)
	require.Equal(t, "/ui/", resp.Header.Get("Location"))
	for path, ctype := range map[string]string{"/ui/": "text/html", "/ui/app.js": "text/javascript", "/ui/app.css": "text/css"} {
		resp := httpAs(t, credential{}, "GET", s.httpURL()+path, "")
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.Contains(t, resp.Header.Get("Content-Type"), ctype, path)
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'self'", path)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), path)
	}

	// Two turns: a success whose arguments are hostile markup and a number
	// beyond float64, a failure (bad arguments), a rejection (the same call
	// id with other arguments), and a last call in another turn.
	hostile := `<img src=x onerror=alert(1)>`
	out, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--turn", "t1", "--call-id", "c1",
		"--args", `{"text":"`+hostile+`","n":12345678901234567890}`)
	require.Equal(t, 0, code, out)
	_, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "sleep", "--args", `{"ms":"soon"}`, "--turn", "t1", "--call-id", "c2")
	require.Equal(t, 1, code, "arguments that do not match the schema fail the call")
	_, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"changed"}`, "--turn", "t1", "--call-id", "c1")
	require.Equal(t, 1, code, "the same call with other arguments is rejected")
	out, code = s.run(t, "call", "--project", "demo", "--agent", "bob", "--tool", "echo", "--args", `{"text":"bye"}`, "--turn", "t2", "--call-id", "c3")
	require.Equal(t, 0, code, out)

	auditor := s.issue(t, "--project", "demo", "--role", "auditor")
	global := s.issue(t, "--project", "*", "--role", "auditor")
	// Every entry written (each call's wakeup decided after its report) and
	// applied to the views before the API and the browser look.
	base := s.httpURL() + "/v1/projects/demo"
	require.Eventually(t, func() bool {
		var cs struct {
			Items []struct {
				WakeupSkipped bool   `json:"wakeup_skipped"`
				WakeupSeq     uint64 `json:"wakeup_seq"`
			} `json:"items"`
		}
		apiGet(t, auditor, base+"/calls", &cs)
		for _, c := range cs.Items {
			if !c.WakeupSkipped && c.WakeupSeq == 0 {
				return false
			}
		}
		return len(cs.Items) == 3
	}, 30*time.Second, 20*time.Millisecond, "every call's wakeup decided")
	var live struct {
		LastSeq uint64 `json:"last_seq"`
	}
	apiGet(t, global, s.httpURL()+"/v1/verify", &live)
	require.Eventually(t, func() bool {
		var d struct {
			AppliedSeq uint64 `json:"applied_seq"`
		}
		apiGet(t, global, s.httpURL()+"/v1/digest", &d)
		return d.AppliedSeq >= live.LastSeq
	}, 30*time.Second, 20*time.Millisecond)

	// What the API says, to compare the page with.
	var calls struct {
		AsOfSeq uint64 `json:"as_of_seq"`
		Items   []struct {
			Turn          string `json:"agent_turn_id"`
			Call          string `json:"tool_call_id"`
			Status        string `json:"status"`
			DispatchedSeq uint64 `json:"dispatched_seq"`
		} `json:"items"`
	}
	apiGet(t, auditor, base+"/calls", &calls)
	require.Len(t, calls.Items, 3)
	timeline := apiTimeline(t, auditor, base+"/turns/t1/timeline")
	var rejSeq uint64
	for _, it := range timeline.Items {
		if it.Kind == "rejection" {
			rejSeq = it.Seq
		}
	}
	require.NotZero(t, rejSeq, "the rejection is in turn t1's timeline")
	story := apiTimeline(t, auditor, base+"/calls/c1?turn=t1")
	before := rejSeq - 1 // before the rejection and the last call (c3)
	require.Greater(t, calls.Items[2].DispatchedSeq, before)
	timelineBefore := apiTimeline(t, auditor, base+"/turns/t1/timeline?as_of_seq="+u64(before))
	storyBefore := apiTimeline(t, auditor, base+"/calls/c1?turn=t1&as_of_seq="+u64(before))
	require.Less(t, len(storyBefore.Items), len(story.Items))
	var digest struct {
		AppliedSeq uint64 `json:"applied_seq"`
		Digest     string `json:"digest"`
	}
	apiGet(t, global, s.httpURL()+"/v1/digest", &digest)
	var link struct {
		Link string `json:"link"`
	}
	apiGet(t, global, s.httpURL()+"/v1/chain/"+u64(before), &link)

	// The browser.
	b, browserProblems := newBrowser(t, chrome, dir, 3*time.Minute)

	// 1. First load: the page tries without a token, gets 401, asks.
	b.do(chromedp.Navigate(s.httpURL() + "/"))
	b.waitView(`[data-view=signin]`)
	b.wait(`[data-testid=signin-input]`)
	require.Equal(t, s.httpURL()+"/ui/", b.location())
	require.Contains(t, b.text(`[data-testid=signin-reason]`), "bearer token")
	b.shot("signin")

	// 2. Paste the whole .creds file.
	b.do(chromedp.SetValue(chromedp.CSS(`[data-testid=signin-input]`), auditor.Creds),
		chromedp.Click(chromedp.CSS(`[data-testid=signin-submit]`)))
	b.waitView(`[data-view=projects][data-ready=true]`)
	require.Contains(t, b.text(`[data-testid=auth-state]`), "auditor of project demo")
	require.Equal(t, auditor.JWT, b.eval(`sessionStorage.getItem('cgledger.audit.jwt')`), "only the JWT is kept")
	b.shot("projects")

	// 3. Open the project: its calls, in dispatch order.
	b.do(chromedp.SendKeys(chromedp.CSS(`[data-testid=project-input]`), "demo"),
		chromedp.Click(chromedp.CSS(`[data-testid=project-open]`)))
	b.waitView(`[data-view=calls][data-ready=true][data-count="3"]`)
	var want []string
	for _, c := range calls.Items {
		want = append(want, c.Turn+"/"+c.Call+":"+c.Status)
	}
	require.Equal(t, want, b.rows())
	b.shot("calls")

	// 4. Pages of two: the next page holds the third call.
	b.do(chromedp.SetValue(chromedp.CSS(`[data-testid=filter-limit]`), "2"),
		chromedp.Click(chromedp.CSS(`[data-testid=filter-apply]`)))
	b.waitView(`[data-view=calls][data-ready=true][data-count="2"]`)
	require.Equal(t, want[:2], b.rows())
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=calls-next]`)))
	b.waitView(`[data-view=calls][data-ready=true][data-count="1"]`)
	require.Equal(t, want[2:], b.rows())
	require.Contains(t, b.location(), "cursor=")
	b.shot("calls-page2")

	// Back twice (hash routing): the unfiltered list again.
	b.do(chromedp.Evaluate[chromedp.Void](`history.back()`))
	b.waitView(`[data-view=calls][data-ready=true][data-count="2"]`)
	b.do(chromedp.Evaluate[chromedp.Void](`history.back()`))
	b.waitView(`[data-view=calls][data-ready=true][data-count="3"]`)

	// 5. Filter by status: only the failed call.
	b.do(chromedp.SetValue(chromedp.CSS(`[data-testid=filter-status]`), "failed"),
		chromedp.Click(chromedp.CSS(`[data-testid=filter-apply]`)))
	b.waitView(`[data-view=calls][data-ready=true][data-count="1"]`)
	require.Equal(t, []string{"t1/c2:failed"}, b.rows())
	require.Contains(t, b.location(), "status=failed")
	b.shot("calls-failed")

	// 6. The turn as a timeline: one lane per call with its tool and
	// status, its phases as bars on one axis with their durations (each the
	// time between the API's entries), the rejection marked on its call.
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=call-row] [data-testid=turn-link]`)))
	b.waitView(`[data-view=timeline][data-ready=true][data-count="` + strconv.Itoa(len(timeline.Items)) + `"]`)
	require.Contains(t, b.text(`[data-testid=timeline-count]`), "2 calls, "+strconv.Itoa(len(timeline.Items))+" entries")
	require.Equal(t, u64(timeline.AsOfSeq), b.text(`[data-testid=view] [data-testid=answer-asof]`))
	require.Equal(t, []string{"c1:success:echo", "c2:failed:sleep"}, b.lanes())
	for _, c := range []string{"c1", "c2"} {
		require.Equal(t, apiPhases(t, timeline.Items, "t1", c), b.bars(c), "call %s: its bars are the API's phases", c)
	}
	b.wait(`[data-testid=call-lane][data-call=c1] [data-testid=marker][data-kind=rejection][data-seq="` + u64(rejSeq) + `"]`)
	b.shot("timeline")
	// One click on a lane: each phase's duration and the call's raw entries.
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=call-lane][data-call=c1] > summary`)))
	b.wait(`[data-testid=call-lane][data-call=c1] [data-testid=phase-table]`)
	require.Equal(t, seqsOf(story.Items), b.evalStrings(`[...document.querySelectorAll('[data-testid=call-lane][data-call=c1] [data-testid=lane-entry]')].map(e => e.dataset.seq)`),
		"the lane holds the call's entries")
	require.Contains(t, b.text(`[data-testid=call-lane][data-call=c1] [data-testid=phase-row][data-phase=run]`), "run")
	b.shot("timeline-lane")
	// The turn's raw entries, folded: every entry, as the API lists it, in full.
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=all-entries-open]`)))
	b.wait(`[data-testid=all-entries] [data-testid=timeline-entry]`)
	b.checkEntries(`[data-testid=timeline-entry]`, timeline.Items)
	text := b.text(`[data-testid=view]`)
	require.Contains(t, text, hostile, "markup from an agent is shown as text")
	require.Contains(t, text, "12345678901234567890", "every digit of a number is kept")
	require.Equal(t, "0", b.eval(`String(document.querySelectorAll('main img, main script').length)`), "no element from data")
	b.shot("timeline")
	// A reload shows the same view (the credential stays for the tab): the
	// mark on the old document is gone from the new one.
	b.do(chromedp.Evaluate[chromedp.Void](`document.body.dataset.stale = 'yes'; location.reload()`))
	b.wait(`body:not([data-stale]) [data-testid=view][data-view=timeline][data-ready=true][data-count="` + strconv.Itoa(len(timeline.Items)) + `"]`)

	// 7. From the rejection entry to the call's story: the same picture,
	// and every rejection with its violations.
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=all-entries-open]`)))
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=timeline-entry][data-kind=rejection] [data-testid=entry-call-link]`)))
	b.waitView(`[data-view=story][data-ready=true][data-count="` + strconv.Itoa(len(story.Items)) + `"]`)
	state := b.text(`[data-testid=story-state]`)
	require.Contains(t, state, "reported")
	require.Contains(t, state, "success")
	rej := b.text(`[data-testid=last-rejection]`)
	require.Contains(t, rej, "conflict")
	require.Contains(t, rej, "card.card_id (conflict)", "the last rejection lists its violations")
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=expand-all]`)))
	b.wait(`[data-testid=story-entry][data-kind=rejection] [data-testid=entry-data]`)
	b.checkEntries(`[data-testid=story-entry]`, story.Items)
	require.Equal(t, []string{"c1:success:echo"}, b.lanes())
	require.Equal(t, apiPhases(t, story.Items, "t1", "c1"), b.bars("c1"))
	b.wait(`[data-testid=call-lane][data-call=c1] [data-testid=marker][data-kind=rejection][data-seq="` + u64(rejSeq) + `"]`)
	require.Contains(t, b.text(`[data-testid=incident][data-kind=rejection][data-seq="`+u64(rejSeq)+`"]`), "card.card_id (conflict)")
	require.Equal(t, "true", b.eval(`document.querySelector('[data-testid=live-state]').dataset.live`), "the latest state is live")
	b.shot("story")

	// 8. An as-of the API refuses: its error, with every violation.
	b.do(chromedp.SetValue(chromedp.CSS(`[data-testid=asof-input]`), "yesterday"),
		chromedp.Click(chromedp.CSS(`[data-testid=asof-apply]`)))
	b.wait(`[data-testid=view][data-view=story][data-ready=true] [data-testid=story-error]`)
	refusal := b.text(`[data-testid=story-error]`)
	require.Contains(t, refusal, "HTTP 400 bad_request")
	require.Contains(t, refusal, "as_of (invalid_value)")

	// As of before the rejection: the story loses it, the turn and the
	// project's calls are as they stood then (no c3 yet).
	b.do(chromedp.SetValue(chromedp.CSS(`[data-testid=asof-input]`), u64(before)),
		chromedp.Click(chromedp.CSS(`[data-testid=asof-apply]`)))
	b.waitView(`[data-view=story][data-ready=true][data-as-of-seq="` + u64(before) + `"][data-count="` + strconv.Itoa(len(storyBefore.Items)) + `"]`)
	require.Equal(t, u64(before), b.text(`[data-testid=view] [data-testid=answer-asof]`))
	require.Equal(t, "false", b.eval(`String(!!document.querySelector('[data-testid=last-rejection]'))`))
	require.Equal(t, "false", b.eval(`String(!!document.querySelector('[data-testid=incident]'))`))
	require.Equal(t, "false", b.eval(`document.querySelector('[data-testid=live-state]').dataset.live`), "an earlier state is not live")
	b.checkEntries(`[data-testid=story-entry]`, storyBefore.Items)
	b.shot("story-asof")
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=state-turn-link]`)))
	b.waitView(`[data-view=timeline][data-ready=true][data-as-of-seq="` + u64(before) + `"][data-count="` + strconv.Itoa(len(timelineBefore.Items)) + `"]`)
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=all-entries-open]`)))
	b.wait(`[data-testid=all-entries] [data-testid=timeline-entry]`)
	b.checkEntries(`[data-testid=timeline-entry]`, timelineBefore.Items)
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=nav-calls]`)))
	b.waitView(`[data-view=calls][data-ready=true][data-as-of-seq="` + u64(before) + `"][data-count="2"]`)
	require.Equal(t, want[:2], b.rows())
	b.shot("calls-asof")

	// 9. The chain needs "*": the project's auditor is told so plainly.
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=nav-chain]`)))
	b.wait(`[data-testid=digest-error]`)
	require.Contains(t, b.text(`[data-testid=digest-error]`), "HTTP 403 forbidden")
	b.shot("chain-forbidden")

	// 10. Sign out, sign in with a bare JWT of every project: digest, the
	// link at the as-of sequence, and verify.
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=signout]`)))
	b.waitView(`[data-view=signin]`)
	require.Equal(t, "null", b.eval(`String(sessionStorage.getItem('cgledger.audit.jwt'))`))
	b.do(chromedp.SetValue(chromedp.CSS(`[data-testid=signin-input]`), global.JWT),
		chromedp.Click(chromedp.CSS(`[data-testid=signin-submit]`)))
	b.waitView(`[data-view=chain][data-ready=true]`)
	require.Equal(t, u64(digest.AppliedSeq), b.text(`[data-testid=digest-applied]`))
	require.Equal(t, digest.Digest, b.text(`[data-testid=digest-value]`))
	require.Contains(t, b.text(`[data-testid=chain-link]`), link.Link)
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=verify-run]`)))
	b.wait(`[data-testid=verify-result][data-ok=true]`)
	require.Contains(t, b.text(`[data-testid=verify-result]`), "OK")
	b.shot("chain-verified")

	// With "*" the projects view lists the projects (GET /v1/projects).
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=nav-projects]`)))
	b.waitView(`[data-view=projects][data-ready=true]`)
	b.wait(`[data-testid=project-row][data-project=demo] [data-testid=project-link]`)
	b.shot("projects-list")

	// 11. The project overview: calls per status and tool over time, each
	// tool's p50/p95, the rejections: what GET .../overview answers.
	var ov struct {
		Calls      int            `json:"calls"`
		ByStatus   map[string]int `json:"by_status"`
		Rejections int            `json:"rejections"`
		Tools      []struct {
			ToolName string   `json:"tool_name"`
			Calls    int      `json:"calls"`
			P50MS    *float64 `json:"p50_ms"`
		} `json:"tools"`
	}
	apiGet(t, global, base+"/overview?buckets=40", &ov)
	require.Equal(t, 3, ov.Calls)
	require.Equal(t, map[string]int{"success": 2, "failed": 1}, ov.ByStatus)
	b.do(chromedp.Evaluate[chromedp.Void](`location.hash = '#/p/demo/overview?window=all'`))
	b.waitView(`[data-view=overview][data-ready=true][data-count="3"]`)
	require.Equal(t, "3", b.text(`[data-testid=overview-calls]`))
	require.Equal(t, strconv.Itoa(ov.Rejections), b.text(`[data-testid=overview-rejections]`))
	require.Equal(t, []string{"success:2", "failed:1"}, b.evalStrings(`[...document.querySelectorAll('[data-testid=overview-status]')].map(e => e.dataset.status + ':' + e.querySelector('.big').textContent)`))
	for _, tool := range ov.Tools {
		row := `[data-testid=overview-tool][data-tool=` + tool.ToolName + `] `
		require.Equal(t, strconv.Itoa(tool.Calls), b.text(row+`[data-testid=tool-calls]`), tool.ToolName)
		require.NotNil(t, tool.P50MS, tool.ToolName)
		require.NotEqual(t, "—", b.text(row+`[data-testid=tool-p50]`), tool.ToolName)
	}
	require.Equal(t, "3", b.eval(`String([...document.querySelectorAll('[data-testid=overview-bucket]')].reduce((n, e) => n + Number(e.dataset.calls), 0))`))
	b.shot("overview")

	// 12. Approvals are feature-detected: without the endpoint (GET
	// .../approvals answers 404) the pane says so and its link stays hidden.
	resp = httpAs(t, global, "GET", base+"/approvals?state=pending", "")
	resp.Body.Close()
	served := resp.StatusCode != http.StatusNotFound
	b.do(chromedp.Evaluate[chromedp.Void](`location.hash = '#/p/demo/approvals'`))
	b.waitView(`[data-view=approvals][data-ready=true][data-available="` + strconv.FormatBool(served) + `"]`)
	require.Eventually(t, func() bool {
		return b.eval(`String(document.querySelector('[data-testid=nav-approvals]').hidden)`) == strconv.FormatBool(!served)
	}, time.Minute, 20*time.Millisecond, "the approvals link follows the endpoint")
	b.shot("approvals")
	require.True(t, served, "this server has approvals")

	// 12b. An approver's round trip: two calls of a tool that needs carol's
	// approval are held; carol signs in with her credential, sees each
	// with its arguments and digest (checked in the page), approves one
	// and denies the other; the ledger's outcome is read through the API.
	registerTool(t, s, deployTool)
	startCall(t, s, "ta", "a1", `{"text":"ship 1.4.2","env":"prod"}`)
	startCall(t, s, "ta", "a2", `{"text":"drop the table","env":"prod"}`)
	carol := s.issue(t, "--project", "demo", "--role", "approver", "--approver", "carol")
	heldItems := map[string]protocol.ApprovalItem{}
	require.Eventually(t, func() bool {
		var page struct {
			Items []protocol.ApprovalItem `json:"items"`
		}
		apiGet(t, carol, base+"/approvals?state=pending", &page)
		for _, it := range page.Items {
			heldItems[it.ToolCallID] = it
		}
		return len(heldItems) == 2
	}, time.Minute, 50*time.Millisecond, "both calls are held")
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=signout]`)))
	b.waitView(`[data-view=signin]`)
	b.do(chromedp.SetValue(chromedp.CSS(`[data-testid=signin-input]`), carol.Creds),
		chromedp.Click(chromedp.CSS(`[data-testid=signin-submit]`)))
	b.wait(`[data-testid=signout]:not([hidden])`)
	require.Contains(t, b.text(`[data-testid=auth-state]`), "approver carol of project demo")
	b.do(chromedp.Evaluate[chromedp.Void](`location.hash = '#/p/demo/approvals'`))
	b.waitView(`[data-view=approvals][data-ready=true][data-available=true][data-count="2"]`)
	b.wait(`[data-testid=approvals-mine] [data-testid=approval-item][data-call=a1][data-state=pending]`)
	b.wait(`[data-testid=approvals-mine] [data-testid=approval-item][data-call=a2][data-state=pending]`)
	b.shot("approvals-approver")
	for i, tc := range []struct{ call, op, reason string }{{"a1", "approve", "release 1.4.2, ticket 88"}, {"a2", "deny", "not in prod"}} {
		item := `[data-testid=approval-item][data-call=` + tc.call + `] `
		b.do(chromedp.Click(chromedp.CSS(item + `[data-testid=approval-review]`)))
		b.wait(item + `[data-testid=decision] [data-testid=digest-check][data-ok=true]`)
		require.Equal(t, heldItems[tc.call].ArgumentsDigest, strings.Fields(b.text(item + `[data-testid=decision-digest]`))[0], "the page shows the digest the ledger holds")
		require.Equal(t, heldItems[tc.call].ToolCallCardID, b.text(item+`[data-testid=decision-card]`))
		var shown, held any
		require.NoError(t, json.Unmarshal([]byte(b.text(item+`[data-testid=decision-arguments]`)), &shown))
		require.NoError(t, json.Unmarshal(heldItems[tc.call].Arguments, &held))
		require.Equal(t, held, shown, "the page shows the call's arguments")
		b.do(chromedp.SetValue(chromedp.CSS(item+`[data-testid=decision-reason]`), tc.reason),
			chromedp.Click(chromedp.CSS(item+`[data-testid=decision-`+tc.op+`]`)))
		b.wait(item + `[data-testid=decision-result][data-op=` + tc.op + `]`)
		b.shot("approvals-" + tc.op)
		// Back to the list, rendered afresh: the decided call has left it.
		b.do(chromedp.Click(chromedp.CSS(item + `[data-testid=decision-back]`)))
		b.waitView(`[data-view=approvals][data-ready=true][data-count="` + strconv.Itoa(1-i) + `"]`)
	}
	// The ledger's outcome: a1 approved by carol and run, a2 denied and
	// failed without running.
	for call, want := range map[string]struct{ decision, reason, status string }{
		"a1": {protocol.ApprovalApproved, "release 1.4.2, ticket 88", protocol.StatusSuccess},
		"a2": {protocol.ApprovalDenied, "not in prod", protocol.StatusFailed},
	} {
		var one struct {
			Approval protocol.ApprovalItem `json:"approval"`
		}
		apiGet(t, carol, base+"/approvals/ta/"+call, &one)
		require.Equal(t, want.decision, one.Approval.State, call)
		require.Equal(t, "carol", one.Approval.Approver, call)
		require.Equal(t, want.reason, one.Approval.Reason, call)
		require.Equal(t, want.status, waitReported(t, s, "ta", call).Status, call)
	}
	b.do(chromedp.Evaluate[chromedp.Void](`location.hash = '#/p/demo/approvals?state=decided'`))
	b.waitView(`[data-view=approvals][data-ready=true][data-count="2"]`)
	b.wait(`[data-testid=approval-item][data-call=a1][data-state=approved]`)
	b.wait(`[data-testid=approval-item][data-call=a2][data-state=denied]`)
	b.shot("approvals-decided")
	// Back to the auditor of every project for the rest.
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=signout]`)))
	b.waitView(`[data-view=signin]`)
	b.do(chromedp.SetValue(chromedp.CSS(`[data-testid=signin-input]`), global.JWT),
		chromedp.Click(chromedp.CSS(`[data-testid=signin-submit]`)))
	b.wait(`[data-testid=signout]:not([hidden])`)

	// 13. Live: a call made while the turn is open appears without a reload.
	b.do(chromedp.Evaluate[chromedp.Void](`location.hash = '#/p/demo/turns/t2'`))
	b.waitView(`[data-view=timeline][data-ready=true][data-calls="1"]`)
	b.do(chromedp.Evaluate[chromedp.Void](`document.body.dataset.stale = 'still'`))
	out, code = s.run(t, "call", "--project", "demo", "--agent", "bob", "--tool", "echo", "--args", `{"text":"live"}`, "--turn", "t2", "--call-id", "c5")
	require.Equal(t, 0, code, out)
	b.wait(`body[data-stale=still] [data-testid=view][data-view=timeline][data-calls="2"] [data-testid=call-lane][data-call=c5][data-status=success]`)
	require.Contains(t, b.text(`[data-testid=live-state]`), "live: updated")
	b.shot("timeline-live")

	// The same report again (a tool retrying) is a duplicate: the call's
	// story, open, shows it on the lane and in its list.
	b.do(chromedp.Click(chromedp.CSS(`[data-testid=call-lane][data-call=c5] > summary`)),
		chromedp.Click(chromedp.CSS(`[data-testid=call-lane][data-call=c5] [data-testid=lane-story-link]`)))
	b.waitView(`[data-view=story][data-ready=true] [data-testid=call-lane][data-call=c5]`)
	var c5 struct {
		Items []struct {
			Kind string `json:"kind"`
			Data struct {
				Status           string `json:"status"`
				AfterExecution   string `json:"after_execution"`
				ToolResultCardID string `json:"tool_result_card_id"`
				StepID           string `json:"step_id"`
				SourceID         string `json:"source_id"`
				SourceFunction   string `json:"source_function"`
			} `json:"data"`
		} `json:"items"`
	}
	apiGet(t, global, base+"/calls/c5?turn=t2", &c5)
	var report protocol.ReportRequest
	for _, it := range c5.Items {
		if it.Kind == "report" {
			report = protocol.ReportRequest{ProjectID: "demo", ChannelID: "main",
				Identity: protocol.Identity{AgentID: "bob", AgentTurnID: "t2", TurnEpoch: 1, ToolCallID: "c5"},
				SourceID: it.Data.SourceID, SourceFunction: it.Data.SourceFunction,
				Payload: protocol.ReportPayload{Status: it.Data.Status, AfterExecution: it.Data.AfterExecution, ToolResultCardID: it.Data.ToolResultCardID, StepID: it.Data.StepID}}
		}
	}
	require.NotEmpty(t, report.Payload.ToolResultCardID, "c5 was reported")
	adminCreds := filepath.Join(s.Data, "auth", "admin.creds")
	_, adminInbox, err := auth.ReadCreds(adminCreds)
	require.NoError(t, err)
	nc, err := nats.Connect(s.natsURL(), nats.UserCredentials(adminCreds), nats.CustomInboxPrefix(adminInbox))
	require.NoError(t, err)
	defer nc.Close()
	dup, err := client.New(nc, client.WithActor("echo"), client.WithTimeout(30*time.Second)).Report(context.Background(), report)
	require.NoError(t, err)
	require.True(t, dup.Duplicate, "the same report again is a duplicate")
	b.wait(`[data-testid=view][data-view=story] [data-testid=incident][data-kind=duplicate]`)
	b.wait(`[data-testid=call-lane][data-call=c5] [data-testid=marker][data-kind=duplicate]`)
	require.Contains(t, b.text(`[data-testid=incident][data-kind=duplicate]`), "a repeated report from "+report.SourceID)
	b.shot("story-duplicate")

	// 14. With --no-auth the page never asks: it tries without a token
	// first and asks only on a 401.
	noAuth := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t), "--no-auth")
	out, code = noAuth.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{}`, "--turn", "t9", "--call-id", "c9")
	require.Equal(t, 0, code, out)
	b.do(chromedp.Navigate(noAuth.httpURL() + "/ui/#/p/demo/calls"))
	b.waitView(`[data-view=calls][data-ready=true][data-count="1"]`)
	require.Equal(t, []string{"t9/c9:success"}, b.rows())
	require.Equal(t, "true", b.eval(`String(document.querySelector('[data-testid=signin]').hidden)`))
	b.shot("no-auth")

	require.Empty(t, browserProblems(), "the page ran without script errors or CSP refusals")
}

// newBrowser starts headless Chromium with one tab, for at most limit;
// problems stops it and returns the uncaught exceptions, CSP refusals and
// script errors the page logged (which fail a test).
func newBrowser(t *testing.T, chrome, dir string, limit time.Duration) (b *browser, problems func() []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome),
		chromedp.NoSandbox, // root in CI containers
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	)...)
	t.Cleanup(cancelAlloc)
	b = &browser{t: t, dir: dir}
	// Start the browser before anything else uses the tab: chromedp
	// allocates on a tab's first use, and a second use after a failed
	// start allocates again on the same tab, which panics inside chromedp
	// (close of closed channel). A failed start gets one fresh tab.
	var cancelTab context.CancelFunc
	for attempt := 1; ; attempt++ {
		b.ctx, cancelTab = chromedp.NewContext(allocCtx)
		err := chromedp.Do(b.ctx)
		if err == nil {
			break
		}
		cancelTab()
		if attempt == 2 {
			t.Fatalf("start chromium: %v", err)
		}
		t.Logf("start chromium (attempt %d): %v", attempt, err)
	}
	t.Cleanup(cancelTab)
	var mu sync.Mutex
	var seen []string
	consoleDone := make(chan struct{})
	messages := chromedp.Console(b.ctx)
	go func() {
		defer close(consoleDone)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() || m.Source == "security" || (m.Type == chromedp.ConsoleError && m.Source != "network") {
				mu.Lock()
				seen = append(seen, m.String())
				mu.Unlock()
			}
		}
	}()
	return b, func() []string {
		cancelTab()
		<-consoleDone
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// browser is one Chromium tab of the test, with the steps' helpers.
type browser struct {
	t     *testing.T
	ctx   context.Context
	dir   string
	shots int
}

// stepTimeout bounds each wait, so that a failure says where it stopped.
const stepTimeout = time.Minute

func (b *browser) fail(err error, what string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	page, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.location.href + "\n" + document.body.innerText`))
	b.shot("failed")
	b.t.Fatalf("%s: %v\npage:\n%s", what, err, page)
}

func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.fail(err, "browser step")
	}
}

// wait waits until an element matching the CSS selector is visible.
func (b *browser) wait(sel string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(sel))); err != nil {
		b.fail(err, "waiting for "+sel)
	}
}

// waitView waits for the rendered view matching the attribute selector (the
// page replaces the view whole once its answer is in).
func (b *browser) waitView(attrs string) {
	b.t.Helper()
	b.wait(`[data-testid=view]` + attrs)
}

func (b *browser) eval(js string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
	if err != nil {
		b.fail(err, "evaluate "+js)
	}
	return v
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		b.fail(err, "text of "+sel)
	}
	return strings.TrimSpace(v)
}

func (b *browser) location() string {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Location())
	if err != nil {
		b.fail(err, "location")
	}
	return v
}

// lanes are the timeline's lanes as call:status:tool.
func (b *browser) lanes() []string {
	b.t.Helper()
	return b.evalStrings(`[...document.querySelectorAll('[data-testid=view] [data-testid=call-lane]')].map(r => r.dataset.call + ':' + r.dataset.status + ':' + r.dataset.tool)`)
}

// bars are the phases a lane shows, as phase=nanoseconds (empty while under
// way).
func (b *browser) bars(call string) []string {
	b.t.Helper()
	return b.evalStrings(`[...document.querySelectorAll('[data-testid=view] [data-testid=call-lane][data-call=` + call + `] [data-testid=bar]')].map(e => e.dataset.phase + '=' + e.dataset.ns)`)
}

func (b *browser) evalStrings(js string) []string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](js))
	if err != nil {
		b.fail(err, "evaluate "+js)
	}
	return v
}

// apiPhases computes a call's phases from the API's entries, as
// docs/audit-api.md defines them: each from the first entry of one kind to
// the first of the next, as phase=nanoseconds.
func apiPhases(t *testing.T, items []apiItem, turn, call string) []string {
	t.Helper()
	at := map[string]time.Time{}
	for _, it := range items {
		var d struct {
			Type        string `json:"type"`
			Phase       string `json:"phase"`
			AgentTurnID string `json:"agent_turn_id"`
			ToolCallID  string `json:"tool_call_id"`
		}
		_ = json.Unmarshal(it.Data, &d)
		var h struct {
			Turn []string `json:"CG-Agent-Turn-Id"`
			Call []string `json:"CG-Tool-Call-Id"`
		}
		require.NoError(t, json.Unmarshal(it.Headers, &h))
		if len(h.Turn) == 0 || len(h.Call) == 0 || h.Turn[0] != turn || h.Call[0] != call {
			continue
		}
		ev := it.Kind
		switch {
		case it.Kind == "card":
			ev = map[string]string{"tool.call": "call", "tool.result": "result"}[d.Type]
		case it.Kind == "wakeup" && d.Phase != "":
			ev = "wakeup_" + d.Phase // not the result's wakeup
		}
		if _, seen := at[ev]; ev != "" && !seen {
			at[ev] = it.Time
		}
	}
	first := func(names ...string) (time.Time, bool) {
		for _, n := range names {
			if v, ok := at[n]; ok {
				return v, true
			}
		}
		return time.Time{}, false
	}
	var out []string
	for _, ph := range []struct {
		name     string
		from, to []string
	}{
		{"dispatch", []string{"call"}, []string{"held", "command"}},
		{"approval", []string{"held"}, []string{"approval"}},
		{"run", []string{"command"}, []string{"result", "report"}},
		{"report", []string{"result"}, []string{"report"}},
		{"wakeup", []string{"report"}, []string{"wakeup", "wakeup_skipped"}},
		{"consume", []string{"wakeup"}, []string{"consumed"}},
	} {
		a, ok := first(ph.from...)
		if !ok {
			continue
		}
		if b, ok := first(ph.to...); ok {
			out = append(out, ph.name+"="+strconv.FormatInt(b.Sub(a).Nanoseconds(), 10))
		} else if ph.name == "run" || ph.name == "report" || ph.name == "wakeup" || (ph.name == "consume" && at["wakeup_skipped"].IsZero()) {
			out = append(out, ph.name+"=")
		}
	}
	return out
}

func seqsOf(items []apiItem) []string {
	var out []string
	for _, it := range items {
		out = append(out, u64(it.Seq))
	}
	return out
}

// rows are the calls list's rows as turn/call:status.
func (b *browser) rows() []string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll('[data-testid=view] [data-testid=call-row]')].map(r => r.dataset.turn + '/' + r.dataset.call + ':' + r.dataset.status)`))
	if err != nil {
		b.fail(err, "call rows")
	}
	return v
}

// shownEntry is an entry as the page shows it.
type shownEntry struct {
	Seq     string `json:"seq"`
	Kind    string `json:"kind"`
	Time    string `json:"time"`
	Subject string `json:"subject"`
	Data    string `json:"data"`
}

// checkEntries compares the entries the page shows with the API's: the same
// sequences in the same order, each with its time (UTC), kind, subject and
// its whole data.
func (b *browser) checkEntries(sel string, want []apiItem) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	got, err := chromedp.Run(ctx, chromedp.Evaluate[[]shownEntry](`[...document.querySelectorAll('[data-testid=view] `+sel+`')].map(e => ({
		seq: e.dataset.seq,
		kind: e.querySelector('[data-testid=entry-kind]').textContent,
		time: e.querySelector('[data-testid=entry-time]').textContent,
		subject: e.querySelector('[data-testid=entry-subject]').textContent,
		data: e.querySelector('[data-testid=entry-data]').textContent,
	}))`))
	if err != nil {
		b.fail(err, "entries")
	}
	require.Len(b.t, got, len(want))
	for i, w := range want {
		g := got[i]
		require.Equal(b.t, u64(w.Seq), g.Seq, "entry %d", i)
		require.Equal(b.t, w.Kind, g.Kind, "seq %d", w.Seq)
		require.Equal(b.t, w.Subject, g.Subject, "seq %d", w.Seq)
		require.Equal(b.t, w.Time.UTC().Format(time.RFC3339Nano), g.Time, "seq %d: the time in UTC", w.Seq)
		require.Equal(b.t, exactJSON(b.t, w.Data), exactJSON(b.t, []byte(g.Data)), "seq %d: the whole data", w.Seq)
	}
}

// shot saves a full-page PNG of the current step.
func (b *browser) shot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	b.shots++
	path := filepath.Join(b.dir, fmt.Sprintf("%02d-%s.png", b.shots, name))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Errorf("screenshot %s: %v", name, err)
		return
	}
	b.t.Logf("screenshot: %s", path)
}

// artifactsDir is $CGLEDGER_ARTIFACTS, or artifacts/auditweb/ at the
// repository's root, created.
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CGLEDGER_ARTIFACTS")
	if dir == "" {
		root, err := os.Getwd()
		require.NoError(t, err)
		for {
			if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
				break
			}
			parent := filepath.Dir(root)
			require.NotEqual(t, parent, root, "no go.mod above the test")
			root = parent
		}
		dir = filepath.Join(root, "artifacts", "auditweb")
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// apiItem is a timeline or story entry as the audit API answers it.
type apiItem struct {
	Seq     uint64          `json:"seq"`
	Time    time.Time       `json:"time"`
	Kind    string          `json:"kind"`
	Subject string          `json:"subject"`
	Headers json.RawMessage `json:"headers"`
	Data    json.RawMessage `json:"data"`
}

type apiEntries struct {
	AsOfSeq uint64    `json:"as_of_seq"`
	Items   []apiItem `json:"items"`
}

func apiTimeline(t *testing.T, c credential, url string) apiEntries {
	t.Helper()
	var e apiEntries
	apiGet(t, c, url, &e)
	require.NotEmpty(t, e.Items, url)
	return e
}

// apiGet reads url with c's JWT and decodes the 200 answer into out.
func apiGet(t *testing.T, c credential, url string, out any) {
	t.Helper()
	resp := httpAs(t, c, "GET", url, "")
	var body bytes.Buffer
	_, err := body.ReadFrom(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", url, body.String())
	require.NoError(t, json.Unmarshal(body.Bytes(), out), url)
}

// exactJSON decodes JSON keeping numbers' digits, for a comparison that
// ignores layout only.
func exactJSON(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v), string(b))
	_, err := dec.Token()
	require.True(t, errors.Is(err, io.EOF), "one JSON value: %s", b)
	return v
}

func u64(n uint64) string { return strconv.FormatUint(n, 10) }
