package mcpfront

import (
	"encoding/json"
	"fmt"
)

// inlineRefs gives back the binary data of MCP content that the bridge
// wrote into the result card as references (mcpbridge.Ref: "data_ref" of
// image and audio items, a resource's "blob_ref"): the bytes kept inline
// become the item's data again, so an MCP client gets the content its
// server sent. A reference whose bytes were not kept (over the bridge's
// max_inline_bytes) cannot be given back: the item becomes a text item
// naming the reference (MCP has no image without data). Content without
// references is returned unchanged.
func inlineRefs(content []json.RawMessage) []json.RawMessage {
	out := content
	for i, raw := range content {
		var item map[string]any
		if json.Unmarshal(raw, &item) != nil {
			continue
		}
		changed := false
		if ref, ok := item["data_ref"].(map[string]any); ok {
			delete(item, "data_ref")
			if data, ok := ref["data"].(string); ok && data != "" {
				item["data"] = data
			} else {
				item = omittedText(item["type"], item["mimeType"], ref)
			}
			changed = true
		}
		if res, ok := item["resource"].(map[string]any); ok {
			if ref, ok := res["blob_ref"].(map[string]any); ok {
				delete(res, "blob_ref")
				if data, ok := ref["data"].(string); ok && data != "" {
					res["blob"] = data
				} else {
					item = omittedText("resource "+fmt.Sprint(res["uri"]), res["mimeType"], ref)
				}
				changed = true
			}
		}
		if !changed {
			continue
		}
		b, err := json.Marshal(item)
		if err != nil {
			continue
		}
		if &out[0] == &content[0] {
			out = append([]json.RawMessage(nil), content...)
		}
		out[i] = b
	}
	return out
}

func omittedText(kind, mime any, ref map[string]any) map[string]any {
	size, _ := ref["size"].(float64)
	return map[string]any{"type": "text", "text": fmt.Sprintf("[%v %v of %d bytes, sha256 %v: not kept in the result card (the bridge's max_inline_bytes)]",
		kind, mime, int64(size), ref["sha256"])}
}

// inlineResult is a result that is MCP content with its references'
// bytes given back (inlineRefs); anything else unchanged.
func inlineResult(raw json.RawMessage) json.RawMessage {
	var r map[string]json.RawMessage
	if json.Unmarshal(raw, &r) != nil {
		return raw
	}
	var content []json.RawMessage
	if json.Unmarshal(r["content"], &content) != nil || len(content) == 0 {
		return raw
	}
	in := inlineRefs(content)
	if &in[0] == &content[0] {
		return raw
	}
	b, err := json.Marshal(in)
	if err != nil {
		return raw
	}
	r["content"] = b
	if out, err := json.Marshal(r); err == nil {
		return out
	}
	return raw
}
