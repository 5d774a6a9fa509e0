package gateway

import "strings"

// stopper applies stop strings to streamed text. Text that could be the beginning of a
// stop string is held back until the next token shows whether it is.
type stopper struct {
	stops []string
	held  string
}

// push adds a token's text and returns the text that may be sent now, and whether a
// stop string matched (the returned text then ends just before it).
func (s *stopper) push(text string) (out string, stopped bool) {
	if len(s.stops) == 0 {
		return text, false
	}
	buf := s.held + text
	at := -1
	for _, st := range s.stops {
		if i := strings.Index(buf, st); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	if at >= 0 {
		s.held = ""
		return buf[:at], true
	}
	keep := 0
	for _, st := range s.stops {
		for k := min(len(st)-1, len(buf)); k > keep; k-- {
			if strings.HasSuffix(buf, st[:k]) {
				keep = k
				break
			}
		}
	}
	s.held = buf[len(buf)-keep:]
	return buf[:len(buf)-keep], false
}

// flush returns the text still held back, at the end of a generation.
func (s *stopper) flush() string {
	h := s.held
	s.held = ""
	return h
}
