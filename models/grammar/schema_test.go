package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"net"
	"net/mail"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// validates is a test oracle for the schemas CompileSchema takes: it walks
// a decoded document beside the decoded schema (objects as *object, so
// that the properties' order can be checked too).
func validates(t *testing.T, root, schema, doc any) bool {
	switch s := schema.(type) {
	case bool:
		return s
	case *object:
		if r, ok := s.vals["$ref"].(string); ok {
			target := root
			for _, tok := range strings.Split(r, "/")[1:] {
				tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
				target = target.(*object).vals[tok]
			}
			return validates(t, root, target, doc)
		}
		if e, ok := s.vals["enum"].([]any); ok {
			for _, v := range e {
				if same(v, doc) {
					return true
				}
			}
			return false
		}
		if v, ok := s.vals["const"]; ok {
			return same(v, doc)
		}
		for _, k := range []string{"anyOf", "oneOf"} {
			if alts, ok := s.vals[k].([]any); ok {
				n := 0
				for _, a := range alts {
					if validates(t, root, a, doc) {
						n++
					}
				}
				return n == 1
			}
		}
		var types []string
		switch ty := s.vals["type"].(type) {
		case string:
			types = []string{ty}
		case []any:
			for _, e := range ty {
				types = append(types, e.(string))
			}
		case nil:
			if s.has("properties", "required", "additionalProperties", "minProperties", "maxProperties") {
				types = []string{"object"}
			} else if s.has("items", "minItems", "maxItems") {
				types = []string{"array"}
			} else {
				return true
			}
		}
		for _, ty := range types {
			if validatesType(t, root, s, ty, doc) {
				return true
			}
		}
	}
	return false
}

func validatesType(t *testing.T, root any, s *object, ty string, doc any) bool {
	switch ty {
	case "object":
		o, ok := doc.(*object)
		if !ok {
			return false
		}
		props, _ := s.vals["properties"].(*object)
		if props == nil {
			return s.vals["additionalProperties"] != false || len(o.keys) == 0
		}
		// The keys in the schema's order, every required one, no other.
		at := 0
		for _, k := range o.keys {
			i := slices.Index(props.keys[at:], k)
			if i < 0 || !validates(t, root, props.vals[k], o.vals[k]) {
				return false
			}
			at += i + 1
		}
		req, _ := s.vals["required"].([]any)
		for _, r := range req {
			if _, ok := o.vals[r.(string)]; !ok {
				return false
			}
		}
		if n, ok := s.vals["minProperties"].(json.Number); ok && int64(len(o.keys)) < must(n.Int64()) {
			return false
		}
		if n, ok := s.vals["maxProperties"].(json.Number); ok && int64(len(o.keys)) > must(n.Int64()) {
			return false
		}
		return true
	case "array":
		a, ok := doc.([]any)
		if !ok {
			return false
		}
		if n, ok := s.vals["minItems"].(json.Number); ok && int64(len(a)) < must(n.Int64()) {
			return false
		}
		if n, ok := s.vals["maxItems"].(json.Number); ok && int64(len(a)) > must(n.Int64()) {
			return false
		}
		items, ok := s.vals["items"]
		if !ok {
			items = true
		}
		for _, e := range a {
			if !validates(t, root, items, e) {
				return false
			}
		}
		return true
	case "string":
		str, ok := doc.(string)
		if !ok {
			return false
		}
		// Characters are code points; the decoder made an escaped pair one.
		n := int64(utf8.RuneCountInString(str))
		if m, ok := s.vals["minLength"].(json.Number); ok && n < must(m.Int64()) {
			return false
		}
		if m, ok := s.vals["maxLength"].(json.Number); ok && n > must(m.Int64()) {
			return false
		}
		if p, ok := s.vals["pattern"].(string); ok && !oraclePattern(t, p).MatchString(str) {
			return false
		}
		if f, ok := s.vals["format"].(string); ok && !validFormat(f, str) {
			return false
		}
		return true
	case "number":
		n, ok := doc.(json.Number)
		return ok && inLimits(s, n)
	case "integer":
		n, ok := doc.(json.Number)
		if !ok || strings.ContainsAny(n.String(), ".eE") {
			return false
		}
		return inLimits(s, n)
	case "boolean":
		_, ok := doc.(bool)
		return ok
	case "null":
		return doc == nil
	}
	return false
}

// inLimits reports whether n lies within the numeric limits of schema s,
// compared exactly.
func inLimits(s *object, n json.Number) bool {
	if !s.has(append(numericLimits, "multipleOf")...) {
		return true
	}
	v, ok := new(big.Rat).SetString(n.String())
	if !ok {
		return false
	}
	if m, ok := s.vals["multipleOf"].(json.Number); ok {
		if r, ok := new(big.Rat).SetString(m.String()); !ok || !new(big.Rat).Quo(v, r).IsInt() {
			return false
		}
	}
	for k, in := range map[string]func(c int) bool{
		"minimum":          func(c int) bool { return c >= 0 },
		"exclusiveMinimum": func(c int) bool { return c > 0 },
		"maximum":          func(c int) bool { return c <= 0 },
		"exclusiveMaximum": func(c int) bool { return c < 0 },
	} {
		if b, ok := s.vals[k].(json.Number); ok {
			if r, ok := new(big.Rat).SetString(b.String()); ok && !in(v.Cmp(r)) {
				return false
			}
		}
	}
	return true
}

func must(n int64, err error) int64 {
	if err != nil {
		panic(err)
	}
	return n
}

func same(a, b any) bool {
	x, err1 := marshal(a)
	y, err2 := marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}

func decodeDoc(t *testing.T, text []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	v, err := decodeOrdered(dec)
	if err != nil {
		t.Fatalf("%q: %v", text, err)
	}
	return v
}

