package gateway

import (
	"bytes"
	"encoding/json"
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
	if err := rebaseValue(dec, &out, pointer, false, false); err != nil {
		return "", err
	}
	return out.String(), nil
}

// rebaseValue copies the next value of dec to out, rewriting the $refs of
// its schemas unless it is data; ref says the value is a $ref's. The depth
// is bounded by the JSON scanner's, which checked the schema before.
func rebaseValue(dec *json.Decoder, out *bytes.Buffer, pointer string, data, ref bool) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		out.WriteByte('{')
		for n := 0; dec.More(); n++ {
			key, err := dec.Token()
			if err != nil {
				return err
			}
			if n > 0 {
				out.WriteByte(',')
			}
			writeToken(out, key)
			out.WriteByte(':')
			k, _ := key.(string)
			isData := data || k == "const" || k == "enum" || k == "default" || k == "examples"
			if err := rebaseValue(dec, out, pointer, isData, !data && k == "$ref"); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		out.WriteByte('}')
		return err
	case json.Delim('['):
		out.WriteByte('[')
		for n := 0; dec.More(); n++ {
			if n > 0 {
				out.WriteByte(',')
			}
			if err := rebaseValue(dec, out, pointer, data, false); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		out.WriteByte(']')
		return err
	}
	if s, ok := tok.(string); ok && ref && (s == "#" || strings.HasPrefix(s, "#/")) {
		tok = pointer + strings.TrimPrefix(s, "#")
	}
	writeToken(out, tok)
	return nil
}

// writeToken writes a string, number, boolean or null token as JSON,
// without escaping HTML's characters.
func writeToken(out *bytes.Buffer, tok json.Token) {
	e := json.NewEncoder(out)
	e.SetEscapeHTML(false)
	_ = e.Encode(tok)           // a decoder's token always encodes
	out.Truncate(out.Len() - 1) // Encode's newline
}
