package snapshot

import (
	"fmt"
	"strings"
)

// Refusal is one snapshot Restore did not use, and why.
type Refusal struct {
	// Name is the snapshot's name.
	Name string `json:"name"`
	// Reason says which check failed.
	Reason string `json:"reason"`
}

// RefusedError is returned by Restore when no snapshot passed: it lists each
// refused snapshot and matches ErrNoSnapshot with errors.Is.
type RefusedError struct {
	// Refused are the snapshots tried, newest first.
	Refused []Refusal
}

// Error implements error.
func (e *RefusedError) Error() string {
	parts := make([]string, len(e.Refused))
	for i, r := range e.Refused {
		parts[i] = fmt.Sprintf("%s: %s", r.Name, r.Reason)
	}
	return fmt.Sprintf("%s: %d refused: %s", ErrNoSnapshot.Error(), len(e.Refused), strings.Join(parts, "; "))
}

// Unwrap makes errors.Is(err, ErrNoSnapshot) hold.
func (e *RefusedError) Unwrap() error { return ErrNoSnapshot }