var schemas = []string{
	`{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"},"maxItems":3}},"required":["name","age"],"additionalProperties":false}`,
	`{"type":"object","properties":{"unit":{"enum":["c","f","celsius",1,10,true,null]},"t":{"type":["number","null"]},"ok":{"type":"boolean"}},"required":["unit","t","ok"]}`,
	`{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"string"},"c":{"const":"x"}},"required":["c"]}`,
	`{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v","kids"]}},"$ref":"#/$defs/node"}`,
	`{"type":"object","properties":{"any":{},"obj":{"type":"object"},"list":{"type":"array","minItems":1},"u":{"anyOf":[{"type":"string"},{"type":"object","properties":{"x":{"type":"null"}},"required":["x"]}]}},"required":["any","obj","list","u"]}`,
	`{"type":"object","additionalProperties":false}`,
	`{"title":"free","type":"object"}`,
	`{"type":"object","properties":{"age":{"type":"integer","minimum":18,"exclusiveMaximum":130},"delta":{"type":["integer","null"],"minimum":-5.5,"maximum":-2},"big":{"type":"integer","exclusiveMinimum":999}},"required":["age","delta","big"]}`,
	`{"type":"object","properties":{"code":{"type":"string","minLength":2,"maxLength":4},"note":{"type":["string","null"],"maxLength":0},"long":{"type":"string","minLength":3}},"required":["code","long"]}`,
	`{"type":"object","properties":{"p":{"type":"number","minimum":0,"maximum":1},"t":{"type":["number","null"],"exclusiveMinimum":-2.5,"exclusiveMaximum":3.75},"m":{"type":"number","maximum":-0.5}},"required":["p","t","m"]}`,
	`{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"day":{"type":"string","format":"date"},` +
		`"at":{"type":["string","null"],"format":"date-time"},"ip":{"type":"string","format":"ipv4"},"code":{"type":"string","pattern":"^[A-Z]{2}-[0-9]+$"},` +
		`"tag":{"type":"string","pattern":"x\\.y|\\u00e9|^$|0"},"t":{"type":"string","format":"time"},"link":{"type":"string","format":"uri"},` +
		`"ptr":{"type":"string","format":"json-pointer"}},"required":["id","day","ip","code","tag"]}`,
	`{"type":"object","properties":{"qty":{"type":"integer","multipleOf":6},"price":{"type":"number","multipleOf":0.01,"minimum":0},` +
		`"step":{"type":["number","null"],"multipleOf":2.5,"maximum":100}},"required":["qty","price","step"]}`,
	`{"type":"object","properties":{"calls":{"type":"array","minItems":1,"items":{"type":"object","properties":{"get_time":{"type":"object","properties":{"tz":{"type":"string"}},"required":["tz"],"additionalProperties":false},` +
		`"get_temp":{"type":"object","additionalProperties":false},"go":{"type":"object","properties":{"n":{"type":"integer"}},"minProperties":1,"maxProperties":1}},"additionalProperties":false,"minProperties":1,"maxProperties":1}}},"required":["calls"],"additionalProperties":false}`,
}

