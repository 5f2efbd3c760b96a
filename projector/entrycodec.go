package projector

import (
	"encoding/binary"
	"errors"
	"sort"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// encodeEntry is the e\0<seq> row's binary form (docs/views.md): kind,
// subject, time (Unix ns, 0 for none), headers sorted by name, data. Each
// string or byte field is a uvarint length then the bytes.
//
// Only the headers the chain covers (protocol.IsChainedHeader) are written: the
// caller passes the entry's canonical headers as they are, and no filtered
// copy is made per entry.
func encodeEntry(e storedEntry) []byte {
	var namesBuf [24]string
	names := namesBuf[:0]
	size := 3*binary.MaxVarintLen64 + len(e.Kind) + len(e.Subject) + len(e.Data)
	for k, vals := range e.Headers {
		if !protocol.IsChainedHeader(k) {
			continue
		}
		names = append(names, k)
		size += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vals {
			size += binary.MaxVarintLen64 + len(v)
		}
	}
	sort.Strings(names)
	b := make([]byte, 0, size+binary.MaxVarintLen64)
	b = binary.AppendUvarint(b, uint64(len(e.Kind)))
	b = append(b, e.Kind...)
	b = binary.AppendUvarint(b, uint64(len(e.Subject)))
	b = append(b, e.Subject...)
	var ns int64
	if !e.Time.IsZero() {
		ns = e.Time.UnixNano()
	}
	b = binary.AppendVarint(b, ns)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		vals := e.Headers[k]
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(e.Data)))
	return append(b, e.Data...)
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

// appendCardRow encodes a card row: the card entry's time (Unix ns as
// 8 bytes, 0 for none), then the entry's data byte for byte. The time is
// here so that a card query reads nothing but card rows.
func appendCardRow(b []byte, t time.Time, data []byte) []byte {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	return append(binary.BigEndian.AppendUint64(b, uint64(ns)), data...)
}

// decodeCardRow splits a card row into the entry's time and the card JSON
// (which aliases row).
func decodeCardRow(row []byte) (time.Time, []byte, error) {
	if len(row) < 8 {
		return time.Time{}, nil, errBadCardRow
	}
	var t time.Time
	if ns := int64(binary.BigEndian.Uint64(row)); ns != 0 {
		t = time.Unix(0, ns).UTC()
	}
	return t, row[8:], nil
}

var errBadCardRow = errors.New("malformed card row")
