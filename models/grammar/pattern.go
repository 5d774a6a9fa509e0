package grammar

import (
	"encoding/binary"
	"fmt"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode/utf8"
)

// A string's pattern (or format) runs as a deterministic automaton over
// the string's characters, built whole when the schema is compiled: the
// regular expression is parsed by regexp/syntax (RE2's syntax, which
// JSON Schema's ECMA-262 patterns mostly share; lookarounds and
// backreferences are refused there), compiled to its instruction program,
// and the sets of instructions a text can reach become states. Characters
// fall into classes that no instruction tells apart, so a state's
// transitions are one row of a table. States from which no accepted text
// can follow are dropped, so that constrained decoding never writes a
// prefix it cannot finish.

// Limits on a pattern's automaton.
const (
	maxPatternStates  = 4096
	maxPatternClasses = 8192
	maxPatternTable   = 1 << 20
	maxPatternWork    = 1 << 24 // instructions visited while building
)

// dfa is a pattern's automaton. State 0 is the start; next holds, for
// each state and character class, the state after a character of it, or
// -1 where no accepted text follows.
type dfa struct {
	bounds  []rune // class i holds the characters from bounds[i] up to bounds[i+1]
	ascii   [128]int32
	classes int
	next    []int32
	accept  []bool // the text so far matches
}

// class is the character class of r.
func (d *dfa) class(r rune) int {
	if r >= 0 && r < 128 {
		return int(d.ascii[r])
	}
	i, _ := slices.BinarySearch(d.bounds, r+1)
	return i - 1
}

// step is the state after character r in state st, or -1.
func (d *dfa) step(st int32, r rune) int32 {
	return d.next[int(st)*d.classes+d.class(r)]
}

// live reports whether some character from lo to hi leads on from state
// st.
func (d *dfa) live(st int32, lo, hi rune) bool {
	lo, hi = max(lo, 0), min(hi, utf8.MaxRune)
	if lo > hi {
		return false
	}
	row := d.next[int(st)*d.classes : (int(st)+1)*d.classes]
	for c := d.class(lo); c < d.classes && d.bounds[c] <= hi; c++ {
		if row[c] >= 0 {
			return true
		}
	}
	return false
}

// liveUnits reports whether some character written as a \u escape whose
// 16-bit unit lies from lo to hi (a high surrogate standing for the pairs
// it begins) leads on from state st.
func (d *dfa) liveUnits(st int32, lo, hi rune) bool {
	if d.live(st, lo, min(hi, 0xD7FF)) || d.live(st, max(lo, 0xE000), hi) {
		return true
	}
	a, b := max(lo, 0xD800), min(hi, 0xDBFF)
	return a <= b && d.live(st, 0x10000+(a-0xD800)<<10, 0x10000+(b-0xD800)<<10+0x3FF)
}

// formats are the string formats taken, as patterns of the texts JSON
// Schema's format names (RFC 3339 dates, times and durations, without
// leap seconds or February 29; UUIDs; dotted-quad IPv4; IPv6 without an embedded IPv4
// address; hostnames of up to four labels; addresses of a common shape;
// RFC 3986 URIs and URI references, and RFC 3987 IRIs and IRI references,
// an IP literal's IPv6 as ipv6's; RFC 6570 URI templates of ASCII
// literals; RFC 6901 JSON pointers and their relative kind): each matches
// only valid texts, not every one.
var (
	uri, relRef = uriPatterns("", "")
	iri, relIRI = uriPatterns(fmtUCS, fmtPrivate)
)

var formats = map[string]string{
	"uri":                   `^` + uri + `$`,
	"uri-reference":         `^(` + uri + `|` + relRef + `)$`,
	"iri":                   `^` + iri + `$`,
	"iri-reference":         `^(` + iri + `|` + relIRI + `)$`,
	"json-pointer":          `^` + fmtPointer + `$`,
	"uri-template":          `^(` + fmtTemplateLiteral + `|` + fmtTemplateExpr + `)*$`,
	"relative-json-pointer": `^(0|[1-9][0-9]*)(#|` + fmtPointer + `)$`,
	"date":                  `^` + fmtDate + `$`,
	"time":                  `^` + fmtTime + `$`,
	"date-time":             `^` + fmtDate + `T` + fmtTime + `$`,
	"uuid":                  `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`,
	"ipv4":                  `^(` + fmtOctet + `\.){3}` + fmtOctet + `$`,
	"ipv6":                  `^(` + fmtIPv6Lit + `)$`,
	"hostname":              `^` + fmtLabel + `(\.` + fmtLabel + `){0,3}$`,
	"duration":              `^P(` + fmtDurDate + `(T` + fmtDurTime + `)?|T` + fmtDurTime + `|[0-9]+W)$`,
	"email":                 `^[A-Za-z0-9_+-]{1,32}(\.[A-Za-z0-9_+-]{1,15})?@([A-Za-z0-9]([A-Za-z0-9-]{0,20}[A-Za-z0-9])?\.){1,3}[A-Za-z]{2,12}$`,
}

