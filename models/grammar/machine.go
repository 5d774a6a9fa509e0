package grammar

import "bytes"

// The phases of a frame: where in its value the text is.
const (
	pStart    uint8 = iota // before the value: whitespace, then its first byte
	pKeyOrEnd              // an object, after '{'
	pKey                   // an object, after ','
	pKeyIn                 // an object, in a key (rep the first candidate, pos bytes in)
	pColon                 // an object, after a key (rep the property)
	pAfter                 // an object or array, after a member
	pFirst                 // an array, after '['
	pNext                  // an array, after ','
	pSub                   // a value the byte scanner takes (any value, strings, numbers)
	pLit                   // in a literal (rep the first candidate, pos bytes in)
)

// maxFrames bounds the values open at once.
const maxFrames = MaxDepth

// frame is one open value of the document.
type frame struct {
	node  int32
	phase uint8
	idx   uint16 // an object's next property that may come; an array's items so far
	rep   uint16
	pos   uint16
}

// link is a frame below the top, with those below it: interned by their
// grammar, so that equal stacks are one pointer and states compare equal.
type link struct {
	f  frame
	up *link
}

// state is where a document's text has come in a grammar: a small value,
// copied freely, and the key of the mask cache.
type state struct {
	top frame
	up  *link
	n   uint16 // open frames; 0 once the document is whole
	sub scan   // the byte scanner of a pSub frame
	ws  uint8  // whitespace bytes in a row between values
	num uint64 // a bounded number's sign, digits and point so far (addDigit, addDec)
}

// inString reports whether the text is inside a string, where a plain
// byte (printable ASCII but '"' and '\\') changes the state at most by
// the count of a bounded string's characters (plain).
func (s *state) inString() bool { return s.n > 0 && s.top.phase == pSub && s.sub.mode == mString }

func (g *Grammar) start() state { return state{top: frame{node: g.s.root}, n: 1} }

func (g *Grammar) intern(l link) *link {
	g.linkMu.Lock()
	defer g.linkMu.Unlock()
	if p, ok := g.links[l]; ok {
		return p
	}
	if len(g.links) >= g.maxLinks {
		// States that hold the old links stay right; they only miss the
		// masks cached for equal states under the new ones.
		clear(g.links)
	}
	p := &l
	g.links[l] = p
	return p
}

// depth is the objects and arrays open around a structural byte of the top
// frame: the frames, less one where the top frame's value has not begun.
func (g *Grammar) depth(s *state) int {
	if s.top.phase == pStart {
		return int(s.n) - 1
	}
	return int(s.n)
}

// push opens a value of node child above the top frame.
func (g *Grammar) push(s *state, child int32) bool {
	if s.n >= maxFrames {
		return false
	}
	s.up = g.intern(link{f: s.top, up: s.up})
	s.top = frame{node: child}
	s.n++
	return true
}

// pop closes the top frame's value.
func (g *Grammar) pop(s *state) {
	s.sub, s.num = scan{}, 0
	if s.up == nil {
		s.top, s.n = frame{}, 0
		return
	}
	s.top, s.up = s.up.f, s.up.up
	s.n--
}

// step scans one byte and reports whether the text is still a prefix of a
// document of the grammar. On false, s is not to be used.
func (g *Grammar) step(s *state, c byte) bool {
	if s.n == 0 {
		return false
	}
	f := &s.top
	nd := &g.s.nodes[f.node]
	switch f.phase {
	case pSub:
		if nd.kind == kInteger && s.sub.inNumber() && (c == '.' || c == 'e' || c == 'E') {
			return false
		}
		if nd.kind == kString && nd.bounded() && !g.length(s, nd, c) {
			return false
		}
		if nd.kind == kString && nd.pat != nil && !g.pattern(s, nd, c) {
			return false
		}
		if nd.kind == kNumber && nd.limits != 0 && !g.decimal(s, nd, c) {
			return false
		}
		if nd.kind == kInteger && nd.limits != 0 && !g.integer(s, nd, c) {
			return false
		}
		t := s.sub
		if t.step(c) {
			s.sub = t
			if t.mode == mDone {
				g.pop(s)
			}
			return true
		}
		if s.sub.numberEnds() {
			g.pop(s)
			return g.step(s, c)
		}
		return false
	case pLit:
		return g.literal(s, c)
	case pKeyIn:
		return g.key(s, c)
	}
	if isSpace(c) {
		// Not before the document's first byte.
		if s.n == 1 && s.up == nil && f.phase == pStart {
			return false
		}
		var ok bool
		s.ws, ok = moreSpace(s.ws, c, g.depth(s), g.s.compact)
		return ok
	}
	s.ws = 0
	switch f.phase {
	case pStart:
		return g.begin(s, c, 0)
	case pKeyOrEnd, pKey:
		if c == '}' && f.phase == pKeyOrEnd && int(f.idx) > nd.lastRequired && nd.minItems == 0 {
			g.pop(s)
			return true
		}
		for k := int(f.idx); k < len(nd.props); k++ {
			if nd.props[k].key[0] == c {
				f.phase, f.rep, f.pos = pKeyIn, uint16(k), 1
				return true
			}
			if nd.props[k].required {
				break
			}
		}
		return false
	case pColon:
		if c != ':' {
			return false
		}
		child := nd.props[f.rep].node
		f.phase, f.rep, f.pos = pAfter, 0, 0
		return g.push(s, child)
	case pAfter:
		if nd.kind == kObject {
			switch {
			case c == ',' && int(f.idx) < len(nd.props) && nd.maxItems != 1:
				f.phase = pKey
				return true
			case c == '}' && int(f.idx) > nd.lastRequired:
				g.pop(s)
				return true
			}
			return false
		}
		switch {
		case c == ',' && (nd.maxItems < 0 || int(f.idx) < nd.maxItems):
			f.phase = pNext
			return true
		case c == ']' && int(f.idx) >= nd.minItems:
			g.pop(s)
			return true
		}
		return false
	case pFirst, pNext:
		if c == ']' && f.phase == pFirst && nd.minItems == 0 {
			g.pop(s)
			return true
		}
		if nd.maxItems >= 0 && int(f.idx) >= nd.maxItems {
			return false
		}
		// The count matters up to the larger bound only, which keeps an
		// unbounded array's states alike from item to item.
		f.phase = pAfter
		f.idx = uint16(min(int(f.idx)+1, max(nd.minItems, nd.maxItems)))
		if !g.push(s, nd.items) {
			return false
		}
		return g.step(s, c)
	}
	return false
}