func TestSchemaDocuments(t *testing.T) {
	cases := []struct {
		schema int
		doc    string
		ok     bool
	}{
		{0, `{"name":"Ada","age":36}`, true},
		{0, `{"name": "Ada", "age": 36, "tags": ["a", "b"]}`, true},
		{0, `{"name":"Ada","age":36,"tags":["a","b","c","d"]}`, false},
		{0, `{"age":36,"name":"Ada"}`, false},
		{0, `{"name":"Ada"}`, false},
		{0, `{"name":"Ada","age":36.5}`, false},
		{0, `{"name":"Ada","age":3e1}`, false},
		{0, `{"name":"Ada","age":-0,"tags":[]}`, true},
		{0, `{"name":"Ada","age":1,"x":1}`, false},
		{1, `{"unit":"celsius","t":null,"ok":false}`, true},
		{1, `{"unit":10,"t":-1.5e3,"ok":true}`, true},
		{1, `{"unit":1,"t":2,"ok":true}`, true},
		{1, `{"unit":100,"t":2,"ok":true}`, false},
		{1, `{"unit":"k","t":2,"ok":true}`, false},
		{1, `{"unit":null,"t":"2","ok":true}`, false},
		{2, `{"c":"x"}`, true},
		{2, `{"a":1,"b":"q","c":"x"}`, true},
		{2, `{"b":"q","c":"x"}`, true},
		{2, `{"b":"q"}`, false},
		{2, `{"c":"y"}`, false},
		{3, `{"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]}`, true},
		{3, `{"v":1,"kids":[{"v":2}]}`, false},
		{4, `{"any":[1,{"z":null}],"obj":{"k":[true]},"list":[1,"a",{}],"u":{"x":null}}`, true},
		{4, `{"any":"s","obj":{},"list":[null],"u":"str"}`, true},
		{4, `{"any":"s","obj":{},"list":[],"u":"str"}`, false},
		{4, `{"any":"s","obj":[],"list":[1],"u":"str"}`, false},
		{5, `{}`, true},
		{5, `{"a":1}`, false},
		{6, `{"a":[1,2,{"b":"c"}]}`, true},
		{9, `{"p":0,"t":0,"m":-1}`, true},
		{9, `{"p":1.000000,"t":-2.4999999,"m":-0.5}`, true},
		{9, `{"p":1.0000001,"t":0,"m":-1}`, false},
		{9, `{"p":0.99999999999,"t":3.7499999999,"m":-0.50000000001}`, true},
		{9, `{"p":-0.0,"t":null,"m":-100}`, true},
		{9, `{"p":-0.1,"t":0,"m":-1}`, false},
		{9, `{"p":2,"t":0,"m":-1}`, false},
		{9, `{"p":0.5,"t":-2.5,"m":-1}`, false},
		{9, `{"p":0.5,"t":3.75,"m":-1}`, false},
		{9, `{"p":0.5,"t":3.750000001,"m":-1}`, false},
		{9, `{"p":0.5,"t":0,"m":-0.49}`, false},
		{9, `{"p":0.5,"t":0,"m":0}`, false},
		{7, `{"age":18,"delta":-5,"big":1000}`, true},
		{7, `{"age":129,"delta":null,"big":123456789012}`, true},
		{7, `{"age":17,"delta":-5,"big":1000}`, false},
		{7, `{"age":130,"delta":-5,"big":1000}`, false},
		{7, `{"age":1300,"delta":-5,"big":1000}`, false},
		{7, `{"age":-18,"delta":-5,"big":1000}`, false},
		{7, `{"age":20,"delta":-6,"big":1000}`, false},
		{7, `{"age":20,"delta":-1,"big":1000}`, false},
		{7, `{"age":20,"delta":-2,"big":1000}`, true},
		{7, `{"age":20,"delta":-0,"big":1000}`, false},
		{7, `{"age":20,"delta":-2,"big":999}`, false},
		{7, `{"age":20,"delta":-2,"big":0}`, false},
		{7, `{"age":20,"delta":-2,"big":100000000000000000000000}`, true},
		{7, `{"age":20.0,"delta":-2,"big":1000}`, false},
		{8, `{"code":"ab","long":"xyz"}`, true},
		{8, `{"code":"a","long":"xyz"}`, false},
		{8, `{"code":"abcde","long":"xyz"}`, false},
		{8, `{"code":"\n\tab","long":"xyz"}`, true},
		{8, `{"code":"\n\tabc","long":"xyz"}`, false},
		{8, `{"code":"\u00e9é\"","long":"xyz"}`, true},
		{8, `{"code":"ééééé","long":"xyz"}`, false},
		{8, `{"code":"\ud83d\ude00x","long":"xyz"}`, true},
		{8, `{"code":"abc\ud83d\ude00","long":"xyz"}`, true},
		{8, `{"code":"abc\ud83d\u0041","long":"xyz"}`, false},
		{8, `{"code":"abc\ud83dx","long":"xyz"}`, false},
		{8, `{"code":"ab\ud83d","long":"xyz"}`, true},
		{8, `{"code":"ab","note":"","long":"xyz"}`, true},
		{8, `{"code":"ab","note":null,"long":"xyz"}`, true},
		{8, `{"code":"ab","note":"a","long":"xyz"}`, false},
		{8, `{"code":"ab","long":"😀😀😀"}`, true},
		{8, `{"code":"ab","long":"\ud83d\ude00\ud83d\ude00"}`, false},
		{8, `{"code":"ab","long":"xy"}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"10.0.255.1","code":"AB-12","tag":""}`, true},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-12-31","at":"2024-12-31T23:59:59.5+01:00","ip":"0.0.0.0","code":"ZZ-0","tag":"--x.y--","t":"00:00:00Z"}`, true},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-12-31","at":null,"ip":"0.0.0.0","code":"ZZ-0","tag":"\u00e9"}`, true},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-12-31","ip":"0.0.0.0","code":"ZZ-0","tag":"\ud83d\ude00\u00e9\n"}`, true},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-12-31","ip":"0.0.0.0","code":"ZZ-0","tag":"😀é"}`, true},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-12-31","ip":"0.0.0.0","code":"ZZ-0","tag":"0","link":"https:\/\/example.com\/a?b#c","ptr":"/a~1b"}`, true},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-12-31","ip":"0.0.0.0","code":"ZZ-0","tag":"0","link":"example.com"}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-12-31","ip":"0.0.0.0","code":"ZZ-0","tag":"0","ptr":"a/b"}`, false},
		{10, `{"id":"0A1B2C3D-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"10.0.255.1","code":"AB-12","tag":"a0"}`, true},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ag","day":"2024-02-28","ip":"10.0.255.1","code":"AB-12","tag":""}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789a","day":"2024-02-28","ip":"10.0.255.1","code":"AB-12","tag":""}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-30","ip":"10.0.255.1","code":"AB-12","tag":""}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-04-31","ip":"10.0.255.1","code":"AB-12","tag":""}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"10.0.256.1","code":"AB-12","tag":""}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"10.0.01.1","code":"AB-12","tag":""}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"10.0.255.1","code":"Ab-12","tag":""}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"10.0.255.1","code":"AB-","tag":""}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"10.0.255.1","code":"AB-1","tag":"xzy"}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"10.0.255.1","code":"AB-1","tag":"\u00e8"}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"10.0.255.1","code":"AB-1","tag":"\ud83d"}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"10.0.255.1","code":"AB-1","tag":"\ud83dx"}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","at":"2024-02-28T24:00:00Z","ip":"1.1.1.1","code":"AB-1","tag":""}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","at":"2024-02-28T12:00:00","ip":"1.1.1.1","code":"AB-1","tag":""}`, false},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"1.1.1.1","code":"AB-1","tag":"","t":"12:00:00.123456789-23:59"}`, true},
		{10, `{"id":"0a1b2c3d-0000-4fff-8abc-0123456789ab","day":"2024-02-28","ip":"1.1.1.1","code":"AB-1","tag":"","t":"12:00:60Z"}`, false},
		{11, `{"qty":12,"price":0.05,"step":-5}`, true},
		{11, `{"qty":-0,"price":1.10,"step":null}`, true},
		{11, `{"qty":-600000000,"price":0,"step":100}`, true},
		{11, `{"qty":13,"price":0.05,"step":-5}`, false},
		{11, `{"qty":12,"price":0.055,"step":-5}`, false},
		{11, `{"qty":12,"price":0.0500000001,"step":-5}`, false},
		{11, `{"qty":12,"price":-0.01,"step":-5}`, false},
		{11, `{"qty":12,"price":3,"step":7.4}`, false},
		{11, `{"qty":12,"price":3,"step":102.5}`, false},
		{11, `{"qty":12,"price":3,"step":97.50}`, true},
		{12, `{"calls":[{"get_time":{"tz":"UTC"}}]}`, true},
		{12, `{"calls":[{"get_temp":{}},{"get_time":{"tz":"x"}},{"go":{"n":3}}]}`, true},
		{12, `{"calls":[{"get_time":{"tz":"UTC"},"get_temp":{}}]}`, false},
		{12, `{"calls":[{}]}`, false},
		{12, `{"calls":[]}`, false},
		{12, `{"calls":[{"go":{}}]}`, false},
		{12, `{"calls":[{"go":{"n":1,"m":2}}]}`, false},
		{12, `{"calls":[{"get_thing":{}}]}`, false},
	}
	compiled := make([]*Schema, len(schemas))
	for i, s := range schemas {
		var err error
		if compiled[i], err = CompileSchema([]byte(s)); err != nil {
			t.Fatalf("schema %d: %v", i, err)
		}
	}
	g := func(i int) *Grammar {
		v, err := NewVocab(testVocab())
		if err != nil {
			t.Fatal(err)
		}
		return v.Schema(compiled[i])
	}
	for _, c := range cases {
		gr := g(c.schema)
		s := gr.start()
		ok := true
		for i := range len(c.doc) {
			if ok = gr.step(&s, c.doc[i]); !ok {
				break
			}
		}
		if got := ok && s.n == 0; got != c.ok {
			t.Errorf("schema %d, %s: whole and valid %v, want %v", c.schema, c.doc, got, c.ok)
		}
		root := decodeDoc(t, []byte(schemas[c.schema]))
		if want := validates(t, root, root, decodeDoc(t, []byte(c.doc))); want != c.ok {
			t.Fatalf("the oracle says %v of %s against schema %d", want, c.doc, c.schema)
		}
	}
}

