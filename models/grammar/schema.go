package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// The kinds of a schema's nodes.
const (
	kAnyObject uint8 = iota // any JSON object
	kAny                    // any JSON value
	kObject                 // an object of the listed properties, in their order
	kArray                  // an array of items
	kString                 // any string
	kNumber                 // any number
	kInteger                // a number without fraction or exponent
	kLiterals               // one of a few JSON texts (enum, const, booleans, null)
	kUnion                  // the alternative whose first bytes hold the value's first byte
)

// byteSet is a set of bytes.
type byteSet [4]uint64

func (b *byteSet) add(s string) {
	for i := range len(s) {
		b[s[i]/64] |= 1 << (s[i] % 64)
	}
}
func (b *byteSet) has(c byte) bool { return b[c/64]>>(c%64)&1 == 1 }

const (
	numberFirst = "-0123456789"
	valueFirst  = `{["-0123456789tfn`
)

type node struct {
	kind         uint8
	props        []prop   // kObject
	lastRequired int      // kObject: the last required property, or -1
	items        int32    // kArray
	minItems     int      // kArray; kString: minLength; kObject: 1 where a property must come though none is required
	maxItems     int      // kArray; kString: maxLength; kObject: 1 where one property at most may come; -1 for no limit
	lits         [][]byte // kLiterals, sorted
	alts         []int32  // kUnion
	first        byteSet  // the bytes a value may begin with
	// kInteger: the least and the most value (minimum, maximum and their
	// exclusive kinds), where limits has limMin and limMax. kNumber: the
	// same in millionths (decUnit), limMinEx and limMaxEx saying a limit is
	// exclusive.
	min, max int64
	limits   uint8
	mult     int64 // kInteger, kNumber (in millionths): the values are its multiples
	pat      *dfa  // kString: the pattern or format its text matches
}

// The bits of node.limits.
const (
	limMin   = 1 << iota // min is set
	limMax               // max is set
	limMinEx             // min is exclusive (numbers)
	limMaxEx             // max is exclusive (numbers)
)

// bounded reports whether a string node has a minLength or a maxLength.
func (n *node) bounded() bool { return n.kind == kString && (n.minItems > 0 || n.maxItems >= 0) }

type prop struct {
	key      []byte // the key as the document writes it, quotes and all
	node     int32
	required bool
}

// Schema is a JSON schema compiled for constrained decoding, independent
// of any vocabulary (Vocab.Schema puts it over one).
//
// It takes the subset of JSON Schema that OpenAI's structured outputs
// take: "type" (one or a list), "properties" with "required",
// "additionalProperties" and, where they say that one property of those
// listed comes (none required), "minProperties" 1 and "maxProperties" 1
// (or bounds every document meets), "items" with "minItems" and "maxItems",
// "minLength" and "maxLength" (in characters: code points, an escaped
// surrogate pair one), "pattern" (compilePattern) and "format" (date,
// time, date-time, duration, uuid, ipv4, ipv6, hostname, email) of
// strings, "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"
// and "multipleOf" (of integers from -1e13 to 1e13; of numbers from -1e9 to
// 1e9 with at most six digits after the point, and a bounded number is
// written without an exponent), "enum",
// "const", "anyOf" and "oneOf", "$ref" into "$defs" or "definitions"
// (recursion included), and the annotations (title, description,
// default, examples, $schema, $id, $comment). An object writes its
// properties in the schema's order, the required ones always and the
// others as the model chooses; one without "properties" takes any
// members unless "additionalProperties" is false. The alternatives of a
// union must begin with different bytes (a string or null, say), and the
// root must be an object. Any other keyword (uniqueItems, ...) is
// refused with an error that names it, rather than ignored.
// minLength and maxLength apply to strings and the numeric bounds to
// numbers, and other types ignore them, as JSON Schema has it; bounds
// without a type or beside enum, const, anyOf or oneOf are refused.
type Schema struct {
	nodes   []node
	root    int32
	compact bool // one space at most between tokens (Compact)
}

