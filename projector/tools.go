package projector

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// ToolVersion is one registered version of a tool definition.
type ToolVersion struct {
	Seq        uint64          `json:"seq"`
	Definition json.RawMessage `json:"definition"`
}

// ToolHistory is a tool's definition in force as of the query and every
// version up to it.
type ToolHistory struct {
	AsOfSeq  uint64        `json:"as_of_seq"`
	ToolName string        `json:"tool_name"`
	Current  ToolVersion   `json:"current"`
	Versions []ToolVersion `json:"versions"`
	// Pause is the tool's last pause or resume as of the query; absent
	// when it was never paused.
	Pause *ToolPauseState `json:"pause,omitempty"`
}

// Tool answers a tool's registration history (the resource.tools registry).
func (q *Queries) Tool(project, tool string, at AsOf) (*ToolHistory, error) {
	if err := checkIDs("project_id", project, "tool_name", tool); err != nil {
		return nil, err
	}
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()
	out := &ToolHistory{AsOfSeq: v.seq, ToolName: tool}
	err = scan(v.snap, key(tagTool, project, tool).prefix(), nil, func(k, val []byte) (bool, error) {
		seq := trailingU64(k)
		if seq > v.seq {
			return false, nil
		}
		out.Versions = append(out.Versions, ToolVersion{Seq: seq, Definition: append(json.RawMessage(nil), val...)})
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: tool %s: %w", tool, err)
	}
	if len(out.Versions) == 0 {
		return nil, notFound("tool %s is not registered in project %s as of seq %d", tool, project, v.seq)
	}
	out.Current = out.Versions[len(out.Versions)-1]
	if out.Pause, err = toolPauseAt(v.snap, project, tool, v.seq); err != nil {
		return nil, fmt.Errorf("projector: tool %s: %w", tool, err)
	}
	return out, nil
}

// Tools answers every tool registered in a project, each at its version in
// force as of the query, by name.
func (q *Queries) Tools(project string, at AsOf) (*Page[ToolVersion], error) {
	if err := checkIDs("project_id", project); err != nil {
		return nil, err
	}
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()
	out := &Page[ToolVersion]{AsOfSeq: v.seq, Items: []ToolVersion{}}
	p := key(tagTool, project).prefix()
	var name []byte
	var cur *ToolVersion
	flush := func() {
		if cur != nil {
			out.Items = append(out.Items, *cur)
		}
		cur = nil
	}
	err = scan(v.snap, p, nil, func(k, val []byte) (bool, error) {
		n := k[len(p) : len(k)-9]
		if !bytes.Equal(n, name) {
			flush()
			name = append(name[:0], n...)
		}
		if seq := trailingU64(k); seq <= v.seq {
			cur = &ToolVersion{Seq: seq, Definition: append(json.RawMessage(nil), val...)}
		}
		return true, nil
	})
	flush()
	if err != nil {
		return nil, fmt.Errorf("projector: tools: %w", err)
	}
	return out, nil
}