// Walks through a vocabulary under each schema's masks end on documents
// the schema accepts.
func TestSchemaWalks(t *testing.T) {
	vocab := testVocab()
	for _, k := range []string{`"name"`, `"age"`, `"tags"`, `"unit"`, `"celsius"`, `"kids"`, `"v":`, `"any"`, `"list"`} {
		vocab = append(vocab, []byte(k))
	}
	v, err := NewVocab(vocab)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(9, 10))
	// Closers and short values, more so as the walk goes on.
	tilt := func(step int, logits []float32) {
		for _, c := range []byte(`}]"0tfn`) {
			logits[c] += float32(step) / 20
		}
	}
	for i, src := range schemas {
		s, err := CompileSchema([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		compact := i%3 == 0
		if compact {
			s = s.Compact()
		}
		gr := v.Schema(s)
		if i%2 == 1 {
			gr.maxLinks = 2 // equal stacks under other pointers: more misses, the same masks
		}
		root := decodeDoc(t, []byte(src))
		closed := 0
		for n := range 60 {
			text, done := walk(t, gr.Start(), r, 300, tilt)
			if !done {
				continue
			}
			closed++
			if !json.Valid(text) {
				t.Fatalf("schema %d, walk %d: %s is not JSON", i, n, text)
			}
			if compact && !compactText(text) {
				t.Fatalf("schema %d compact, walk %d: %q", i, n, text)
			}
			dec := json.NewDecoder(bytes.NewReader(text))
			dec.UseNumber()
			doc, err := decodeOrdered(dec)
			if err != nil && strings.Contains(err.Error(), "twice") {
				continue // a free object may repeat a key, as JSON allows
			}
			if err != nil || !validates(t, root, root, doc) {
				t.Fatalf("schema %d, walk %d: %s does not validate", i, n, text)
			}
		}
		if closed < 30 {
			t.Errorf("schema %d: %d of 60 walks closed", i, closed)
		}
	}
}

func TestSchemaRefused(t *testing.T) {
	for _, c := range []struct{ schema, want string }{
		{`{"type":"string"}`, "root must be an object"},
		{`{"type":"object","properties":{"s":{"type":"integer","uniqueItems":true}}}`, `"uniqueItems" is not supported`},
		{`{"type":"object","properties":{"s":{"type":"integer","multipleOf":0}}}`, "want a positive number"},
		{`{"type":"object","properties":{"s":{"type":"integer","multipleOf":"2"}}}`, "want a positive number"},
		{`{"type":"object","properties":{"s":{"type":"integer","multipleOf":1e14}}}`, "want at most 1e13"},
		{`{"type":"object","properties":{"s":{"type":"number","multipleOf":0.0000001}}}`, "at most six digits after the point"},
		{`{"type":"object","properties":{"s":{"type":"integer","multipleOf":7,"minimum":1,"maximum":6}}}`, "no multiple of 7"},
		{`{"type":"object","properties":{"s":{"type":"number","multipleOf":0.5,"exclusiveMinimum":1,"exclusiveMaximum":1.5}}}`, "no multiple of 0.5"},
		{`{"type":"object","properties":{"s":{"multipleOf":2}}}`, `"multipleOf" without a type`},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":"a(?=b)"}}}`, `pattern "a(?=b)"`},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":"(a"}}}`, `pattern "(a"`},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":"\\bword"}}}`, "word boundaries"},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":"(?i)abc"}}}`, "case-insensitive"},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":"(?m)^a"}}}`, "multi-line"},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":"a$b"}}}`, "matches no string"},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":"[ab]*a[ab]{14}"}}}`, "states"},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":7}}}`, "pattern is not a string"},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":"a","maxLength":3}}}`, "beside minLength or maxLength"},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":"a","format":"date"}}}`, "pattern beside format"},
		{`{"type":"object","properties":{"s":{"type":"string","format":"idn-email"}}}`, `format "idn-email" is not supported (date, date-time, duration, email, hostname, ipv4, ipv6, iri, iri-reference, json-pointer, relative-json-pointer, time, uri, uri-reference, uri-template, uuid are)`},
		{`{"type":"object","properties":{"s":{"pattern":"a"}}}`, `"pattern" without a type`},
		{`{"type":"object","properties":{"s":{"enum":["a"],"format":"date"}}}`, `"format" beside enum`},
		{`{"type":"object","properties":{"n":{"type":"number","minimum":0.0000001}}}`, "at most six digits after the point"},
		{`{"type":"object","properties":{"n":{"type":"number","maximum":2e9}}}`, "from -1e9 to 1e9"},
		{`{"type":"object","properties":{"n":{"type":"number","exclusiveMinimum":1,"maximum":1}}}`, "no number lies within"},
		{`{"type":"object","properties":{"u":{"anyOf":[{"type":"integer"},{"type":"number"}]}}}`, "begin differently"},
		{`{"type":"object","properties":{"u":{"anyOf":[{"type":"object"},{"type":"object","properties":{}}]}}}`, "begin differently"},
		{`{"type":"object","required":["x"],"properties":{}}`, "required names x"},
		{`{"type":"object","properties":{"r":{"$ref":"http://x/y"}}}`, "inside the schema"},
		{`{"type":"object","properties":{"r":{"$ref":"#/$defs/none"}}}`, "names nothing"},
		{`{"type":"object","properties":{"a":false}}`, "accepts nothing"},
		{`{"type":"object","properties":{"a":{"type":"date"}}}`, `"date"`},
		{`{"type":"object","properties":{"a":{"type":"array","minItems":3,"maxItems":2}}}`, "below minItems"},
		{`{"type":"object","properties":{"a":{"type":"string","minLength":3,"maxLength":2}}}`, "maxLength 2 is below minLength 3"},
		{`{"type":"object","properties":{"a":{"maxLength":2}}}`, `"maxLength" without a type`},
		{`{"type":"object","properties":{"a":{"enum":["abc"],"maxLength":2}}}`, `"maxLength" beside enum`},
		{`{"type":"object","properties":{"a":{"anyOf":[{"type":"integer"}],"minimum":2}}}`, `"minimum" beside enum`},
		{`{"type":"object","properties":{"a":{"type":"integer","minimum":3,"maximum":2.5}}}`, "no integer lies within"},
		{`{"type":"object","properties":{"a":{"type":"integer","exclusiveMinimum":2,"exclusiveMaximum":3}}}`, "no integer lies within"},
		{`{"type":"object","properties":{"a":{"type":"integer","maximum":1e14}}}`, "from -1e13 to 1e13"},
		{`{"type":"object","properties":{"a":{"type":"integer","exclusiveMinimum":true}}}`, "exclusiveMinimum is not a number"},
		{`{"type":"object","properties":{"a":{"type":"string","minLength":-1}}}`, "minLength is -1"},
		{`{"type":"object","properties":{"a":{"type":"string","maxLength":"4"}}}`, "maxLength is not a number"},
		{`{"type":"object"} x`, "after the schema"},
		{`{"type":`, "schema:"},
		{`{"$ref":"#"}`, "without end"},
		{`{"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]}`, "without end"},
		{`{"$defs":{"x":{"anyOf":[{"$ref":"#/$defs/y"},{"$ref":"#/$defs/y"}]},"y":{"anyOf":[{"$ref":"#/$defs/x"},{"$ref":"#/$defs/x"}]}},` +
			`"type":"object","properties":{"a":{"$ref":"#/$defs/x"}}}`, "without end"},
		{`{"type":"object","properties":{"a":{"type":"string"},"a":{"type":"string"}}}`, "twice"},
		{`{"type":"object","properties":{"a":{"type":"object","minProperties":1}}}`, "beside properties only"},
		{`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"minProperties":2}`, "minProperties 2"},
		{`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"maxProperties":1,"required":["b"]}`, "maxProperties 1"},
		{`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"maxProperties":2}`, "maxProperties 2"},
		{`{"type":"object","properties":{"a":{"type":"string"}},"maxProperties":-1}`, "maxProperties is -1"},
		{`{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"$ref":"#/properties/a"}},"minProperties":1}},"required":["a"]}`, "without end"},
	} {
		_, err := CompileSchema([]byte(c.schema))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.schema, err, c.want)
		}
	}
}