const (
	fmtDate  = `[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))`
	fmtTime  = `([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])`
	fmtOctet = `(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])`
	// Eight groups of hex digits (H), or fewer around one "::".
	fmtIPv6 = `(H:){7}H|(H:){1,7}:|(H:){1,6}:H|(H:){1,5}(:H){1,2}|(H:){1,4}(:H){1,3}|(H:){1,3}(:H){1,4}|` +
		`(H:){1,2}(:H){1,5}|H:(:H){1,6}|:((:H){1,7}|:)`
	// RFC 3339's durations (its appendix A): the date's and the time's
	// parts in order, none skipped between the first and the last.
	fmtDurDate = `([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)`
	fmtDurTime = `([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)`
	// A label of at most 61 characters, so that four and their dots stay
	// within a hostname's 253.
	fmtLabel = `[A-Za-z0-9]([A-Za-z0-9-]{0,59}[A-Za-z0-9])?`

	// RFC 6901: "/"-led tokens, "~" escaped as "~0" and "/" as "~1".
	fmtPointer = `(/([^/~]|~[01])*)*`

	// RFC 6570's URI templates: literals (ASCII less controls, space and
	// "'%<>\^`{|}, and percent-encodings) and expressions, {op?varspec,...},
	// a varspec a name of varchars joined by dots, with a prefix length or
	// an explode.
	fmtTemplateLiteral = `([!#$&()*+,\-./0-9:;=?@A-Z\[\]_a-z~]|` + fmtPctEnc + `)`
	fmtVarchar         = `([A-Za-z0-9_]|` + fmtPctEnc + `)`

	// A percent-encoded byte, in URIs and URI templates.
	fmtPctEnc       = `%[0-9A-Fa-f]{2}`
	fmtVarspec      = fmtVarchar + `(\.?` + fmtVarchar + `)*(:[1-9][0-9]{0,3}|\*)?`
	fmtTemplateExpr = `\{[+#./;?&=,!@|]?` + fmtVarspec + `(,` + fmtVarspec + `)*\}`
)

// Characters RFC 3987 adds to URIs' (ucschar), and those it adds to a
// query's (iprivate): code points beyond ASCII, less surrogates, planes'
// last two code points and the private use areas.
const (
	fmtUCS = `\x{A0}-\x{D7FF}\x{F900}-\x{FDCF}\x{FDF0}-\x{FFEF}\x{10000}-\x{1FFFD}\x{20000}-\x{2FFFD}\x{30000}-\x{3FFFD}` +
		`\x{40000}-\x{4FFFD}\x{50000}-\x{5FFFD}\x{60000}-\x{6FFFD}\x{70000}-\x{7FFFD}\x{80000}-\x{8FFFD}\x{90000}-\x{9FFFD}` +
		`\x{A0000}-\x{AFFFD}\x{B0000}-\x{BFFFD}\x{C0000}-\x{CFFFD}\x{D0000}-\x{DFFFD}\x{E1000}-\x{EFFFD}`
	fmtPrivate = `\x{E000}-\x{F8FF}\x{F0000}-\x{FFFFD}\x{100000}-\x{10FFFD}`
)

