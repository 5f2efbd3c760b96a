// Package auditweb is the audit web page that `cgledger serve` mounts under
// /ui/: a view of the projector's audit API (/v1) for auditors who would
// rather click than curl. It exists so that a person can scan a turn as lanes
// of phases on a time axis, follow a call and its rejections, see a project's
// overview, watch new entries arrive, look at the views as of an earlier
// sequence and check the hash chain without writing a client, and so that an
// approver can approve or deny a held call after seeing its exact arguments,
// while the API stays the only way in: the page is static files (hand-written
// HTML, JavaScript and CSS embedded in the binary, nothing fetched from
// elsewhere) that hold no data. Every piece of data it shows comes from /v1
// requests that carry the user's bearer token and are checked like any other,
// and its only writes are the approvals endpoints' approve and deny
// (docs/audit-api.md, "Audit web page").
package auditweb

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"

	"github.com/cgledger/cgledger/httpapi/problem"
)

//go:embed assets
var assets embed.FS

// ContentSecurityPolicy is sent with every asset: the page runs only its own
// script and style files (no inline code, no other origin), talks only to
// its own server, cannot be framed, and lets no code write HTML from strings
// (Trusted Types with no policy: an assignment to innerHTML throws).
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; font-src 'none'; object-src 'none'; base-uri 'none'; form-action 'none'; " +
	"frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types 'none'"

// Handler serves the page's files from the root ("/" is index.html); mount it
// with http.StripPrefix("/ui", Handler()). Every response carries
// ContentSecurityPolicy, X-Content-Type-Options: nosniff, no referrer and no
// caching without revalidation.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the directory is embedded at build time
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		name := strings.TrimPrefix(path.Clean("/"+r.URL.Path), "/")
		if name == "" {
			name = "index.html"
		}
		if _, err := fs.Stat(sub, name); err != nil {
			// Answered like every other path no route serves.
			problem.Write(w, problem.New(http.StatusNotFound, "not_found", "no such file of the audit web page: /ui/"+name, nil))
			return
		}
		files.ServeHTTP(w, r)
	})
}
