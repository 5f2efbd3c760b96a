// The JSON bodies of cgledger's HTTP APIs: results as
// application/json, and errors as RFC 9457 problem details
// (application/problem+json, package problem) with the status that matches
// the protocol code. It also holds what every HTTP list shares (the limit
// parameter) and what every router answers for a request no route serves
// (404, or 405 with Allow).

package httpapi

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// Write sends v as JSON with status.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// Status is the HTTP status of a protocol code: bad_request -> 400,
// forbidden -> 403, not_found -> 404, anything else 500.
func Status(code protocol.Code) int {
	switch code {
	case protocol.CodeBadRequest:
		return http.StatusBadRequest
	case protocol.CodeForbidden:
		// A tool definition naming another project than its URL's.
		return http.StatusForbidden
	case protocol.CodeNotFound:
		return http.StatusNotFound
	}
	return http.StatusInternalServerError
}

// Problem is the problem details body of err: a *protocol.Error keeps its
// code, message, violations and rejection sequence; anything else is
// internal (500).
func Problem(err error) *problem.Details {
	e, ok := protocol.AsError(err)
	if !ok {
		e = &protocol.Error{Code: protocol.CodeInternal, Message: err.Error()}
	}
	var vs []problem.Violation
	for _, v := range e.Violations {
		vs = append(vs, problem.Violation{Field: v.Field, Code: v.Code, Message: v.Message})
	}
	return problem.New(Status(e.Code), string(e.Code), e.Message, vs).WithRejection(e.Seq)
}

// Error sends err as problem details (see Problem).
func Error(w http.ResponseWriter, err error) {
	problem.Write(w, Problem(err))
}

// List paging: every list endpoint takes limit (absent or 0 means
// DefaultLimit, above MaxLimit is a 400) and cursor, and answers items and
// next_cursor (absent on the last page).
const (
	DefaultLimit = projector.DefaultLimit
	MaxLimit     = projector.MaxLimit
)

// Limit reads the limit query parameter, adding a violation to vs when it
// is not an unsigned integer or above MaxLimit. It returns the limit to
// use: DefaultLimit when absent or 0.
func Limit(r *http.Request, vs *protocol.Violations) int {
	s := r.URL.Query().Get("limit")
	if s == "" {
		return DefaultLimit
	}
	n, err := strconv.ParseUint(s, 10, 64)
	switch {
	case err != nil:
		vs.Add("limit", protocol.VInvalidValue, "must be an unsigned integer, got %q", s)
		return DefaultLimit
	case n > MaxLimit:
		vs.Add("limit", protocol.VInvalidValue, "must be at most %d", MaxLimit)
		return MaxLimit
	case n == 0:
		return DefaultLimit
	}
	return int(n)
}

// NoRoute answers a request no route serves: 405 method_not_allowed with an
// Allow header when allow (the methods the path is served for) is not
// empty, else 404 not_found.
func NoRoute(w http.ResponseWriter, r *http.Request, allow []string) {
	allow = normalizeMethods(allow)
	if len(allow) > 0 {
		w.Header().Set("Allow", joinMethods(allow))
		problem.Write(w, problem.New(http.StatusMethodNotAllowed, problem.CodeMethodNotAllowed,
			r.Method+" is not served for "+r.URL.Path+": use "+joinMethods(allow), nil))
		return
	}
	problem.Write(w, problem.New(http.StatusNotFound, string(protocol.CodeNotFound), "no such endpoint: "+r.Method+" "+r.URL.Path, nil))
}

// probeMethods are the methods AllowedMethods tries.
var probeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// AllowedMethods returns the methods mux has a route for at r's path,
// ignoring the patterns in ignore (a router's own catch-all).
func AllowedMethods(mux *http.ServeMux, r *http.Request, ignore ...string) []string {
	var out []string
	for _, m := range probeMethods {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "" && !slices.Contains(ignore, pattern) {
			out = append(out, m)
		}
	}
	return normalizeMethods(out)
}

// Fallback is the catch-all of a router: it answers NoRoute with the
// methods mux serves at the request's path (its own pattern ignored).
func Fallback(mux *http.ServeMux, pattern string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		NoRoute(w, r, AllowedMethods(mux, r, pattern))
	}
}

// normalizeMethods dedups, adds HEAD where GET is (a GET route answers HEAD)
// and orders methods as probeMethods does.
func normalizeMethods(ms []string) []string {
	if len(ms) == 0 {
		return nil
	}
	set := map[string]bool{}
	for _, m := range ms {
		set[m] = true
	}
	if set[http.MethodGet] {
		set[http.MethodHead] = true
	}
	var out []string
	for _, m := range probeMethods {
		if set[m] {
			out = append(out, m)
			delete(set, m)
		}
	}
	for m := range set {
		out = append(out, m)
	}
	slices.Sort(out[len(out)-len(set):])
	return out
}

func joinMethods(ms []string) string { return strings.Join(ms, ", ") }

// SingleValued refuses a query that repeats a parameter: which of the
// values would count is a guess, and a client that sent two meant
// something the API does not do.
func SingleValued(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var vs protocol.Violations
		q := r.URL.Query()
		names := make([]string, 0, len(q))
		for name := range q {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			if n := len(q[name]); n > 1 {
				vs.Add(name, protocol.VInvalidValue, "given %d times: give it once", n)
			}
		}
		if len(vs) > 0 {
			Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid query", Violations: vs})
			return
		}
		next(w, r)
	}
}