// FuzzCompileSchema compiles a schema and walks its grammar with the
// input's bytes as the choices (then closers first): a document the
// grammar completes is JSON and follows the schema by the oracle.
func FuzzCompileSchema(f *testing.F) {
	for i, s := range schemas {
		f.Add([]byte(s), []byte{byte(i), 7, 200, 3, 99})
	}
	v, err := NewVocab(testVocab())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, schema, choices []byte) {
		s, err := CompileSchema(schema)
		if err != nil {
			return
		}
		q := v.Schema(s).Start()
		var text []byte
		var allowed []int32
		for i := 0; i < 600 && !q.Done(); i++ {
			allowed = q.AllowedIDs(allowed[:0])
			if len(allowed) == 0 {
				t.Fatalf("%s: no token after %q", schema, text)
			}
			pick := allowed[0]
			if i < len(choices) {
				pick = allowed[int(choices[i])%len(allowed)]
			} else {
				for _, c := range []int32{'}', ']', '"', '0', 'n', 't'} {
					if q.Allowed(c) {
						pick = c
						break
					}
				}
			}
			if err := q.Accept(pick); err != nil {
				t.Fatal(err)
			}
			text = append(text, v.tokens[pick]...)
		}
		if !q.Done() {
			return
		}
		if !json.Valid(text) {
			t.Fatalf("%s: %q is not JSON", schema, text)
		}
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.UseNumber()
		doc, err := decodeOrdered(dec)
		if err != nil {
			return // a free object may repeat a key, as JSON allows
		}
		root := decodeDoc(t, schema)
		if !validates(t, root, root, doc) {
			t.Fatalf("%s: %s does not follow the schema", schema, text)
		}
	})
}

