// Package httpjson writes the JSON bodies of cgledger's HTTP APIs: results,
// and errors as {"error": {"code", "message", "violations"}} with the status
// that matches the protocol code.
package httpjson

import (
	"encoding/json"
	"net/http"

	"github.com/cgledger/cgledger/ledger"
)

// Write sends v as JSON with status.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// Error sends err: a *ledger.Error keeps its code (bad_request -> 400,
// not_found -> 404), anything else is internal (500).
func Error(w http.ResponseWriter, err error) {
	e, ok := ledger.AsError(err)
	if !ok {
		e = &ledger.Error{Code: ledger.CodeInternal, Message: err.Error()}
	}
	status := http.StatusInternalServerError
	switch e.Code {
	case ledger.CodeBadRequest:
		status = http.StatusBadRequest
	case ledger.CodeNotFound:
		status = http.StatusNotFound
	}
	Write(w, status, map[string]*ledger.Error{"error": e})
}
