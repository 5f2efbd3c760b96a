package protocol

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// Header names. The CG-* control headers carry identity on L0 commands and
// reports (seed 003); the rest are the ledger's own.
const (
	HeaderAgentID      = "CG-Agent-Id"
	HeaderAgentTurnID  = "CG-Agent-Turn-Id"
	HeaderTurnEpoch    = "CG-Turn-Epoch"
	HeaderToolCallID   = "CG-Tool-Call-Id"
	HeaderStepID       = "CG-Step-Id"
	HeaderContextBoxID = "CG-Context-Box-Id"
	HeaderTraceparent  = "traceparent"
	HeaderTracestate   = "tracestate"

	// HeaderProjectID and HeaderChannelID route a report request (a command's
	// subject carries them instead).
	HeaderProjectID = "CG-Project-Id"
	HeaderChannelID = "CG-Channel-Id"
	// HeaderSourceID and HeaderSourceFunction name the reporting source; they
	// must equal the result card's author_id and function_name.
	HeaderSourceID       = "CG-Source-Id"
	HeaderSourceFunction = "CG-Source-Function"

	// HeaderEntryKind is set on every entry the ledger writes.
	HeaderEntryKind = "CG-Entry-Kind"
	// HeaderTime is the time the ledger wrote an entry (RFC 3339, UTC, ns).
	HeaderTime = "CG-Time"
	// HeaderMsgID is JetStream's publish dedup id.
	HeaderMsgID = "Nats-Msg-Id"
)

// Identity is the control identity of a command or report, from CG-* headers.
type Identity struct {
	AgentID      string
	AgentTurnID  string
	TurnEpoch    uint64
	ToolCallID   string
	StepID       string
	ContextBoxID string
	Traceparent  string
	Tracestate   string
}

// IdentityRules says which optional headers are required.
type IdentityRules struct {
	RequireToolCallID bool
	RequireStepID     bool
}

// HeaderGet returns a header's first value, matching the name exactly first,
// then case-insensitively, because clients in other languages do not all
// preserve header case.
func HeaderGet(h nats.Header, name string) string {
	v, _ := HeaderValue(h, name)
	return v
}

// HeaderValue looks a header up by exact name first, then case-insensitively.
func HeaderValue(h nats.Header, name string) (string, bool) {
	if h == nil {
		return "", false
	}
	if v, ok := h[name]; ok && len(v) > 0 {
		return v[0], true
	}
	// Most lookups that miss the exact name miss altogether (an optional
	// header not sent): one pass without allocating finds whether more
	// than one case variant matches, and only then are they sorted.
	var match string
	matches := 0
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, name) {
			match = k
			matches++
		}
	}
	switch matches {
	case 0:
		return "", false
	case 1:
		return h[match][0], true
	}
	// Sorted, so a header sent in two case variants resolves the same way
	// every time.
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if v := h[k]; len(v) > 0 && strings.EqualFold(k, name) {
			return v[0], true
		}
	}
	return "", false
}

var traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// ValidTraceparent reports whether s is a W3C traceparent this ledger accepts:
// version-traceid-parentid-flags in lower-case hex, version not ff, and
// neither id all zeros.
func ValidTraceparent(s string) bool {
	if !traceparentRE.MatchString(s) || strings.HasPrefix(s, "ff-") {
		return false
	}
	return s[3:35] != strings.Repeat("0", 32) && s[36:52] != strings.Repeat("0", 16)
}