func TestSchemaKeysAreEscaped(t *testing.T) {
	s, err := CompileSchema([]byte(`{"type":"object","properties":{"a\"b<é>":{"type":"integer"}},"required":["a\"b<é>"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(s.nodes[s.root].props[0].key); got != `"a\"b<é>"` {
		t.Fatalf("key %s", got)
	}
}

// Sequences of one grammar may run on many goroutines at once.
func TestGrammarShared(t *testing.T) {
	v, err := NewVocab(testVocab())
	if err != nil {
		t.Fatal(err)
	}
	s, err := CompileSchema([]byte(schemas[3]))
	if err != nil {
		t.Fatal(err)
	}
	gr := v.Schema(s)
	gr.maxLinks = 8
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 20 {
				walk(t, gr.Start(), r, 100, nil)
			}
		})
	}
	wg.Wait()
}

// Walks that favour escapes and surrogate pairs through strings with a
// minLength and a maxLength never meet a dead end, and end on documents
// whose strings the oracle counts within the bounds: the masks count a
// pair as one character, and at maxLength after a high surrogate let only
// a low one follow.
func TestStringLengthWalks(t *testing.T) {
	vocab := testVocab()
	for _, k := range []string{`\ud83d`, `\ude00`, `\ud8`, `\udc`, `\u0041`, `00`, `3d`, `de`, `\ud83d\ude00`, `"x":"`} {
		vocab = append(vocab, []byte(k))
	}
	v, err := NewVocab(vocab)
	if err != nil {
		t.Fatal(err)
	}
	src := `{"type":"object","properties":{"x":{"type":"string","minLength":1,"maxLength":3}},"required":["x"]}`
	s, err := CompileSchema([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	gr := v.Schema(s)
	root := decodeDoc(t, []byte(src))
	r := rand.New(rand.NewPCG(11, 12))
	favour := map[string]float32{`\ud83d`: 3, `\ude00`: 3, `\ud8`: 2, `\udc`: 2, `\u0041`: 1.5, `\ud83d\ude00`: 2, `"x":"`: 4, `\`: 1, `u`: 1, "é": 1}
	ids := map[int]float32{}
	for id, b := range vocab {
		if w, ok := favour[string(b)]; ok {
			ids[id] = w
		}
	}
	pairs, closed := 0, 0
	for n := range 400 {
		text, done := walk(t, gr.Start(), r, 60, func(step int, logits []float32) {
			for id, w := range ids {
				logits[id] += w
			}
			logits['"'] += float32(step) / 6
			logits['}'] += float32(step) / 6
		})
		if !done {
			continue
		}
		closed++
		if !json.Valid(text) || !validates(t, root, root, decodeDoc(t, text)) {
			t.Fatalf("walk %d: %s does not validate", n, text)
		}
		// A string of more UTF-16 units than maxLength: pairs counted once.
		if x := decodeDoc(t, text).(*object).vals["x"].(string); len(utf16.Encode([]rune(x))) > 3 {
			pairs++
		}
	}
	if closed < 300 || pairs < 10 {
		t.Errorf("%d of 400 walks closed, %d with more UTF-16 units than maxLength", closed, pairs)
	}
}

// The masks inside strings with a minLength and a maxLength, taken by the
// plain-text shortcut, agree with stepping each token byte by byte.
func TestStringLengthMasks(t *testing.T) {
	vocab := testVocab()
	for _, k := range []string{`abcdef`, `ab"`, `a\"b`, `xy\u00e9`, `\ud83d`, `\ude00`, `q\ude00`} {
		vocab = append(vocab, []byte(k))
	}
	v, err := NewVocab(vocab)
	if err != nil {
		t.Fatal(err)
	}
	s, err := CompileSchema([]byte(`{"type":"object","properties":{"a":{"type":"string","minLength":3,"maxLength":7},"b":{"type":"string","minLength":4}},"required":["a","b"]}`))
	if err != nil {
		t.Fatal(err)
	}
	gr := v.Schema(s)
	r := rand.New(rand.NewPCG(5, 6))
	logits := make([]float32, len(vocab))
	inside := 0
	for walk := range 150 {
		q := gr.Start()
		var text []byte
		for step := 0; step < 60 && !q.Done(); step++ {
			clear(logits)
			q.Mask(logits)
			var allowed []int32
			for id, b := range vocab {
				st, want := q.s, len(b) > 0
				for i := 0; want && i < len(b); i++ {
					want = gr.step(&st, b[i])
				}
				if got := !math.IsInf(float64(logits[id]), -1); got != want {
					t.Fatalf("walk %d after %q: token %q allowed %v, want %v", walk, text, b, got, want)
				}
				if want {
					allowed = append(allowed, int32(id))
				}
			}
			if q.s.inString() {
				inside++
			}
			id := allowed[r.IntN(len(allowed))]
			if err := q.Accept(id); err != nil {
				t.Fatal(err)
			}
			text = append(text, vocab[id]...)
		}
	}
	if inside < 500 {
		t.Errorf("%d masks inside strings", inside)
	}
}

// Every sign and up to four digits under integer limits: the grammar takes
// a prefix exactly when some integer within the limits begins with it, and
// closes it exactly when it is one, against a search of the integers near
// zero.
func TestIntegerLimitsPrefixes(t *testing.T) {
	v, err := NewVocab(testVocab())
	if err != nil {
		t.Fatal(err)
	}
	for _, lim := range []string{
		`"minimum":18,"maximum":129`, `"minimum":-5,"maximum":-2`, `"minimum":1000`, `"maximum":7`,
		`"minimum":0,"maximum":0`, `"minimum":-3,"maximum":12`, `"exclusiveMinimum":4.5,"exclusiveMaximum":5.5`,
		`"maximum":-40`, `"minimum":-1e4,"maximum":-999`,
		`"multipleOf":7,"minimum":-100,"maximum":100`, `"multipleOf":5,"maximum":20000,"minimum":-20000`, `"multipleOf":2.5,"minimum":-300,"maximum":12000`,
		`"multipleOf":3,"exclusiveMinimum":-10,"exclusiveMaximum":10`, `"multipleOf":1000,"minimum":1,"maximum":19999`, `"multipleOf":13,"minimum":27,"maximum":39`,
	} {
		src := `{"type":"object","properties":{"x":{"type":"integer",` + lim + `}},"required":["x"]}`
		gr := limitGrammar(t, v, src)
		root := decodeDoc(t, []byte(src))
		// The prefixes of the integers within the limits (by the oracle)
		// near zero, "-0" among them where 0 is.
		inside, prefixes := map[int]bool{}, map[string]bool{}
		for n := -20000; n <= 20000; n++ {
			if !validates(t, root, root, decodeDoc(t, []byte(`{"x":`+strconv.Itoa(n)+`}`))) {
				continue
			}
			inside[n] = true
			reprs := []string{strconv.Itoa(n)}
			if n == 0 {
				reprs = append(reprs, "-0")
			}
			for _, r := range reprs {
				for i := 1; i <= len(r); i++ {
					prefixes[r[:i]] = true
				}
			}
		}
		var texts []string
		for _, sign := range []string{"", "-"} {
			texts = append(texts, sign)
			for n := range 10000 {
				texts = append(texts, sign+strconv.Itoa(n))
			}
		}
		for _, p := range texts {
			if p == "" {
				continue
			}
			want, whole := prefixes[p], false
			if p != "-" {
				n, _ := strconv.Atoi(p)
				whole = inside[n]
			}
			takesPrefix(t, gr, lim, p, want, whole)
		}
	}
}

// Every sign, some integer parts and up to three digits after the point
// under number limits: the grammar takes a prefix exactly when some number
// within the limits begins with it, and closes it exactly when it is one,
// against the intervals of values each prefix may still come to, checked
// at their meeting's lower end and middle.
func TestNumberLimitsPrefixes(t *testing.T) {
	v, err := NewVocab(testVocab())
	if err != nil {
		t.Fatal(err)
	}
	var fracs []string
	for n := 1; n <= 3; n++ {
		for v := range []int{10, 100, 1000}[n-1] {
			fracs = append(fracs, fmt.Sprintf("%0*d", n, v))
		}
	}
	// Past the six digits the limits have: a value a hair off a limit.
	fracs = append(fracs, "0000001", "0000000", "5000001", "4999999", "2500000", "24999991", "25000001", "3450000001", "0010000001", "0009999999")
	ints := []string{"0", "1", "2", "3", "9", "10", "12", "99", "100", "123", "999", "1000", "1001"}
	for _, lim := range []string{
		`"minimum":0,"maximum":1`, `"exclusiveMinimum":0,"exclusiveMaximum":1`, `"exclusiveMinimum":-2.5,"exclusiveMaximum":3.75`,
		`"maximum":-0.5`, `"minimum":0.001`, `"minimum":1000,"maximum":1000.5`, `"exclusiveMaximum":12.345`, `"minimum":-0.25,"maximum":-0.25`,
		`"multipleOf":0.25,"minimum":-1,"maximum":3`, `"multipleOf":0.001,"exclusiveMinimum":0,"exclusiveMaximum":1`, `"multipleOf":1.5,"minimum":-2,"maximum":1000`,
		`"multipleOf":0.125,"exclusiveMinimum":0.5,"maximum":1000.5`, `"multipleOf":7,"minimum":-20,"maximum":20`,
	} {
		src := `{"type":"object","properties":{"x":{"type":"number",` + lim + `}},"required":["x"]}`
		gr := limitGrammar(t, v, src)
		limits := decodeDoc(t, []byte(src)).(*object).vals["properties"].(*object).vals["x"].(*object)
		in := func(r *big.Rat) bool { return inLimits(limits, json.Number(r.FloatString(12))) }
		rat := func(s string) *big.Rat { r, _ := new(big.Rat).SetString(s); return r }
		// reach says whether a value of sign neg in [a, b) lies within.
		reach := func(neg bool, a, b *big.Rat) bool {
			if neg {
				a, b = new(big.Rat).Neg(b), new(big.Rat).Neg(a)
			}
			lo, hi := new(big.Rat).Set(a), new(big.Rat).Set(b)
			for _, k := range []string{"minimum", "exclusiveMinimum"} {
				if n, ok := limits.vals[k].(json.Number); ok && rat(n.String()).Cmp(lo) > 0 {
					lo = rat(n.String())
				}
			}
			for _, k := range []string{"maximum", "exclusiveMaximum"} {
				if n, ok := limits.vals[k].(json.Number); ok && rat(n.String()).Cmp(hi) < 0 {
					hi = rat(n.String())
				}
			}
			mid := new(big.Rat).Add(lo, hi)
			mid.Quo(mid, big.NewRat(2, 1))
			cands := []*big.Rat{lo, mid}
			if m, ok := limits.vals["multipleOf"].(json.Number); ok {
				// The two least multiples at or above the lower end.
				mr := rat(m.String())
				q := new(big.Rat).Quo(lo, mr)
				k := new(big.Int).Div(q.Num(), q.Denom()) // floor
				for range 3 {
					c := new(big.Rat).Mul(new(big.Rat).SetInt(k), mr)
					if c.Cmp(lo) >= 0 {
						cands = append(cands, c)
					}
					k.Add(k, big.NewInt(1))
				}
			}
			for _, c := range cands {
				inside := c.Cmp(a) > 0 && c.Cmp(b) < 0 || !neg && c.Cmp(a) == 0 || neg && c.Cmp(b) == 0
				if inside && in(c) {
					return true
				}
			}
			return false
		}
		for _, sign := range []string{"", "-"} {
			neg := sign == "-"
			var texts []string
			if neg {
				texts = append(texts, sign)
			}
			for _, i := range ints {
				texts = append(texts, sign+i, sign+i+".")
				for _, f := range fracs {
					texts = append(texts, sign+i+"."+f)
				}
			}
			for _, p := range texts {
				digits := strings.TrimPrefix(p, "-")
				var want, whole bool
				switch {
				case digits == "":
					want = reach(neg, rat("0"), rat("1e20"))
				case !strings.Contains(digits, "."):
					pv := rat(digits)
					if digits == "0" {
						want = reach(neg, rat("0"), rat("1"))
					}
					for j := int64(1); digits != "0" && j <= 1e15 && !want; j *= 10 {
						a := new(big.Rat).Mul(pv, big.NewRat(j, 1))
						want = reach(neg, a, new(big.Rat).Add(a, big.NewRat(j, 1)))
					}
					whole = in(rat(p))
				default:
					f := len(digits) - strings.Index(digits, ".") - 1
					a := rat(strings.TrimSuffix(digits, "."))
					want = reach(neg, a, new(big.Rat).Add(a, new(big.Rat).SetFrac64(1, int64(math.Pow10(f)))))
					whole = f > 0 && in(rat(p))
				}
				takesPrefix(t, gr, lim, p, want, whole)
			}
		}
	}
}

// limitGrammar is the grammar of schema src over v.
func limitGrammar(t *testing.T, v *Vocab, src string) *Grammar {
	t.Helper()
	sc, err := CompileSchema([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return v.Schema(sc)
}

// takesPrefix checks that gr takes the value text p of property x exactly
// when want says, and closes the object after it exactly when whole does.
func takesPrefix(t *testing.T, gr *Grammar, lim, p string, want, whole bool) {
	t.Helper()
	s, ok := gr.start(), true
	for _, c := range []byte(`{"x":` + p) {
		if ok = gr.step(&s, c); !ok {
			break
		}
	}
	if ok != want {
		t.Fatalf("%s: %q taken %v, want %v", lim, p, ok, want)
	}
	if ok {
		if closed := gr.step(&s, '}') && s.n == 0; closed != whole {
			t.Fatalf("%s: %q closed %v, want %v", lim, p, closed, whole)
		}
	}
}

// oraclePattern is a JSON Schema pattern as Go's regexp reads it, its
// ECMA-262 \uXXXX escapes written as \x{XXXX}.
func oraclePattern(t testing.TB, p string) *regexp.Regexp {
	t.Helper()
	re, err := regexp.Compile(regexp.MustCompile(`\\u([0-9a-fA-F]{4})`).ReplaceAllString(p, `\x{$1}`))
	if err != nil {
		t.Fatalf("pattern %q: %v", p, err)
	}
	return re
}

var uuidText = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// validFormat is a test oracle for the formats: the time package's RFC
// 3339 parser, net's IPv4 parser (which takes no leading zeros) and a
// UUID's shape.
func validFormat(f, s string) bool {
	switch f {
	case "date":
		_, err := time.Parse(time.DateOnly, s)
		return err == nil
	case "time":
		_, err := time.Parse(time.RFC3339Nano, "2000-01-01T"+s)
		return err == nil
	case "date-time":
		_, err := time.Parse(time.RFC3339Nano, s)
		return err == nil
	case "uuid":
		return uuidText.MatchString(s)
	case "ipv4":
		ip := net.ParseIP(s)
		return ip != nil && ip.To4() != nil && !strings.Contains(s, ":")
	case "ipv6":
		a, err := netip.ParseAddr(s)
		return err == nil && a.Is6() && a.Zone() == ""
	case "hostname":
		if len(s) > 253 {
			return false
		}
		for _, l := range strings.Split(s, ".") {
			if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' ||
				strings.Trim(l, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") != "" {
				return false
			}
		}
		return true
	case "duration":
		return validDuration(s)
	case "email":
		a, err := mail.ParseAddress(s)
		at := strings.LastIndexByte(s, '@')
		return err == nil && a.Address == s && at <= 64 && validFormat("hostname", s[at+1:])
	case "uri", "uri-reference", "iri", "iri-reference":
		return validURI(s, strings.HasSuffix(f, "-reference"), f[0] == 'i')
	case "json-pointer":
		return validPointer(s)
	case "uri-template":
		return validTemplate(s)
	case "relative-json-pointer":
		i := 0
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		return i > 0 && (s[0] != '0' || i == 1) && (s[i:] == "#" || validPointer(s[i:]))
	}
	return false
}

// validTemplate is RFC 6570's URI template read by hand: literals outside
// braces (percent-encodings whole), and in each pair of braces an optional
// operator and varspecs parted by commas, each a name of varchars (letters,
// digits, '_', percent-encodings) joined by single dots, then ":" and a
// length of 1 to 9999 or "*".
func validTemplate(s string) bool {
	hex := func(s string) bool {
		return len(s) >= 2 && strings.ContainsRune("0123456789abcdefABCDEF", rune(s[0])) && strings.ContainsRune("0123456789abcdefABCDEF", rune(s[1]))
	}
	for s != "" {
		c := s[0]
		switch {
		case c == '%':
			if !hex(s[1:]) {
				return false
			}
			s = s[3:]
		case c == '{':
			end := strings.IndexByte(s, '}')
			if end < 0 {
				return false
			}
			expr := s[1:end]
			s = s[end+1:]
			if expr != "" && strings.ContainsRune("+#./;?&=,!@|", rune(expr[0])) {
				expr = expr[1:]
			}
			for _, spec := range strings.Split(expr, ",") {
				name, mod := spec, ""
				if i := strings.IndexAny(spec, ":*"); i >= 0 {
					name, mod = spec[:i], spec[i:]
				}
				if mod != "" && mod != "*" {
					n, err := strconv.Atoi(mod[1:])
					if err != nil || mod[1] == '0' || n < 1 || n > 9999 || strings.ContainsAny(mod[1:], "+-") {
						return false
					}
				}
				for _, part := range strings.Split(name, ".") {
					if part == "" {
						return false
					}
					for part != "" {
						switch {
						case part[0] == '%':
							if !hex(part[1:]) {
								return false
							}
							part = part[3:]
						case part[0] == '_' || 'a' <= part[0]|0x20 && part[0]|0x20 <= 'z' || '0' <= part[0] && part[0] <= '9':
							part = part[1:]
						default:
							return false
						}
					}
				}
			}
		case c > 0x20 && c < 0x7f && !strings.ContainsRune("\"'%<>\\^`{|}", rune(c)):
			s = s[1:]
		default:
			return false
		}
	}
	return true
}

// validPointer is RFC 6901's JSON pointer: "/"-led tokens in which "~" is
// followed by "0" or "1".
func validPointer(s string) bool {
	if s == "" {
		return true
	}
	if s[0] != '/' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '~' && (i+1 == len(s) || s[i+1] != '0' && s[i+1] != '1') {
			return false
		}
	}
	return true
}

// validURI is RFC 3986's URI (with ref, URI-reference; with iri, RFC
// 3987's IRI and IRI-reference) grammar read by hand: a scheme up to the
// first ':' before any '/', '?' or '#' (where there is none, a relative
// reference), the fragment after the first '#', the query after the first
// '?', then an authority after "//" and a path of segments.
func validURI(s string, ref, iri bool) bool {
	const unreserved = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~"
	const subDelims = "!$&'()*+,;="
	// ucs reports an IRI's characters beyond ASCII (ucschar; with query,
	// iprivate too): not surrogates, nor a plane's last two code points,
	// nor the private use areas outside a query.
	ucs := func(r rune, query bool) bool {
		private := 0xE000 <= r && r <= 0xF8FF || r >= 0xF0000
		switch {
		case !iri || r < 0xA0 || 0xD800 <= r && r <= 0xDFFF || r&0xFFFE == 0xFFFE || 0xFDD0 <= r && r <= 0xFDEF:
			return false
		case private:
			return query
		}
		return r < 0xE0000 || r >= 0xE1000
	}
	// chars reports whether s is of the unreserved characters, the
	// sub-delimiters, extra's and percent-encodings (and with query, a
	// query's private ones).
	chars := func(s, extra string, query bool) bool {
		for i, r := range s {
			switch {
			case r == '%':
				if i+2 >= len(s) || !strings.ContainsRune("0123456789abcdefABCDEF", rune(s[i+1])) || !strings.ContainsRune("0123456789abcdefABCDEF", rune(s[i+2])) {
					return false
				}
			case i > 0 && s[i-1] == '%' || i > 1 && s[i-2] == '%':
				// a percent-encoding's digits, checked above
			case !strings.ContainsRune(unreserved+subDelims+extra, r) && !ucs(r, query):
				return false
			}
		}
		return true
	}
	rest := s
	if i := strings.IndexAny(s, ":/?#"); i >= 0 && s[i] == ':' {
		scheme := s[:i]
		if scheme == "" || !strings.ContainsRune(unreserved[:52], rune(scheme[0])) ||
			strings.Trim(scheme, unreserved[:62]+"+-.") != "" {
			return false // no scheme, and a ':' in a relative reference's first segment
		}
		rest = s[i+1:]
	} else if !ref {
		return false
	}
	rest, frag, _ := strings.Cut(rest, "#")
	rest, query, _ := strings.Cut(rest, "?")
	if !chars(frag, ":@/?", false) || !chars(query, ":@/?", true) {
		return false
	}
	path := rest
	if after, ok := strings.CutPrefix(rest, "//"); ok {
		auth := after
		if j := strings.IndexByte(after, '/'); j >= 0 {
			auth, path = after[:j], after[j:]
		} else {
			path = ""
		}
		if user, host, ok := strings.Cut(auth, "@"); ok {
			if !chars(user, ":", false) {
				return false
			}
			auth = host
		}
		port := ""
		if strings.HasPrefix(auth, "[") {
			j := strings.IndexByte(auth, ']')
			if j < 0 {
				return false
			}
			lit := auth[1:j]
			a, err := netip.ParseAddr(lit)
			future := len(lit) > 2 && lit[0] == 'v' && strings.Contains(lit, ".")
			if future {
				hex, rest, _ := strings.Cut(lit[1:], ".")
				future = hex != "" && strings.Trim(hex, "0123456789abcdefABCDEF") == "" && rest != "" &&
					strings.Trim(rest, unreserved+subDelims+":") == ""
			}
			if !(err == nil && a.Is6() && a.Zone() == "") && !future {
				return false
			}
			if p, ok := strings.CutPrefix(auth[j+1:], ":"); ok {
				port = p
			} else if auth[j+1:] != "" {
				return false
			}
		} else {
			host, p, _ := strings.Cut(auth, ":")
			if !chars(host, "", false) {
				return false
			}
			port = p
		}
		if strings.Trim(port, "0123456789") != "" {
			return false
		}
	}
	for _, seg := range strings.Split(path, "/") {
		if !chars(seg, ":@", false) {
			return false
		}
	}
	return true
}

// validDuration is RFC 3339's appendix A grammar of durations, read by
// hand: "P", then a week, or date parts and an optional time, or a time;
// the parts of each in order, each after the one before it.
func validDuration(s string) bool {
	rest, ok := strings.CutPrefix(s, "P")
	if !ok {
		return false
	}
	// parts reads numbers with designators from units, each following the
	// last one read, and returns how many it read.
	parts := func(units string) int {
		n, next := 0, 0
		for rest != "" && rest[0] != 'T' {
			i := 0
			for i < len(rest) && '0' <= rest[i] && rest[i] <= '9' {
				i++
			}
			if i == 0 || i == len(rest) {
				return -1
			}
			u := strings.IndexByte(units, rest[i])
			if u < 0 || u != next && n > 0 || u < next {
				return -1
			}
			if n == 0 {
				next = u
			}
			next, n, rest = u+1, n+1, rest[i+1:]
		}
		return n
	}
	if strings.HasSuffix(s, "W") {
		_, err := strconv.Atoi(rest[:len(rest)-1])
		return err == nil && len(rest) > 1 && !strings.ContainsAny(rest[:len(rest)-1], "+-")
	}
	date := parts("YMD")
	if date < 0 {
		return false
	}
	if rest == "" {
		return date > 0
	}
	rest = rest[1:] // the T
	return parts("HMS") > 0 && rest == ""
}

// TestSchemaCompact: a compact schema takes one space at most between
// tokens, in its own structure and in the values it leaves free (any
// value, any object), and no line breaks or tabs; the same schema not
// compact takes them; whitespace inside strings is the string's.
func TestSchemaCompact(t *testing.T) {
	v, err := NewVocab(testVocab())
	if err != nil {
		t.Fatal(err)
	}
	whole := func(gr *Grammar, doc string) bool {
		s := gr.start()
		for i := range len(doc) {
			if !gr.step(&s, doc[i]) {
				return false
			}
		}
		return s.n == 0
	}
	compiled := func(i int) *Schema {
		s, err := CompileSchema([]byte(schemas[i]))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, c := range []struct {
		schema  int
		doc     string
		compact bool // accepted compact (the loose schema accepts every doc)
	}{
		{0, `{"name":"Ada","age":36}`, true},
		{0, `{"name": "Ada", "age": 36, "tags": ["a", "b"]}`, true},
		{0, `{ "name" : "A  d\ta" , "age" : 36 }`, true},
		{0, `{"name":  "Ada","age":36}`, false},
		{0, "{\n\"name\":\"Ada\",\"age\":36}", false},
		{0, "{\"name\":\"Ada\",\t\"age\":36}", false},
		{0, `{"name":"Ada","age":36 }`, true},
		{4, `{"any": [1, {"z": null}], "obj": {"k": [true]}, "list": [1, "a", {}], "u": {"x": null}}`, true},
		{4, `{"any":[1,  {"z":null}],"obj":{},"list":[1],"u":"s"}`, false},
		{4, `{"any":1,"obj":{"k":` + "\n" + `1},"list":[1],"u":"s"}`, false},
	} {
		if !whole(v.Schema(compiled(c.schema)), c.doc) {
			t.Errorf("schema %d, %q: refused loose", c.schema, c.doc)
		}
		if got := whole(v.Schema(compiled(c.schema).Compact()), c.doc); got != c.compact {
			t.Errorf("schema %d, %q: compact accepts %v, want %v", c.schema, c.doc, got, c.compact)
		}
	}
}

// compactText reports whether a JSON text has at most one space, and no
// other whitespace, between its tokens.
func compactText(text []byte) bool {
	in, esc, space := false, false, false
	for _, c := range text {
		switch {
		case in:
			in = esc || c != '"'
			esc = !esc && c == '\\'
		case c == ' ':
			if space {
				return false
			}
			space = true
			continue
		case c == '\n' || c == '\t' || c == '\r':
			return false
		case c == '"':
			in = true
		}
		space = false
	}
	return true
}