// begin takes the first byte of the top frame's value; hops counts the
// unions passed, against a schema whose references go round in a circle.
func (g *Grammar) begin(s *state, c byte, hops int) bool {
	f := &s.top
	nd := &g.s.nodes[f.node]
	switch nd.kind {
	case kAnyObject:
		if c != '{' {
			return false
		}
		s.sub = scan{mode: mTop, compact: g.s.compact}
	case kAny:
		s.sub = scan{mode: mValue, compact: g.s.compact}
	case kString:
		if c != '"' {
			return false
		}
		s.sub, s.num = scan{mode: mValue, compact: g.s.compact}, 0
	case kNumber, kInteger:
		if c != '-' && (c < '0' || c > '9') {
			return false
		}
		s.sub, s.num = scan{mode: mValue, compact: g.s.compact}, 0
	case kObject:
		if c != '{' {
			return false
		}
		f.phase = pKeyOrEnd
		return true
	case kArray:
		if c != '[' {
			return false
		}
		f.phase = pFirst
		return true
	case kLiterals:
		for k, l := range nd.lits {
			if l[0] == c {
				f.phase, f.rep, f.pos = pLit, uint16(k), 1
				g.literalEnds(s)
				return true
			}
		}
		return false
	case kUnion:
		if hops > len(g.s.nodes) {
			return false
		}
		for _, a := range nd.alts {
			if g.s.nodes[a].first.has(c) {
				f.node = a
				return g.begin(s, c, hops+1)
			}
		}
		return false
	default:
		return false
	}
	f.phase = pSub
	return g.step(s, c)
}

// literal takes a byte of one of a literal node's texts.
func (g *Grammar) literal(s *state, c byte) bool {
	f := &s.top
	lits := g.s.nodes[f.node].lits
	pre := lits[f.rep][:f.pos]
	for k := int(f.rep); k < len(lits) && bytes.HasPrefix(lits[k], pre); k++ {
		if len(lits[k]) > int(f.pos) && lits[k][f.pos] == c {
			f.rep, f.pos = uint16(k), f.pos+1
			g.literalEnds(s)
			return true
		}
	}
	if len(lits[f.rep]) == int(f.pos) {
		// A whole literal that a longer one begins with, ended by c.
		g.pop(s)
		return g.step(s, c)
	}
	return false
}

// literalEnds closes a literal once no longer one can follow its text.
func (g *Grammar) literalEnds(s *state) {
	f := &s.top
	lits := g.s.nodes[f.node].lits
	l := lits[f.rep]
	if int(f.pos) == len(l) && (int(f.rep)+1 == len(lits) || !bytes.HasPrefix(lits[f.rep+1], l)) {
		g.pop(s)
	}
}

// key takes a byte of a property's key: the candidates are the properties
// from the frame's next one to the first required one.
func (g *Grammar) key(s *state, c byte) bool {
	f := &s.top
	props := g.s.nodes[f.node].props
	pre := props[f.rep].key[:f.pos]
	for k := int(f.idx); k < len(props); k++ {
		key := props[k].key
		if len(key) > int(f.pos) && key[f.pos] == c && bytes.HasPrefix(key, pre) {
			f.rep, f.pos = uint16(k), f.pos+1
			if int(f.pos) == len(key) {
				f.phase, f.idx, f.pos = pColon, uint16(k+1), 0
			}
			return true
		}
		if props[k].required {
			break
		}
	}
	return false
}
