package protocol

import (
	"encoding/base64"
	"encoding/json"
	"sort"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// NewRejectedRequest captures a request as received for a rejection entry,
// in a form that is always valid JSON and valid UTF-8 (see RejectedRequest).
func NewRejectedRequest(subject string, h nats.Header, data []byte) RejectedRequest {
	rr := RejectedRequest{Subject: subject}
	rr.Headers, rr.HeadersBase64, rr.Truncated = rejectedHeaders(h)
	valid := utf8.Valid(data)
	if len(data) > MaxRejectedData {
		cut := MaxRejectedData
		if valid {
			// Cut on a character boundary, so a valid body stays valid.
			for cut > 0 && !utf8.RuneStart(data[cut]) {
				cut--
			}
		}
		data, rr.Truncated = data[:cut], true
	}
	switch {
	case len(data) == 0:
	case !valid:
		rr.DataBase64 = base64.StdEncoding.EncodeToString(data)
	case !rr.Truncated && json.Valid(data):
		rr.Data = CompactJSON(data)
	default:
		b, _ := json.Marshal(string(data))
		rr.Data = b
	}
	return rr
}

// serverAddedHeader is the header nats-server adds to a request that
// crosses accounts (the client credentials' accounts import the API): the
// requester's account and a round-trip time that differs every time. The
// client never sent it, so a rejection entry leaves it out.
const serverAddedHeader = "Nats-Request-Info"

// rejectedHeaders splits h into headers that are valid UTF-8 and the others,
// base64-encoded, keeping at most MaxRejectedHeaders bytes (names in sorted
// order); truncated says when some were left out.
func rejectedHeaders(h nats.Header) (plain, encoded map[string][]string, truncated bool) {
	keys := make([]string, 0, len(h))
	for k := range h {
		if k != serverAddedHeader {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	size := 0
	for _, k := range keys {
		n := 0
		for _, v := range h[k] {
			n += len(k) + len(v) + 4
		}
		if size+n > MaxRejectedHeaders {
			truncated = true
			continue
		}
		size += n
		ok := utf8.ValidString(k)
		for _, v := range h[k] {
			ok = ok && utf8.ValidString(v)
		}
		if ok {
			if plain == nil {
				plain = map[string][]string{}
			}
			plain[k] = append([]string(nil), h[k]...)
			continue
		}
		if encoded == nil {
			encoded = map[string][]string{}
		}
		vals := make([]string, len(h[k]))
		for i, v := range h[k] {
			vals[i] = base64.StdEncoding.EncodeToString([]byte(v))
		}
		encoded[base64.StdEncoding.EncodeToString([]byte(k))] = vals
	}
	return plain, encoded, truncated
}
