package ledger

import (
	"regexp"
	"sort"
	"strconv"
	"strings"

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
	v, _ := headerValue(h, name)
	return v
}

// headerValue looks a header up by exact name first, then case-insensitively.
func headerValue(h nats.Header, name string) (string, bool) {
	if h == nil {
		return "", false
	}
	if v, ok := h[name]; ok && len(v) > 0 {
		return v[0], true
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

// ParseIdentity reads the identity headers, collecting every violation.
func ParseIdentity(h nats.Header, rules IdentityRules) (Identity, Violations) {
	var vs Violations
	var id Identity
	get := func(name string, required bool) string {
		v, ok := headerValue(h, name)
		field := "header." + name
		if !ok {
			if required {
				vs.Add(field, VRequired, "header is required")
			}
			return ""
		}
		if v == "" {
			vs.Add(field, VEmpty, "header must not be empty")
			return ""
		}
		if !ValidIdentifier(v) {
			checkIdent(&vs, field, v, required)
			return ""
		}
		return v
	}
	id.AgentID = get(HeaderAgentID, true)
	id.AgentTurnID = get(HeaderAgentTurnID, true)
	if v, ok := headerValue(h, HeaderTurnEpoch); !ok {
		vs.Add("header."+HeaderTurnEpoch, VRequired, "header is required")
	} else if v == "" {
		vs.Add("header."+HeaderTurnEpoch, VEmpty, "header must not be empty")
	} else if n, ok := ParseEpoch(v); !ok {
		vs.Add("header."+HeaderTurnEpoch, VInvalidValue, "must be an unsigned decimal integer without sign or leading zeros (got %q)", clip(v))
	} else {
		id.TurnEpoch = n
	}
	id.ToolCallID = get(HeaderToolCallID, rules.RequireToolCallID)
	id.StepID = get(HeaderStepID, rules.RequireStepID)
	id.ContextBoxID = get(HeaderContextBoxID, false)
	if v, ok := headerValue(h, HeaderTraceparent); ok {
		if ValidTraceparent(v) {
			id.Traceparent = v
		} else {
			vs.Add("header."+HeaderTraceparent, VInvalidValue, "must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, ids not all zero), got %q", clip(v))
		}
	}
	if v, ok := headerValue(h, HeaderTracestate); ok {
		if len(v) > 512 {
			vs.Add("header."+HeaderTracestate, VTooLarge, "must be at most 512 bytes")
		} else {
			id.Tracestate = v
		}
	}
	return id, vs
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
