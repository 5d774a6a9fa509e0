package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/troupe/troupe/models/grammar"
)

func TestRebaseRefs(t *testing.T) {
	const at = "#/properties/tool_calls/items/properties/f~1g"
	for _, c := range []struct{ in, want string }{
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`, `{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`},
		{`{"$defs":{"P":{"type":"object","properties":{"x":{"type":"number"},"up":{"$ref":"#/$defs/P"}}}},"type":"object","properties":{"a":{"$ref":"#/$defs/P"},"d":{"$ref":"#"},"e":{"$ref":"https://x/y"}}}`,
			`{"$defs":{"P":{"type":"object","properties":{"x":{"type":"number"},"up":{"$ref":"` + at + `/$defs/P"}}}},"type":"object","properties":{"a":{"$ref":"` + at + `/$defs/P"},"d":{"$ref":"` + at + `"},"e":{"$ref":"https://x/y"}}}`},
		// Data is left alone: const, enum, default and examples values.
		{`{"type":"object","properties":{"b":{"const":{"$ref":"#/x"}},"c":{"enum":["#",{"$ref":"#"},[{"$ref":"#"}]]},"d":{"default":{"$ref":"#"},"$ref":"#/$defs/Q"},"$ref":{"type":"string"}},"$defs":{"Q":{"examples":[{"$ref":"#"}],"type":"integer"}}}`,
			`{"type":"object","properties":{"b":{"const":{"$ref":"#/x"}},"c":{"enum":["#",{"$ref":"#"},[{"$ref":"#"}]]},"d":{"default":{"$ref":"#"},"$ref":"` + at + `/$defs/Q"},"$ref":{"type":"string"}},"$defs":{"Q":{"examples":[{"$ref":"#"}],"type":"integer"}}}`},
		{`{"a":[1,2.5e3,true,null,{"b":[]},[]],"c":{}}`, `{"a":[1,2.5e3,true,null,{"b":[]},[]],"c":{}}`},
	} {
		got, err := rebaseRefs(c.in, at)
		if err != nil || got != c.want {
			t.Errorf("rebaseRefs(%s):\n got %s (%v)\nwant %s", c.in, got, err, c.want)
		}
	}
}

// FuzzRebaseRefs: any JSON comes out as valid JSON, and rebased to the
// root ("#") as it went in.
func FuzzRebaseRefs(f *testing.F) {
	for _, s := range []string{`{"$ref":"#/a","const":{"$ref":"#"}}`, `[1,{"enum":[{"$ref":"#"}]},"$ref"]`, `{"a":{"$ref":"#"},"$ref":{}}`, `"x"`, `{}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var c bytes.Buffer
		if json.Compact(&c, []byte(s)) != nil {
			return
		}
		got, err := rebaseRefs(c.String(), "#")
		if err != nil || !sameJSON(got, c.String()) {
			t.Fatalf("%s: %s, %v", c.String(), got, err)
		}
		if again, _ := rebaseRefs(got, "#"); again != got {
			t.Fatalf("%s: %s, then %s", c.String(), got, again)
		}
		if got, err = rebaseRefs(c.String(), "#/p/q"); err != nil || !json.Valid([]byte(got)) {
			t.Fatalf("%s: %s, %v", c.String(), got, err)
		}
	})
}

// sameJSON reports whether two JSON texts hold the same tokens in order.
func sameJSON(a, b string) bool {
	da, db := json.NewDecoder(strings.NewReader(a)), json.NewDecoder(strings.NewReader(b))
	da.UseNumber()
	db.UseNumber()
	for {
		ta, ea := da.Token()
		tb, eb := db.Token()
		if ea != nil || eb != nil {
			return ea == io.EOF && eb == io.EOF
		}
		if ta != tb {
			return false
		}
	}
}

// TestCallsSchemaRefs: under "required" with several functions, a
// function's references to its own $defs (as pydantic writes nested
// models) resolve in the calls document: the grammar compiled from it
// takes calls whose nested values follow the referenced schema, and
// refuses others.
func TestCallsSchemaRefs(t *testing.T) {
	route := `{"type":"function","function":{"name":"get_route","parameters":{"$defs":{"Point":{"type":"object","properties":{"lat":{"type":"number"},"lon":{"type":"number"}},"required":["lat","lon"],"additionalProperties":false}},` +
		`"type":"object","properties":{"from":{"$ref":"#/$defs/Point"},"to":{"$ref":"#/$defs/Point"},"via":{"type":"array","items":{"$ref":"#/$defs/Point"}}},"required":["from","to"],"additionalProperties":false}}}`
	tools, aerr := parseTools(json.RawMessage(`[` + route + `,` + weatherTool + `]`))
	if aerr != nil {
		t.Fatal(aerr)
	}
	plan, aerr := parseToolChoice(json.RawMessage(`"required"`), tools, nil)
	if aerr != nil {
		t.Fatal(aerr)
	}
	s, err := grammar.CompileSchema([]byte(plan.schema()))
	if err != nil {
		t.Fatalf("the calls document does not compile: %v\n%s", err, plan.schema())
	}
	bytes := make([][]byte, 256)
	for c := range bytes {
		bytes[c] = []byte{byte(c)}
	}
	v, err := grammar.NewVocab(bytes)
	if err != nil {
		t.Fatal(err)
	}
	g := v.Schema(s)
	takes := func(doc string) bool {
		q := g.Start()
		for i := range len(doc) {
			if q.Accept(int32(doc[i])) != nil {
				return false
			}
		}
		return q.Done()
	}
	for doc, want := range map[string]bool{
		`{"tool_calls":[{"get_route":{"from":{"lat":1,"lon":2},"to":{"lat":3.5,"lon":-4},"via":[{"lat":0,"lon":0}]}}]}`:    true,
		`{"tool_calls":[{"get_weather":{"city":"Oslo"}},{"get_route":{"from":{"lat":1,"lon":2},"to":{"lat":3,"lon":4}}}]}`: true,
		`{"tool_calls":[{"get_route":{"from":{"lat":1},"to":{"lat":3,"lon":4}}}]}`:                                         false,
		`{"tool_calls":[{"get_route":{"from":{"lat":1,"lon":2},"to":"Rome"}}]}`:                                            false,
		`{"tool_calls":[{"get_route":{"from":{"lat":1,"lon":2},"to":{"lat":3,"lon":4},"via":[{"x":1}]}}]}`:                 false,
	} {
		if got := takes(doc); got != want {
			t.Errorf("%s: taken %v, want %v", doc, got, want)
		}
	}
}