// uriPatterns are RFC 3986's URI and relative reference (with ucs and
// private, RFC 3987's IRI and relative IRI reference: the characters ucs
// adds to the unreserved ones, and those private adds to a query's).
func uriPatterns(ucs, private string) (uri, relRef string) {
	unres := `A-Za-z0-9._~` + ucs // and '-', last in each class
	// A path's characters (pchar) without ':' (a relative reference's
	// first segment takes none), then with it, and a query's and a
	// fragment's.
	segNC := `([` + unres + `!$&'()*+,;=@-]|` + fmtPctEnc + `)`
	pchar := `([` + unres + `!$&'()*+,;=:@-]|` + fmtPctEnc + `)`
	query := `([` + unres + private + `!$&'()*+,;=:@/?-]|` + fmtPctEnc + `)*`
	frag := `([` + unres + `!$&'()*+,;=:@/?-]|` + fmtPctEnc + `)*`
	host := `(\[(` + fmtIPv6Lit + `|v[0-9A-Fa-f]+\.[A-Za-z0-9._~!$&'()*+,;=:-]+)\]|([` + unres + `!$&'()*+,;=-]|` + fmtPctEnc + `)*)`
	auth := `(([` + unres + `!$&'()*+,;=:-]|` + fmtPctEnc + `)*@)?` + host + `(:[0-9]*)?`
	abempty := `(/` + pchar + `*)*`
	tail := `)?(\?` + query + `)?(#` + frag + `)?`
	// A hierarchical part after "scheme:": an authority and its path, an
	// absolute path, a rootless one or none; then a query and a fragment.
	uri = `[A-Za-z][A-Za-z0-9+.-]*:(//` + auth + abempty + `|/(` + pchar + `+` + abempty + `)?|` + pchar + `+` + abempty + tail
	// A relative reference: as a URI's hierarchical part without its
	// scheme, its first segment taking no ':'.
	relRef = `(//` + auth + abempty + `|/(` + pchar + `+` + abempty + `)?|` + segNC + `+` + abempty + tail
	return uri, relRef
}

// fmtIPv6Lit is an IP literal's IPv6 address, as the ipv6 format's.
var fmtIPv6Lit = strings.ReplaceAll(fmtIPv6, "H", `[0-9A-Fa-f]{1,4}`)

// compilePattern builds the automaton of the strings pattern matches
// somewhere (JSON Schema's patterns are not anchored; ^ and $ anchor
// them).
func compilePattern(pattern string) (*dfa, error) {
	re, err := syntax.Parse(ecmaEscapes(pattern), syntax.Perl)
	if err != nil {
		return nil, err
	}
	if err := asECMA(re); err != nil {
		return nil, err
	}
	anyText := &syntax.Regexp{Op: syntax.OpStar, Sub: []*syntax.Regexp{{Op: syntax.OpAnyChar}}}
	whole := &syntax.Regexp{Op: syntax.OpConcat, Sub: []*syntax.Regexp{anyText, re, anyText}}
	prog, err := syntax.Compile(whole.Simplify())
	if err != nil {
		return nil, err
	}
	return buildDFA(prog)
}

// ecmaEscapes writes ECMA-262's \uXXXX escapes as RE2's \x{XXXX}.
func ecmaEscapes(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] != '\\' || i+1 >= len(p) {
			b.WriteByte(p[i])
			continue
		}
		if p[i+1] == 'u' && i+6 <= len(p) && isHexString(p[i+2:i+6]) {
			b.WriteString(`\x{` + p[i+2:i+6] + `}`)
			i += 5
			continue
		}
		b.WriteString(p[i : i+2])
		i++
	}
	return b.String()
}

func isHexString(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}

// asECMA makes '.' ECMA-262's, which takes no line terminator (\n, \r,
// U+2028, U+2029), and refuses what RE2 reads otherwise than ECMA-262:
// case folding, multi-line anchors and word boundaries.
func asECMA(re *syntax.Regexp) error {
	switch re.Op {
	case syntax.OpAnyCharNotNL:
		re.Op = syntax.OpCharClass
		re.Rune = []rune{0, '\n' - 1, '\n' + 1, '\r' - 1, '\r' + 1, 0x2027, 0x202A, utf8.MaxRune}
	case syntax.OpBeginLine, syntax.OpEndLine:
		return fmt.Errorf("multi-line anchors are not supported")
	case syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return fmt.Errorf(`word boundaries (\b, \B) are not supported`)
	}
	if re.Flags&syntax.FoldCase != 0 && (re.Op == syntax.OpLiteral || re.Op == syntax.OpCharClass) {
		return fmt.Errorf("case-insensitive matching is not supported")
	}
	for _, s := range re.Sub {
		if err := asECMA(s); err != nil {
			return err
		}
	}
	return nil
}