// Compact returns s with its whitespace bounded tighter: at most one space
// between the tokens of JSON, no line breaks or tabs, as machine-read
// documents (a tool call's arguments) are written.
func (s *Schema) Compact() *Schema {
	c := *s
	c.compact = true
	return &c
}

// anyObject is JSON mode's schema: any object.
func anyObject() *Schema {
	n := node{kind: kAnyObject}
	n.first.add("{")
	return &Schema{nodes: []node{n}}
}

// CompileSchema compiles a JSON schema document.
func CompileSchema(doc []byte) (*Schema, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	root, err := decodeOrdered(dec)
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("schema: data after the schema")
	}
	c := &compiler{doc: root, refs: map[string]int32{}, pats: map[string]*dfa{}}
	r, err := c.compile(root, "#")
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	s := &Schema{nodes: c.nodes, root: r}
	s.firstSets()
	if i := s.unending(); i >= 0 {
		return nil, fmt.Errorf("schema: %s: no document of finite depth follows it (references that go round without end)", c.paths[i])
	}
	for i, n := range s.nodes {
		if n.kind != kUnion {
			continue
		}
		for a := range n.alts {
			for b := range a {
				x, y := s.nodes[n.alts[a]].first, s.nodes[n.alts[b]].first
				for w := range x {
					if x[w]&y[w] != 0 {
						return nil, fmt.Errorf("schema: %s: alternatives %d and %d may begin with the same byte; each alternative of a union must begin differently (an object, a string, a number, null ...)", c.paths[i], b, a)
					}
				}
			}
		}
	}
	var obj byteSet
	obj.add("{")
	if s.nodes[r].first != obj {
		return nil, fmt.Errorf("schema: the root must be an object")
	}
	return s, nil
}

// unending returns a node none of whose values is finite (a union whose
// references only go round, an object that requires itself), or -1: the
// nodes with a finite value are found by iterating to a fixed point.
func (s *Schema) unending() int {
	ends := make([]bool, len(s.nodes))
	for changed := true; changed; {
		changed = false
		for i, n := range s.nodes {
			if ends[i] {
				continue
			}
			ok := true
			switch n.kind {
			case kObject:
				for _, p := range n.props {
					ok = ok && (!p.required || ends[p.node])
				}
				if n.minItems > 0 {
					ok = ok && slices.ContainsFunc(n.props, func(p prop) bool { return ends[p.node] })
				}
			case kArray:
				ok = n.minItems == 0 || ends[n.items]
			case kUnion:
				ok = slices.ContainsFunc(n.alts, func(a int32) bool { return ends[a] })
			}
			if ok {
				ends[i], changed = true, true
			}
		}
	}
	return slices.Index(ends, false)
}

