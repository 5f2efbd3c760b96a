package projector

import (
	"encoding/binary"
	"errors"
	"sort"
	"time"
)

// encodeEntry is the e\0<seq> row's binary form (docs/views.md): kind,
// subject, time (Unix ns, 0 for none), headers sorted by name, data. Each
// string or byte field is a uvarint length then the bytes.
func encodeEntry(e storedEntry) []byte {
	b := make([]byte, 0, 64+len(e.Subject)+len(e.Data)+32*len(e.Headers))
	put := func(s []byte) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	put([]byte(e.Kind))
	put([]byte(e.Subject))
	var ns int64
	if !e.Time.IsZero() {
		ns = e.Time.UnixNano()
	}
	b = binary.AppendVarint(b, ns)
	names := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		put([]byte(k))
		vals := e.Headers[k]
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			put([]byte(v))
		}
	}
	put(e.Data)
	return b
}

var errBadEntryRow = errors.New("malformed entry row")

func decodeEntry(b []byte) (storedEntry, error) {
	var e storedEntry
	next := func() ([]byte, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return nil, errBadEntryRow
		}
		v := b[k : k+int(n)]
		b = b[k+int(n):]
		return v, nil
	}
	kind, err := next()
	if err != nil {
		return e, err
	}
	subject, err := next()
	if err != nil {
		return e, err
	}
	e.Kind, e.Subject = string(kind), string(subject)
	ns, k := binary.Varint(b)
	if k <= 0 {
		return e, errBadEntryRow
	}
	b = b[k:]
	if ns != 0 {
		e.Time = time.Unix(0, ns).UTC()
	}
	nh, k := binary.Uvarint(b)
	if k <= 0 {
		return e, errBadEntryRow
	}
	b = b[k:]
	if nh > 0 {
		e.Headers = make(map[string][]string, nh)
	}
	for range nh {
		name, err := next()
		if err != nil {
			return e, err
		}
		nv, k := binary.Uvarint(b)
		if k <= 0 {
			return e, errBadEntryRow
		}
		b = b[k:]
		vals := make([]string, 0, nv)
		for range nv {
			v, err := next()
			if err != nil {
				return e, err
			}
			vals = append(vals, string(v))
		}
		e.Headers[string(name)] = vals
	}
	data, err := next()
	if err != nil {
		return e, err
	}
	e.Data = append([]byte(nil), data...)
	return e, nil
}
