package protocol

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// SkipRecord is a skip entry found in the stream.
type SkipRecord struct {
	SkipEntry
	// SkipSeq is the skip entry's own sequence.
	SkipSeq uint64 `json:"skip_seq"`
	// Time is the skip entry's CG-Time (zero when it has none).
	Time time.Time `json:"time"`
}

// ParseSkip reads the stream message at msgSeq as a skip of seq. It is valid
// when it is a skip entry (RecognizeEntry), on seq's skip subject, after seq,
// and its data names seq with a non-empty reason. Anything else is not a
// skip of seq, so a stray publish can neither skip an entry nor stop
// another skip from working.
func ParseSkip(msgSeq uint64, subject string, h nats.Header, data []byte, seq uint64) (SkipRecord, bool) {
	if msgSeq <= seq || RecognizeEntry(subject, h).Kind != string(KindSkip) {
		return SkipRecord{}, false
	}
	sub, err := ParseSubject(subject)
	if err != nil || sub.Seq != seq {
		return SkipRecord{}, false
	}
	var e SkipEntry
	if err := json.Unmarshal(data, &e); err != nil || e.Seq != seq || strings.TrimSpace(e.Reason) == "" {
		return SkipRecord{}, false
	}
	t, _ := EntryTime(h)
	return SkipRecord{SkipEntry: e, SkipSeq: msgSeq, Time: t}, true
}