// buildDFA runs the subset construction over prog's instructions.
func buildDFA(prog *syntax.Prog) (*dfa, error) {
	// The class bounds: every range's ends, and the surrogates, which no
	// string holds as characters.
	cuts := []rune{0, 0xD800, 0xE000, utf8.MaxRune + 1}
	for _, in := range prog.Inst {
		switch in.Op {
		case syntax.InstRune:
			for i := 0; i+1 < len(in.Rune); i += 2 {
				cuts = append(cuts, in.Rune[i], in.Rune[i+1]+1)
			}
			if len(in.Rune) == 1 {
				cuts = append(cuts, in.Rune[0], in.Rune[0]+1)
			}
		case syntax.InstRune1:
			cuts = append(cuts, in.Rune[0], in.Rune[0]+1)
		case syntax.InstRuneAnyNotNL:
			cuts = append(cuts, '\n', '\n'+1)
		case syntax.InstEmptyWidth:
			if syntax.EmptyOp(in.Arg)&^(syntax.EmptyBeginText|syntax.EmptyEndText) != 0 {
				return nil, fmt.Errorf("only ^ and $ anchors are supported")
			}
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	d := &dfa{bounds: cuts[:len(cuts)-1]}
	d.classes = len(d.bounds)
	if d.classes > maxPatternClasses {
		return nil, fmt.Errorf("the pattern tells %d kinds of characters apart, at most %d are supported", d.classes, maxPatternClasses)
	}
	for r := range d.ascii {
		i, _ := slices.BinarySearch(d.bounds, rune(r)+1)
		d.ascii[r] = int32(i - 1)
	}

	// A state is the sorted set of the instructions that consume a
	// character, match, or wait for the end of the text. work counts the
	// instructions visited, against a pattern that would take long.
	seen := make([]uint32, len(prog.Inst))
	gen, work := uint32(0), 0
	closure := func(pcs []uint32, begin, end bool) []uint32 {
		gen++
		var out []uint32
		var visit func(pc uint32)
		visit = func(pc uint32) {
			if seen[pc] == gen {
				return
			}
			seen[pc] = gen
			work++
			in := &prog.Inst[pc]
			switch in.Op {
			case syntax.InstAlt, syntax.InstAltMatch:
				visit(in.Out)
				visit(in.Arg)
			case syntax.InstNop, syntax.InstCapture:
				visit(in.Out)
			case syntax.InstEmptyWidth:
				op := syntax.EmptyOp(in.Arg)
				switch {
				case op&syntax.EmptyBeginText != 0 && !begin: // never again
				case op&syntax.EmptyEndText != 0 && !end:
					out = append(out, pc) // waits for the end
				default:
					visit(in.Out)
				}
			case syntax.InstFail:
			default:
				out = append(out, pc)
			}
		}
		for _, pc := range pcs {
			visit(pc)
		}
		slices.Sort(out)
		return out
	}
	matches := func(set []uint32, begin bool) bool {
		for _, pc := range closure(set, begin, true) {
			if prog.Inst[pc].Op == syntax.InstMatch {
				return true
			}
		}
		return false
	}
	// The start state is keyed apart: at the start, a wait for the end may
	// also meet an anchor to the beginning.
	key := func(set []uint32) string {
		b := make([]byte, 0, 4*len(set))
		for _, pc := range set {
			b = binary.LittleEndian.AppendUint32(b, pc)
		}
		return string(b)
	}
	sets := [][]uint32{closure([]uint32{uint32(prog.Start)}, true, false)}
	ids := map[string]int32{"start": 0}
	for i := 0; i < len(sets); i++ {
		d.accept = append(d.accept, matches(sets[i], i == 0))
		for c := range d.classes {
			r := d.bounds[c]
			if r >= 0xD800 && r < 0xE000 {
				d.next = append(d.next, -1)
				continue
			}
			if work += len(sets[i]); work > maxPatternWork {
				return nil, fmt.Errorf("the pattern is too complex for constrained decoding")
			}
			var outs []uint32
			for _, pc := range sets[i] {
				in := &prog.Inst[pc]
				ok := false
				switch in.Op {
				case syntax.InstRune, syntax.InstRune1:
					ok = in.MatchRune(r)
				case syntax.InstRuneAny:
					ok = true
				case syntax.InstRuneAnyNotNL:
					ok = r != '\n'
				}
				if ok {
					outs = append(outs, in.Out)
				}
			}
			if len(outs) == 0 {
				d.next = append(d.next, -1)
				continue
			}
			set := closure(outs, false, false)
			k := key(set)
			id, ok := ids[k]
			if !ok {
				if len(sets) >= maxPatternStates || len(d.next) >= maxPatternTable {
					return nil, fmt.Errorf("the pattern needs more than %d states, too many for constrained decoding", maxPatternStates)
				}
				id = int32(len(sets))
				ids[k] = id
				sets = append(sets, set)
			}
			d.next = append(d.next, id)
		}
	}
	// Keep the states from which an accepting one can be reached: a
	// search back from the accepting states along the transitions.
	into := make([][]int32, len(sets)) // into[n]: the states with a transition to n
	for i, n := range d.next {
		if n >= 0 {
			into[n] = append(into[n], int32(i/d.classes))
		}
	}
	live := slices.Clone(d.accept)
	var queue []int32
	for st, ok := range live {
		if ok {
			queue = append(queue, int32(st))
		}
	}
	for len(queue) > 0 {
		n := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		for _, st := range into[n] {
			if !live[st] {
				live[st] = true
				queue = append(queue, st)
			}
		}
	}
	if !live[0] {
		return nil, fmt.Errorf("the pattern matches no string")
	}
	for i, n := range d.next {
		if n >= 0 && !live[n] {
			d.next[i] = -1
		}
	}
	return d, nil
}

// A patterned string keeps in state.num its automaton's state, and the
// character being read: its bits so far (UTF-8 or a \u escape's digits),
// and a high surrogate's bits that must be followed by a low one.
const (
	patState = 1<<24 - 1
	patAccAt = 24
	patAcc   = 1<<21 - 1
	patHiAt  = 45
	patHi    = 1<<10 - 1
	patHiSet = 1 << 55
)

// pattern takes byte c of a string of node nd with a pattern, before the
// scanner does: each character, once whole, moves the automaton, and the
// closing quote needs it in an accepting state. A byte inside a character
// (of UTF-8, or of an escape) is taken only while some character it may
// begin leads on.
func (g *Grammar) pattern(s *state, nd *node, c byte) bool {
	d := nd.pat
	st := int32(s.num & patState)
	acc := rune(s.num >> patAccAt & patAcc)
	hi := s.num & (patHiSet | patHi<<patHiAt)
	// pair is the characters the pending high surrogate's pairs stand for.
	pair := 0x10000 + rune(hi>>patHiAt&patHi)<<10
	put := func(acc rune, hi uint64) {
		s.num = uint64(st) | uint64(acc)<<patAccAt | hi
	}
	char := func(r rune) bool {
		if st = d.step(st, r); st < 0 {
			return false
		}
		put(0, 0)
		return true
	}
	// lead takes the bits of a multi-byte character's first byte, with
	// more bytes to come, while some such character leads on.
	lead := func(bits rune, more int, least rune) bool {
		lo := bits << (6 * more)
		put(bits, 0)
		return d.live(st, max(lo, least), lo|(1<<(6*more)-1))
	}
	switch s.sub.mode {
	case mString:
		switch {
		case hi != 0:
			return c == '\\' // a high surrogate escape needs its low half
		case c == '"':
			return d.accept[st]
		case c == '\\':
			return d.live(st, 0, utf8.MaxRune)
		case c < 0x80:
			return char(rune(c))
		case c < 0xE0:
			return lead(rune(c&0x1F), 1, 0x80)
		case c < 0xF0:
			return lead(rune(c&0x0F), 2, 0x800)
		}
		return lead(rune(c&0x07), 3, 0x10000)
	case mUTF8:
		acc = acc<<6 | rune(c&0x3F)
		if more := int(s.sub.n) - 1; more > 0 {
			put(acc, 0)
			return d.live(st, acc<<(6*more), acc<<(6*more)|(1<<(6*more)-1))
		}
		return char(acc)
	case mEscape:
		switch {
		case c == 'u' && hi != 0:
			put(0, hi)
			return d.live(st, pair, pair+0x3FF)
		case hi != 0:
			return false
		case c == 'u':
			put(0, 0)
			return d.live(st, 0, utf8.MaxRune)
		case c == 'b':
			return char('\b')
		case c == 'f':
			return char('\f')
		case c == 'n':
			return char('\n')
		case c == 'r':
			return char('\r')
		case c == 't':
			return char('\t')
		}
		return char(rune(c)) // '"', '\\' and '/' stand for themselves
	case mHex:
		v, ok := hexDigit(c)
		if !ok {
			return false
		}
		acc = acc<<4 | rune(v)
		if more := 3 - int(s.sub.n); more > 0 {
			lo, top := acc<<(4*more), acc<<(4*more)|(1<<(4*more)-1)
			put(acc, hi)
			if hi != 0 {
				return d.live(st, pair+max(lo, 0xDC00)-0xDC00, pair+min(top, 0xDFFF)-0xDC00)
			}
			return d.liveUnits(st, lo, top)
		}
		switch {
		case hi != 0:
			return acc >= 0xDC00 && acc <= 0xDFFF && char(pair+acc-0xDC00)
		case acc >= 0xD800 && acc <= 0xDBFF:
			hi = patHiSet | uint64(acc-0xD800)<<patHiAt
			put(0, hi)
			return d.live(st, 0x10000+(acc-0xD800)<<10, 0x10000+(acc-0xD800)<<10+0x3FF)
		case acc >= 0xDC00 && acc <= 0xDFFF:
			return false // a low surrogate alone
		}
		return char(acc)
	}
	return true
}
