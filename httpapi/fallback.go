package httpapi

import (
	"net/http"

	"github.com/cgledger/cgledger/docs"
	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/protocol"
)

// serveOpenAPI answers the document. It holds no data, so it is open (no
// credential; Policy).
func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(docs.OpenAPI)
}

// fallback is the catch-all of serve's top-level router (mounted at "/"): it
// answers GET /v1/openapi.json (when no audit API is mounted at /v1/, which
// serves it too) and, for any other request no route of mux serves, 405
// with Allow when mux or the document serves the path with other methods,
// else 404, as problem details.
func fallback(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == docs.OpenAPIPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			serveOpenAPI(w, r)
			return
		}
		allow := append(AllowedMethods(mux, r, "/"), docs.Methods(r.URL.EscapedPath())...)
		if r.URL.Path == docs.OpenAPIPath {
			allow = append(allow, http.MethodGet)
		}
		noRouteDocumented(w, r, allow)
	})
}

// noRouteDocumented answers a request no route serves (NoRoute), except a
// request whose method the document lists for its path: that route is not
// served by this process (its role is not running here), so it is 404.
func noRouteDocumented(w http.ResponseWriter, r *http.Request, allow []string) {
	for _, m := range allow {
		if m == r.Method || m == http.MethodGet && r.Method == http.MethodHead {
			msg := r.Method + " " + r.URL.Path + " is not served by this process: the role that serves it (serve --roles) is not running here"
			// The violation tells a client this apart from "nothing found"
			// (verify must not read it as a ledger without the entry).
			problem.Write(w, problem.New(http.StatusNotFound, "not_found", msg,
				[]problem.Violation{{Field: "path", Code: protocol.VNotServed, Message: msg}}))
			return
		}
	}
	NoRoute(w, r, allow)
}
