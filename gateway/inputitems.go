package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// maxItemsPage bounds a page of input items, as OpenAI's limit does.
const maxItemsPage = 100

// handleInputItems answers GET /v1/responses/{id}/input_items: the items a
// kept response answered (its conversation before its output, previous
// responses' turns included), as OpenAI lists them: newest first unless
// order=asc, limit (1 to 100, 20 by default) a page, after an item's id.
func (s *Server) handleInputItems(w http.ResponseWriter, r *http.Request) {
	resp := s.keptResponse(w, r)
	if resp == nil {
		return
	}
	id := r.PathValue("id")
	q := r.URL.Query()
	order := q.Get("order")
	if order != "" && order != "asc" && order != "desc" {
		writeAPIError(w, invalidParam("order", "order is %q, want asc or desc", truncate(order, 20)))
		return
	}
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxItemsPage {
			writeAPIError(w, invalidParam("limit", "limit is %q, want 1 to %d", truncate(v, 20), maxItemsPage))
			return
		}
		limit = n
	}
	items := inputItems(id, resp.Conv[:max(len(resp.Conv)-1, 0)])
	if order != "asc" {
		slices.Reverse(items)
	}
	start := 0
	if after := q.Get("after"); after != "" {
		i := slices.IndexFunc(items, func(it map[string]any) bool { return it["id"] == after })
		if i < 0 {
			writeAPIError(w, invalidParam("after", "after is %q, which is not an item of response %s", truncate(after, 80), truncate(id, 80)))
			return
		}
		start = i + 1
	}
	page := items[start:min(start+limit, len(items))]
	out := map[string]any{"object": "list", "data": nonNil(page), "first_id": nil, "last_id": nil, "has_more": start+limit < len(items)}
	if len(page) > 0 {
		out["first_id"], out["last_id"] = page[0]["id"], page[len(page)-1]["id"]
	}
	writeJSON(w, http.StatusOK, out)
}

// inputItems are a kept conversation's messages as Responses items, in
// order: messages, an assistant's calls as function_call items after its
// text, and tools' answers as function_call_output items. An item's id is
// its response's and its place, the same on every read.
func inputItems(respID string, conv []chatMessage) []map[string]any {
	base := strings.TrimPrefix(respID, "resp_")
	var items []map[string]any
	add := func(prefix string, it map[string]any) {
		it["id"] = fmt.Sprintf("%s_%s_%d", prefix, base, len(items))
		items = append(items, it)
	}
	for _, m := range conv {
		switch {
		case m.Role == "tool":
			add("fco", map[string]any{"type": "function_call_output", "call_id": m.ToolCallID, "output": m.Content.text, "status": "completed"})
		case m.Role == "assistant":
			if m.ReasoningContent != "" {
				add("rs", map[string]any{"type": "reasoning", "summary": []any{}, "status": "completed",
					"content": []reasoningPart{{Type: "reasoning_text", Text: m.ReasoningContent}}})
			}
			if m.Content.set {
				add("msg", map[string]any{"type": "message", "role": "assistant", "status": "completed",
					"content": []responsePart{textPart(m.Content.text, nil)}})
			}
			var calls []toolCallOut
			_ = json.Unmarshal(m.ToolCalls, &calls) // validated when it was kept
			for _, c := range calls {
				add("fc", map[string]any{"type": "function_call", "call_id": c.ID, "name": c.Function.Name, "arguments": c.Function.Arguments, "status": "completed"})
			}
		default:
			add("msg", map[string]any{"type": "message", "role": m.Role, "status": "completed",
				"content": []map[string]string{{"type": "input_text", "text": m.Content.text}}})
		}
	}
	return items
}
