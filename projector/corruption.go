package projector

import (
	"strings"

	"github.com/cockroachdb/pebble/v2"
)

// corruptionError is a corruption Pebble found, read as the message of
// what it found: Pebble joins a carrier of its details to that error, whose
// text ("\n<corruption detail carrier>") would otherwise end every message,
// logs and refusal reasons among them.
type corruptionError struct{ err error }

func (e corruptionError) Error() string {
	msg, _, _ := strings.Cut(e.err.Error(), "\n")
	return msg
}

func (e corruptionError) Unwrap() error { return e.err }

// oneLine returns a corruption error as a corruptionError, any other error
// as it is.
func oneLine(err error) error {
	if pebble.IsCorruptionError(err) {
		return corruptionError{err}
	}
	return err
}
