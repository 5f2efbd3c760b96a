package protocol

import (
	"strings"
	"testing"
)

func TestRedriveCallIDs(t *testing.T) {
	for _, c := range []struct {
		id, next, from string
		reserved       bool
	}{
		{"call-1", "call-1~r1", "", false},
		{"call-1~r1", "call-1~r2", "call-1", true},
		{"call-1~r2", "call-1~r3", "call-1~r1", true},
		{"a~r9~r1", "a~r9~r2", "a~r9", true},
		{"x~r01", "x~r01~r1", "", false},
		{"x~r", "x~r~r1", "", false},
		{"~r1", "~r1~r1", "", false},
		{"x~r1a", "x~r1a~r1", "", false},
	} {
		next, ok := RedriveCallID(c.id)
		if !ok || next != c.next {
			t.Errorf("RedriveCallID(%q) = %q, %v; want %q", c.id, next, ok, c.next)
		}
		from, ok := RedrivenFrom(c.id)
		if from != c.from || ok != (c.from != "") {
			t.Errorf("RedrivenFrom(%q) = %q, %v; want %q", c.id, from, ok, c.from)
		}
		if got := ReservedCallID(c.id); got != c.reserved {
			t.Errorf("ReservedCallID(%q) = %v", c.id, got)
		}
	}
	if _, ok := RedriveCallID(strings.Repeat("x", MaxIdentifierLen)); ok {
		t.Error("a derived id past MaxIdentifierLen was accepted")
	}
	if IdempotencyKey("p", "t", "c~r2") != IdempotencyKey("p", "t", "c") || IdempotencyKey("p", "t", "c~r2") == IdempotencyKey("p", "t", "c2") {
		t.Error("a derived call must share its root's idempotency key, and only its root's")
	}
}

func TestParseRedriveRequestListsEveryViolation(t *testing.T) {
	_, vs := ParseRedriveRequest([]byte(`{"project_id":"p.x","tool_call_id":"c","reason":"","extra":1}`))
	got := map[string]bool{}
	for _, v := range vs {
		got[v.Field] = true
	}
	for _, f := range []string{"body.project_id", "body.agent_turn_id", "body.reason", "body.extra"} {
		if !got[f] {
			t.Errorf("no violation on %s: %v", f, vs)
		}
	}
}
