package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
)

// rebaseRefs rewrites the local references of a JSON schema (compact JSON,
// as parseTools keeps parameters) for the schema moved to the place at
// pointer in a larger document: "#" becomes pointer and "#/..." pointer
// followed by "/...". Values of const, enum, default and examples are data,
// not schemas, and are left as they are. Key order is kept.
func rebaseRefs(schema, pointer string) (string, error) {
	dec := json.NewDecoder(strings.NewReader(schema))
	dec.UseNumber()
	var out bytes.Buffer
	// Per open object or array: whether a value comes next in an object
	// (after its key), whether it is data, and whether the next value in
	// an object is a $ref.
	type level struct {
		object, value, data, ref bool
		n                        int
	}
	var stack []level
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out.String(), nil
		}
		if err != nil {
			return "", err
		}
		data := false
		if len(stack) > 0 {
			top := &stack[len(stack)-1]
			data = top.data
			if top.object && !top.value {
				// A key.
				if _, ok := tok.(json.Delim); !ok {
					if top.n > 0 {
						out.WriteByte(',')
					}
					writeToken(&out, tok)
					out.WriteByte(':')
					key, _ := tok.(string)
					top.value, top.n = true, top.n+1
					top.ref = !data && key == "$ref"
					switch key {
					case "const", "enum", "default", "examples":
						top.data = true
					}
					continue
				}
			} else if !top.object {
				if _, ok := tok.(json.Delim); !ok || tok == json.Delim('{') || tok == json.Delim('[') {
					if top.n > 0 {
						out.WriteByte(',')
					}
					top.n++
				}
			}
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			out.WriteString(tok.(json.Delim).String())
			stack = append(stack, level{object: tok == json.Delim('{'), data: data})
			continue
		case json.Delim('}'), json.Delim(']'):
			out.WriteString(tok.(json.Delim).String())
			stack = stack[:len(stack)-1]
		default:
			if s, ok := tok.(string); ok && len(stack) > 0 && stack[len(stack)-1].ref && (s == "#" || strings.HasPrefix(s, "#/")) {
				tok = pointer + strings.TrimPrefix(s, "#")
			}
			writeToken(&out, tok)
		}
		// A value ended: its object takes a key next, and a data key's
		// mark ends with its value.
		if len(stack) > 0 {
			if top := &stack[len(stack)-1]; top.object {
				top.value, top.ref = false, false
				top.data = len(stack) > 1 && stack[len(stack)-2].data
			}
		}
	}
}

// writeToken writes a string, number, boolean or null token as JSON,
// without escaping HTML's characters.
func writeToken(out *bytes.Buffer, tok json.Token) {
	e := json.NewEncoder(out)
	e.SetEscapeHTML(false)
	_ = e.Encode(tok)           // a decoder's token always encodes
	out.Truncate(out.Len() - 1) // Encode's newline
}