// firstSets gives each node the bytes its values may begin with: a
// union's are its alternatives', found by iterating to a fixed point, since
// references may make unions refer to each other in circles.
func (s *Schema) firstSets() {
	for i := range s.nodes {
		n := &s.nodes[i]
		switch n.kind {
		case kAnyObject, kObject:
			n.first.add("{")
		case kAny:
			n.first.add(valueFirst)
		case kArray:
			n.first.add("[")
		case kString:
			n.first.add(`"`)
		case kNumber, kInteger:
			n.first.add(numberFirst)
		case kLiterals:
			for _, l := range n.lits {
				n.first.add(string(l[:1]))
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for i := range s.nodes {
			n := &s.nodes[i]
			if n.kind != kUnion {
				continue
			}
			for _, a := range n.alts {
				f := s.nodes[a].first
				for w := range f {
					if n.first[w]|f[w] != n.first[w] {
						n.first[w] |= f[w]
						changed = true
					}
				}
			}
		}
	}
}

type compiler struct {
	doc   any
	nodes []node
	paths []string // where each node's schema is, for errors
	refs  map[string]int32
	pats  map[string]*dfa // the automata built, by pattern, shared by the strings of one
}

func (c *compiler) add(n node, path string) int32 {
	c.nodes = append(c.nodes, n)
	c.paths = append(c.paths, path)
	return int32(len(c.nodes) - 1)
}

var annotations = map[string]bool{"title": true, "description": true, "default": true, "examples": true,
	"$schema": true, "$id": true, "$comment": true, "$defs": true, "definitions": true}

var keywords = map[string]bool{"type": true, "properties": true, "required": true, "additionalProperties": true, "minProperties": true, "maxProperties": true,
	"items": true, "minItems": true, "maxItems": true, "minLength": true, "maxLength": true, "minimum": true,
	"maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true, "enum": true, "const": true, "anyOf": true, "oneOf": true, "$ref": true,
	"pattern": true, "format": true, "multipleOf": true}

func (c *compiler) compile(v any, path string) (int32, error) {
	if len(c.nodes) > 1<<15 {
		return 0, fmt.Errorf("%s: the schema is too large", path)
	}
	switch v := v.(type) {
	case bool:
		if !v {
			return 0, fmt.Errorf("%s: the schema false accepts nothing", path)
		}
		return c.add(node{kind: kAny}, path), nil
	case *object:
		return c.object(v, path)
	}
	return 0, fmt.Errorf("%s: a schema is an object or a boolean", path)
}

func (c *compiler) object(o *object, path string) (int32, error) {
	for _, k := range o.keys {
		if !keywords[k] && !annotations[k] {
			return 0, fmt.Errorf("%s: keyword %q is not supported", path, k)
		}
	}
	if ref, ok := o.vals["$ref"]; ok {
		if len(o.keys) > 1 {
			for _, k := range o.keys {
				if k != "$ref" && !annotations[k] {
					return 0, fmt.Errorf("%s: %q beside $ref is not supported", path, k)
				}
			}
		}
		r, ok := ref.(string)
		if !ok {
			return 0, fmt.Errorf("%s: $ref is not a string", path)
		}
		return c.ref(r, path)
	}
	if k := o.first(limitKeywords...); k != "" {
		if o.has("enum", "const", "anyOf", "oneOf") {
			return 0, fmt.Errorf("%s: %q beside enum, const, anyOf or oneOf is not supported", path, k)
		}
		if !o.has("type") {
			return 0, fmt.Errorf("%s: %q without a type is not supported: name the type it bounds", path, k)
		}
	}
	if e, ok := o.vals["enum"]; ok {
		list, ok := e.([]any)
		if !ok || len(list) == 0 {
			return 0, fmt.Errorf("%s: enum is not a list of values", path)
		}
		return c.literals(list, path)
	}
	if e, ok := o.vals["const"]; ok {
		return c.literals([]any{e}, path)
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if a, ok := o.vals[k]; ok {
			list, ok := a.([]any)
			if !ok || len(list) == 0 {
				return 0, fmt.Errorf("%s: %s is not a list of schemas", path, k)
			}
			u := c.add(node{kind: kUnion}, path)
			var alts []int32
			for i, s := range list {
				n, err := c.compile(s, fmt.Sprintf("%s/%s/%d", path, k, i))
				if err != nil {
					return 0, err
				}
				alts = append(alts, n)
			}
			c.nodes[u].alts = alts
			return u, nil
		}
	}
	var types []string
	switch t := o.vals["type"].(type) {
	case nil:
		switch {
		case o.has("properties", "required", "additionalProperties", "minProperties", "maxProperties"):
			types = []string{"object"}
		case o.has("items", "minItems", "maxItems"):
			types = []string{"array"}
		default:
			return c.add(node{kind: kAny}, path), nil
		}
	case string:
		types = []string{t}
	case []any:
		for _, e := range t {
			s, ok := e.(string)
			if !ok {
				return 0, fmt.Errorf("%s: type lists a %T", path, e)
			}
			types = append(types, s)
		}
		if slices.Contains(types, "number") {
			types = slices.DeleteFunc(types, func(s string) bool { return s == "integer" })
		}
	default:
		return 0, fmt.Errorf("%s: type is a %T", path, t)
	}
	if len(types) == 0 {
		return 0, fmt.Errorf("%s: type lists no type", path)
	}
	if len(types) == 1 {
		return c.typed(o, types[0], path)
	}
	u := c.add(node{kind: kUnion}, path)
	var alts []int32
	for _, t := range types {
		n, err := c.typed(o, t, path)
		if err != nil {
			return 0, err
		}
		alts = append(alts, n)
	}
	c.nodes[u].alts = alts
	return u, nil
}

func (c *compiler) typed(o *object, t, path string) (int32, error) {
	switch t {
	case "object":
		return c.objectType(o, path)
	case "array":
		n := node{kind: kArray}
		if err := bounds(o, "minItems", "maxItems", &n, path); err != nil {
			return 0, err
		}
		i := c.add(n, path)
		items := any(true)
		if it, ok := o.vals["items"]; ok {
			items = it
		}
		child, err := c.compile(items, path+"/items")
		if err != nil {
			return 0, err
		}
		c.nodes[i].items = child
		return i, nil
	case "string":
		n := node{kind: kString}
		if err := bounds(o, "minLength", "maxLength", &n, path); err != nil {
			return 0, err
		}
		if err := c.stringPattern(o, &n, path); err != nil {
			return 0, err
		}
		return c.add(n, path), nil
	case "number", "integer":
		n, limits := node{kind: kNumber}, decLimits
		if t == "integer" {
			n.kind, limits = kInteger, intLimits
		}
		if err := limits(o, &n, path); err != nil {
			return 0, err
		}
		if err := multipleOf(o, &n, path); err != nil {
			return 0, err
		}
		return c.add(n, path), nil
	case "boolean":
		return c.literals([]any{false, true}, path)
	case "null":
		return c.literals([]any{nil}, path)
	}
	return 0, fmt.Errorf("%s: type %q is not a JSON Schema type", path, t)
}

func (c *compiler) objectType(o *object, path string) (int32, error) {
	props, hasProps := o.vals["properties"].(*object)
	if _, ok := o.vals["properties"]; ok && !hasProps {
		return 0, fmt.Errorf("%s: properties is not an object", path)
	}
	closed := o.vals["additionalProperties"] == false
	if !hasProps && !closed {
		if _, ok := o.vals["required"]; ok {
			return 0, fmt.Errorf("%s: required names properties the schema does not list", path)
		}
		if o.has("minProperties", "maxProperties") {
			return 0, fmt.Errorf("%s: minProperties and maxProperties are supported beside properties only", path)
		}
		return c.add(node{kind: kAnyObject}, path), nil
	}
	required := map[string]bool{}
	if r, ok := o.vals["required"]; ok {
		list, ok := r.([]any)
		if !ok {
			return 0, fmt.Errorf("%s: required is not a list", path)
		}
		for _, e := range list {
			name, ok := e.(string)
			if !ok || !hasProps || props.vals[name] == nil {
				return 0, fmt.Errorf("%s: required names %v, which properties does not list", path, e)
			}
			required[name] = true
		}
	}
	i := c.add(node{kind: kObject, lastRequired: -1}, path)
	var list []prop
	if hasProps {
		for k, name := range props.keys {
			child, err := c.compile(props.vals[name], path+"/properties/"+name)
			if err != nil {
				return 0, err
			}
			key, err := marshal(name)
			if err != nil {
				return 0, err
			}
			list = append(list, prop{key: key, node: child, required: required[name]})
			if required[name] {
				c.nodes[i].lastRequired = k
			}
		}
	}
	c.nodes[i].props = list
	// The counts of properties the machine follows: at least one where
	// none is required, at most one.
	nd := &c.nodes[i]
	nd.maxItems = -1
	lo, err := count(o, "minProperties", 0, path)
	if err != nil {
		return 0, err
	}
	hi, err := count(o, "maxProperties", -1, path)
	if err != nil {
		return 0, err
	}
	switch nreq := len(required); {
	case lo <= nreq:
	case lo == 1:
		nd.minItems = 1
	default:
		return 0, fmt.Errorf("%s: minProperties %d: only 1, or at most the required properties, is supported", path, lo)
	}
	switch {
	case hi < 0 || closed && hi >= len(list):
	case hi == 1 && len(required) == 0:
		nd.maxItems = 1
	default:
		return 0, fmt.Errorf("%s: maxProperties %d: only 1, or at least the properties of a closed object, is supported", path, hi)
	}
	return i, nil
}

// limitKeywords bound strings' lengths and numbers' values.
var (
	numericLimits = []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}
	limitKeywords = append([]string{"minLength", "maxLength", "pattern", "format", "multipleOf"}, numericLimits...)
)

// maxLimit bounds the magnitude of an integer's limits, so that the
// digits of a number that may still lie within them fit a state.
const maxLimit = 1e13

// eachLimit calls f with each numeric limit o has, in numericLimits'
// order, refusing one that is not a number.
func eachLimit(o *object, path string, f func(k string, num json.Number) error) error {
	for _, k := range numericLimits {
		v, ok := o.vals[k]
		if !ok {
			continue
		}
		num, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%s: %s is not a number", path, k)
		}
		if err := f(k, num); err != nil {
			return err
		}
	}
	return nil
}

