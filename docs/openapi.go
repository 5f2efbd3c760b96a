// Package docs carries the HTTP API's OpenAPI 3.1 document (openapi.json,
// written by docs/internal/openapigen: go generate ./docs; never edit it by
// hand); httpapi serves it at GET /v1/openapi.json.
package docs

//go:generate go run ./internal/openapigen openapi.json

import (
	_ "embed"
	"encoding/json"
	"strings"
	"sync"
)

// OpenAPI is the document (openapi.json).
//
//go:embed openapi.json
var OpenAPI []byte

// OpenAPIPath is where the document is served.
const OpenAPIPath = "/v1/openapi.json"

// Methods returns the methods the document lists for a concrete path
// (escaped, as the router splits it): a template segment {name} matches any
// one non-empty segment.
func Methods(escapedPath string) []string {
	segs := strings.Split(escapedPath, "/")
	var out []string
	for _, op := range operations() {
		if matchTemplate(op.tmpl, segs) {
			out = append(out, op.method)
		}
	}
	return out
}

type documented struct {
	method string
	tmpl   []string
}

var parsed struct {
	once sync.Once
	ops  []documented
}

// operations are the document's (method, path template) pairs.
func operations() []documented {
	parsed.once.Do(func() {
		var doc struct {
			Paths map[string]map[string]json.RawMessage `json:"paths"`
		}
		if err := json.Unmarshal(OpenAPI, &doc); err != nil {
			// The document is embedded and checked by its tests.
			panic("docs: openapi.json does not decode: " + err.Error())
		}
		for path, item := range doc.Paths {
			for m := range item {
				switch m {
				case "get", "put", "post", "delete", "options", "head", "patch", "trace":
					parsed.ops = append(parsed.ops, documented{method: strings.ToUpper(m), tmpl: strings.Split(path, "/")})
				}
			}
		}
	})
	return parsed.ops
}

func matchTemplate(tmpl, segs []string) bool {
	if len(tmpl) != len(segs) {
		return false
	}
	for i, t := range tmpl {
		if strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}") {
			if segs[i] == "" {
				return false
			}
			continue
		}
		if t != segs[i] {
			return false
		}
	}
	return true
}