// ParseEpoch parses a turn epoch: a canonical unsigned decimal (no sign, no
// leading zeros, fits in 64 bits).
func ParseEpoch(s string) (uint64, bool) {
	if s == "" || (len(s) > 1 && s[0] == '0') || s[0] == '+' {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// knownHeaders are the headers the ledger reads or writes; a violation on
// one of them names it as written here, whatever case the client used.
var knownHeaders = []string{
	HeaderAgentID, HeaderAgentTurnID, HeaderTurnEpoch, HeaderToolCallID, HeaderStepID, HeaderContextBoxID,
	HeaderTraceparent, HeaderTracestate, HeaderProjectID, HeaderChannelID, HeaderSourceID, HeaderSourceFunction,
	HeaderEntryKind, HeaderTime, HeaderActor,
}

// canonicalHeader returns the known header name k matches as headerValue
// matches it (strings.EqualFold), else k itself.
func canonicalHeader(k string) string {
	for _, n := range knownHeaders {
		if strings.EqualFold(k, n) {
			return n
		}
	}
	return k
}

// singleValued reports whether a header may be sent only once: every CG-*
// header, because a second value would make the identity ambiguous, and
// traceparent, which W3C Trace Context forbids repeating.
func singleValued(lower string) bool {
	return strings.HasPrefix(lower, "cg-") || lower == strings.ToLower(HeaderTraceparent)
}

// CheckHeaders validates a request's header block as a whole: every name and
// value is UTF-8, no single-valued header is sent twice (in any case
// variants of its name, since names are matched case-insensitively), and
// the block fits in MaxHeaderBytes. It returns the violations and the
// lower-cased names of the headers they name, so that per-header checks
// skip those rather than pile more violations on the same header.
func CheckHeaders(h nats.Header) (Violations, map[string]bool) {
	if headersClean(h) {
		// Nothing to refuse: the common case, without the maps and the
		// sort that name violations in a stable order.
		return nil, noBadHeaders
	}
	return checkHeadersFull(h)
}

// checkHeadersFull is CheckHeaders' walk of every header.
func checkHeadersFull(h nats.Header) (Violations, map[string]bool) {
	var vs Violations
	bad := map[string]bool{}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	// Sorted, so violations come in the same order every time.
	sort.Strings(keys)
	type group struct {
		name    string
		values  int
		badUTF8 bool
	}
	groups := map[string]*group{}
	var order []string
	size := 0
	for _, k := range keys {
		for _, v := range h[k] {
			size += len(k) + len(v) + 4
		}
		if !utf8.ValidString(k) {
			vs.Add("header", VInvalidUTF8, "header name %q is not valid UTF-8", k)
			continue
		}
		canon := canonicalHeader(k)
		lower := strings.ToLower(canon)
		g := groups[lower]
		if g == nil {
			g = &group{name: canon}
			groups[lower] = g
			order = append(order, lower)
		}
		g.values += len(h[k])
		for _, v := range h[k] {
			if !utf8.ValidString(v) {
				g.badUTF8 = true
			}
		}
	}
	for _, lower := range order {
		g := groups[lower]
		field := "header." + g.name
		if g.badUTF8 {
			vs.Add(field, VInvalidUTF8, "header value is not valid UTF-8")
			bad[lower] = true
		}
		if g.values > 1 && singleValued(lower) {
			vs.Add(field, VDuplicate, "header is sent %d times (names match case-insensitively); send it once", g.values)
			bad[lower] = true
		}
	}
	if size > MaxHeaderBytes {
		vs.Add("header", VTooLarge, "headers are %d bytes (name, value and 4 bytes per value); the limit is %d", size, MaxHeaderBytes)
	}
	return vs, bad
}

// noBadHeaders is CheckHeaders' answer for a block with no violation;
// callers only read it.
var noBadHeaders = map[string]bool{}

// headersClean reports, without allocating, whether CheckHeaders would find
// nothing: every name ASCII and every value UTF-8, no single-valued header sent twice
// in any case variants, and the block within MaxHeaderBytes. Any doubt
// leaves the verdict to CheckHeaders' full walk.
func headersClean(h nats.Header) bool {
	size := 0
	for k, vals := range h {
		// Names outside ASCII, where strings.EqualFold and the full walk's
		// strings.ToLower grouping can differ, take the full walk.
		for i := 0; i < len(k); i++ {
			if k[i] >= utf8.RuneSelf {
				return false
			}
		}
		for _, v := range vals {
			size += len(k) + len(v) + 4
			if !utf8.ValidString(v) {
				return false
			}
		}
		single := len(k) >= 3 && strings.EqualFold(k[:3], "cg-") || strings.EqualFold(k, HeaderTraceparent)
		if !single {
			continue
		}
		if len(vals) > 1 {
			return false
		}
		for k2 := range h {
			if k2 != k && strings.EqualFold(k2, k) {
				return false
			}
		}
	}
	return size <= MaxHeaderBytes
}

// ParseIdentity reads the identity headers, collecting every violation. It
// also checks the header block as a whole (UTF-8, repeated CG-* headers,
// size; see checkHeaders).
func ParseIdentity(h nats.Header, rules IdentityRules) (Identity, Violations) {
	id, vs, _ := ParseIdentityHeaders(h, rules)
	return id, vs
}

// ParseIdentityHeaders is ParseIdentity that also returns the lower-cased names of
// headers already refused by checkHeaders, for callers reading more headers.
func ParseIdentityHeaders(h nats.Header, rules IdentityRules) (Identity, Violations, map[string]bool) {
	vs, bad := CheckHeaders(h)
	var id Identity
	skip := func(name string) bool { return len(bad) > 0 && bad[strings.ToLower(name)] }
	get := func(name string, required bool) string {
		if skip(name) {
			return ""
		}
		v, ok := HeaderValue(h, name)
		if ok && v != "" && ValidIdentifier(v) {
			return v
		}
		// The field name is built only for a violation.
		field := "header." + name
		switch {
		case !ok:
			if required {
				vs.Add(field, VRequired, "header is required")
			}
		case v == "":
			vs.Add(field, VEmpty, "header must not be empty")
		default:
			CheckIdent(&vs, field, v, required)
		}
		return ""
	}
	id.AgentID = get(HeaderAgentID, true)
	id.AgentTurnID = get(HeaderAgentTurnID, true)
	if skip(HeaderTurnEpoch) {
		// Already refused as a whole.
	} else if v, ok := HeaderValue(h, HeaderTurnEpoch); !ok {
		vs.Add("header."+HeaderTurnEpoch, VRequired, "header is required")
	} else if v == "" {
		vs.Add("header."+HeaderTurnEpoch, VEmpty, "header must not be empty")
	} else if n, ok := ParseEpoch(v); !ok {
		vs.Add("header."+HeaderTurnEpoch, VInvalidValue, "must be an unsigned decimal integer without sign or leading zeros (got %q)", Clip(v))
	} else {
		id.TurnEpoch = n
	}
	id.ToolCallID = get(HeaderToolCallID, rules.RequireToolCallID)
	id.StepID = get(HeaderStepID, rules.RequireStepID)
	id.ContextBoxID = get(HeaderContextBoxID, false)
	if v, ok := HeaderValue(h, HeaderTraceparent); ok && !skip(HeaderTraceparent) {
		if ValidTraceparent(v) {
			id.Traceparent = v
		} else {
			vs.Add("header."+HeaderTraceparent, VInvalidValue, "must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, ids not all zero), got %q", Clip(v))
		}
	}
	if v, ok := HeaderValue(h, HeaderTracestate); ok && !skip(HeaderTracestate) {
		if len(v) > 512 {
			vs.Add("header."+HeaderTracestate, VTooLarge, "must be at most 512 bytes")
		} else {
			id.Tracestate = v
		}
	}
	return id, vs, bad
}

// Apply writes the identity into h under the canonical header names,
// omitting empty optional values.
func (id Identity) Apply(h nats.Header) {
	set := func(k, v string) {
		if v != "" {
			h.Set(k, v)
		}
	}
	set(HeaderAgentID, id.AgentID)
	set(HeaderAgentTurnID, id.AgentTurnID)
	h.Set(HeaderTurnEpoch, strconv.FormatUint(id.TurnEpoch, 10))
	set(HeaderToolCallID, id.ToolCallID)
	set(HeaderStepID, id.StepID)
	set(HeaderContextBoxID, id.ContextBoxID)
	set(HeaderTraceparent, id.Traceparent)
	set(HeaderTracestate, id.Tracestate)
}

// Header returns a new header holding the identity.
func (id Identity) Header() nats.Header {
	h := nats.Header{}
	id.Apply(h)
	return h
}

// FormatTime renders an entry time as the CG-Time header does: RFC 3339 in
// UTC with nanoseconds.
func FormatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// EntryTime returns an entry's time from its CG-Time header, and false when
// it has none (entries published on cg.> by others than the ledger). Views
// use it rather than the stream's timestamp so that replaying the same
// entries into a fresh stream gives the same views.
func EntryTime(h nats.Header) (time.Time, bool) {
	if v := HeaderGet(h, HeaderTime); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return t.UTC(), true
		}
	}
	return time.Time{}, false
}