// intLimits reads an integer node's bounds: each inclusive, a fractional
// bound rounded inward.
func intLimits(o *object, n *node, path string) error {
	err := eachLimit(o, path, func(k string, num json.Number) error {
		f, err := num.Float64()
		if err != nil || math.Abs(f) > maxLimit {
			return fmt.Errorf("%s: %s is %s, want a number from -1e13 to 1e13", path, k, num)
		}
		switch k {
		case "minimum", "exclusiveMinimum":
			b := int64(math.Ceil(f))
			if k == "exclusiveMinimum" {
				b = int64(math.Floor(f)) + 1
			}
			if n.limits&limMin == 0 || b > n.min {
				n.min = b
			}
			n.limits |= limMin
		default:
			b := int64(math.Floor(f))
			if k == "exclusiveMaximum" {
				b = int64(math.Ceil(f)) - 1
			}
			if n.limits&limMax == 0 || b < n.max {
				n.max = b
			}
			n.limits |= limMax
		}
		return nil
	})
	if err != nil {
		return err
	}
	if n.limits == limMin|limMax && n.min > n.max {
		return fmt.Errorf("%s: no integer lies within the bounds (from %d to %d)", path, n.min, n.max)
	}
	return nil
}

// decLimits reads a number node's bounds, in millionths: each within
// 1e9 of zero, with at most six digits after the point.
func decLimits(o *object, n *node, path string) error {
	err := eachLimit(o, path, func(k string, num json.Number) error {
		r, ok := new(big.Rat).SetString(num.String())
		if ok {
			r.Mul(r, big.NewRat(decUnit, 1))
		}
		if !ok || !r.IsInt() || r.Num().CmpAbs(big.NewInt(maxDecLimit*decUnit)) > 0 {
			return fmt.Errorf("%s: %s is %s, want a number from -1e9 to 1e9 with at most six digits after the point", path, k, num)
		}
		b, ex := r.Num().Int64(), strings.HasPrefix(k, "exclusive")
		if strings.HasSuffix(k, "inimum") {
			if n.limits&limMin == 0 || b > n.min || b == n.min && ex {
				n.min, n.limits = b, n.limits&^limMinEx|limMin
				if ex {
					n.limits |= limMinEx
				}
			}
		} else if n.limits&limMax == 0 || b < n.max || b == n.max && ex {
			n.max, n.limits = b, n.limits&^limMaxEx|limMax
			if ex {
				n.limits |= limMaxEx
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if n.limits&(limMin|limMax) == limMin|limMax && (n.min > n.max || n.min == n.max && n.limits&(limMinEx|limMaxEx) != 0) {
		return fmt.Errorf("%s: no number lies within the bounds", path)
	}
	return nil
}

// bounds reads a node's least and most counts (minItems and maxItems, or
// minLength and maxLength) into its minItems and maxItems.
func bounds(o *object, lo, hi string, n *node, path string) error {
	var err error
	if n.minItems, err = count(o, lo, 0, path); err != nil {
		return err
	}
	if n.maxItems, err = count(o, hi, -1, path); err != nil {
		return err
	}
	if n.maxItems >= 0 && n.maxItems < n.minItems {
		return fmt.Errorf("%s: %s %d is below %s %d", path, hi, n.maxItems, lo, n.minItems)
	}
	return nil
}

// count reads a non-negative integer keyword, def where absent.
func count(o *object, k string, def int, path string) (int, error) {
	v, ok := o.vals[k]
	if !ok {
		return def, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("%s: %s is not a number", path, k)
	}
	i, err := strconv.Atoi(n.String())
	if err != nil || i < 0 || i > 1<<15 {
		return 0, fmt.Errorf("%s: %s is %s, want an integer from 0 to %d", path, k, n, 1<<15)
	}
	return i, nil
}

// literals is a node of the JSON texts of values.
func (c *compiler) literals(values []any, path string) (int32, error) {
	var lits [][]byte
	for _, v := range values {
		b, err := marshal(v)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		lits = append(lits, b)
	}
	slices.SortFunc(lits, bytes.Compare)
	lits = slices.CompactFunc(lits, bytes.Equal)
	return c.add(node{kind: kLiterals, lits: lits}, path), nil
}

// ref compiles the schema a local reference names, once: a reference
// inside it to itself is the node being compiled.
func (c *compiler) ref(r, path string) (int32, error) {
	if i, ok := c.refs[r]; ok {
		return i, nil
	}
	if !strings.HasPrefix(r, "#/") && r != "#" {
		return 0, fmt.Errorf("%s: $ref %q: only references inside the schema (#/...) are supported", path, r)
	}
	target := c.doc
	for _, tok := range strings.Split(strings.TrimPrefix(r, "#"), "/")[1:] {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		o, ok := target.(*object)
		if !ok || o.vals[tok] == nil {
			return 0, fmt.Errorf("%s: $ref %q names nothing", path, r)
		}
		target = o.vals[tok]
	}
	// A union of one alternative stands for the target until it is
	// compiled, so that the target may refer to itself.
	u := c.add(node{kind: kUnion}, path)
	c.refs[r] = u
	t, err := c.compile(target, r)
	if err != nil {
		return 0, err
	}
	c.nodes[u].alts = []int32{t}
	return u, nil
}

// object is a JSON object with its keys in order.
type object struct {
	keys []string
	vals map[string]any
}

// first returns the first of keys o has, or "".
func (o *object) first(keys ...string) string {
	for _, k := range keys {
		if _, ok := o.vals[k]; ok {
			return k
		}
	}
	return ""
}

func (o *object) has(keys ...string) bool {
	for _, k := range keys {
		if _, ok := o.vals[k]; ok {
			return true
		}
	}
	return false
}

// decodeOrdered decodes one JSON value, objects as *object.
func decodeOrdered(dec *json.Decoder) (any, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t {
	case json.Delim('{'):
		o := &object{vals: map[string]any{}}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			key := k.(string)
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			if _, dup := o.vals[key]; dup {
				return nil, fmt.Errorf("key %q twice in one object", key)
			}
			o.keys = append(o.keys, key)
			o.vals[key] = v
		}
		_, err = dec.Token()
		return o, err
	case json.Delim('['):
		list := []any{}
		for dec.More() {
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		_, err = dec.Token()
		return list, err
	}
	return t, nil
}

// marshal writes v as compact JSON: objects' keys in their order, strings
// without HTML escapes.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := writeJSON(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeJSON(b *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case *object:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJSON(b, k); err != nil {
				return err
			}
			b.WriteByte(':')
			if err := writeJSON(b, v.vals[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJSON(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	default:
		e := json.NewEncoder(b)
		e.SetEscapeHTML(false)
		if err := e.Encode(v); err != nil {
			return err
		}
		b.Truncate(b.Len() - 1) // Encode's newline
	}
	return nil
}

// stringPattern reads a string's pattern or format into its automaton,
// built once for the strings of a schema that share it.
func (c *compiler) stringPattern(o *object, n *node, path string) error {
	k := o.first("pattern", "format")
	if k == "" {
		return nil
	}
	if o.has("pattern") && o.has("format") {
		return fmt.Errorf("%s: pattern beside format is not supported: write the format into the pattern", path)
	}
	if n.bounded() {
		return fmt.Errorf("%s: %s beside minLength or maxLength is not supported: write the length into the pattern (as .{2,12})", path, k)
	}
	v, ok := o.vals[k].(string)
	if !ok {
		return fmt.Errorf("%s: %s is not a string", path, k)
	}
	src := v
	if k == "format" {
		if src, ok = formats[v]; !ok {
			return fmt.Errorf("%s: format %q is not supported (%s are)", path, v, strings.Join(slices.Sorted(maps.Keys(formats)), ", "))
		}
	}
	d, ok := c.pats[src]
	if !ok {
		var err error
		if d, err = compilePattern(src); err != nil {
			return fmt.Errorf("%s: pattern %q: %w", path, v, err)
		}
		c.pats[src] = d
	}
	n.pat = d
	return nil
}

// multipleOf reads a number's multipleOf into n.mult: for an integer, the
// least positive integer whose multiples are the integers it divides (the
// numerator of the fraction it is: 2.5 allows the multiples of 5); for a
// number, itself in millionths. The digits of a multiple are checked
// against the limits' state, so a side without a limit takes the most
// one may be (±1e13 for integers, ±1e9 for numbers).
func multipleOf(o *object, n *node, path string) error {
	v, ok := o.vals["multipleOf"]
	if !ok {
		return nil
	}
	num, ok := v.(json.Number)
	r, isRat := new(big.Rat), false
	if ok {
		r, isRat = r.SetString(num.String())
	}
	if !isRat || r.Sign() <= 0 {
		return fmt.Errorf("%s: multipleOf is %v, want a positive number", path, v)
	}
	limit := int64(maxLimit)
	if n.kind == kInteger {
		r.SetInt(r.Num())
	} else {
		limit = maxDecLimit * decUnit
		r.Mul(r, big.NewRat(decUnit, 1))
	}
	if !r.IsInt() || r.Num().CmpAbs(big.NewInt(limit)) > 0 {
		if n.kind == kInteger {
			return fmt.Errorf("%s: multipleOf is %s, want at most 1e13", path, num)
		}
		return fmt.Errorf("%s: multipleOf is %s, want at most 1e9 with at most six digits after the point", path, num)
	}
	n.mult = r.Num().Int64()
	if n.limits&limMin == 0 {
		n.min, n.limits = -limit, n.limits|limMin
	}
	if n.limits&limMax == 0 {
		n.max, n.limits = limit, n.limits|limMax
	}
	lo := ceilMultiple(n.min, n.mult)
	if lo == n.min && n.limits&limMinEx != 0 {
		lo += n.mult
	}
	if lo > n.max || lo == n.max && n.limits&limMaxEx != 0 {
		return fmt.Errorf("%s: no multiple of %s lies within the bounds", path, num)
	}
	return nil
}
