package projector

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/cgledger/cgledger/protocol"
)

// ToolsPage answers one page of the tools registered in a project, each at
// its version in force as of the query, by name (Tools answers them all).
// The cursor names the last tool of the previous page.
func (q *Queries) ToolsPage(project string, at AsOf, cursor string, limit int) (*Page[ToolVersion], error) {
	if err := checkIDs("project_id", project); err != nil {
		return nil, err
	}
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()
	limit = clampLimit(limit)
	p := key(tagTool, project).prefix()
	lower, err := toolsLower(p, cursor)
	if err != nil {
		return nil, err
	}
	out := &Page[ToolVersion]{AsOfSeq: v.seq, Items: []ToolVersion{}}
	var name, lastName []byte
	var cur *ToolVersion
	err = scan(v.snap, p, lower, func(k, val []byte) (bool, error) {
		if len(k) < len(p)+9 {
			return false, fmt.Errorf("malformed tool row %q", k)
		}
		n, seq := k[len(p):len(k)-9], trailingU64(k)
		if !bytes.Equal(n, name) {
			if cur != nil {
				out.Items = append(out.Items, *cur)
				lastName = append(lastName[:0], name...)
				cur = nil
			}
			name = append(name[:0], n...)
			// A tool's first version decides whether it exists as of the
			// query: versions are in sequence order.
			if seq <= v.seq && len(out.Items) == limit {
				out.NextCursor = base64.RawURLEncoding.EncodeToString(key(tagTool, project, string(lastName)))
				return false, nil
			}
		}
		if seq <= v.seq {
			cur = &ToolVersion{Seq: seq, Definition: append(json.RawMessage(nil), val...)}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: tools: %w", err)
	}
	if cur != nil {
		out.Items = append(out.Items, *cur)
	}
	return out, nil
}

// ToolsCursor checks cursors of a project's tools.
func ToolsCursor(project string) CursorCheck {
	return func(c string) error { _, err := toolsLower(key(tagTool, project).prefix(), c); return err }
}

// toolsLower is where the page after cursor starts (the cursor names the
// last tool of the page before: key prefix p, then its name).
func toolsLower(p []byte, cursor string) ([]byte, error) {
	if cursor == "" {
		return nil, nil
	}
	k, err := cursorEncoding.DecodeString(cursor)
	if err != nil || !bytes.HasPrefix(k, p) || len(k) == len(p) || bytes.IndexByte(k[len(p):], 0) >= 0 {
		return nil, badQuery("cursor", protocol.VInvalidValue, "is not a cursor of this query")
	}
	// Past every version of the named tool: names are printable ASCII,
	// so name\x01 sorts after name\0<seq> and before any longer name.
	return append(k, 1), nil
}
