package gateway

import "strings"

// Reasoning: a model whose chat template thinks (ModelInfo.Reasoning:
// Qwen 3's, DeepSeek-R1's) writes its reasoning between <think> and
// </think> before its answer. A chat answer carries the reasoning apart,
// as reasoning_content (vLLM's and DeepSeek's field), and the answer alone
// as content, where tool calls are read.

const (
	thinkOpen  = "<think>"
	thinkClose = "</think>"
)

// thinkStream splits a choice's text into reasoning and content as it
// comes; the whole text goes through it the same way.
type thinkStream struct {
	state int8 // thinkBlank, ...
	// inThink says the prompt ends inside <think> (the template opened it,
	// as DeepSeek-R1's does), so the text starts in the reasoning.
	inThink bool
	held    strings.Builder
	// With countToken: the tokens of the reasoning, and those still blank
	// (the reasoning's if it opens, nobody's if the content does).
	tokens, blank int
}

// The states of a thinkStream: the spaces that open the reasoning and the
// content are neither's.
const (
	thinkBlank      int8 = iota // nothing but spaces yet
	reasoningStarts             // in the reasoning, before its first other byte
	inReasoning                 // in the reasoning
	contentStarts               // after </think>, before the content's first other byte
	inContent                   // in the content
)

// newThinkStream is the splitter of a job's choices: nil where the model
// does not think.
func (j *job) newThinkStream() *thinkStream {
	if !j.model.Reasoning {
		return nil
	}
	return &thinkStream{inThink: j.inThink}
}

// split divides a choice's whole text into its reasoning and its content.
func (j *job) split(text string) (reasoning, content string) {
	s := j.newThinkStream()
	r1, c1 := s.push(text)
	r2, c2 := s.end()
	return r1 + r2, c1 + c2
}

// answer reads a choice's whole text: its reasoning, and its content and
// the calls it makes (toolPlan.calls).
func (j *job) answer(text string) (reasoning, content string, calls []ToolCall) {
	reasoning, content = j.split(text)
	content, calls = j.tools.calls(content)
	return reasoning, content, calls
}

// answerStream reads a chat choice's text as it comes, as answer reads it
// whole: the reasoning apart (thinkStream), then the content's calls
// (callStream).
type answerStream struct {
	think *thinkStream
	calls callStream
}

func (j *job) newAnswerStream() *answerStream {
	return &answerStream{think: j.newThinkStream(), calls: callStream{plan: &j.tools}}
}

// push takes a token's text and returns the reasoning, content and call
// deltas to send.
func (a *answerStream) push(text string) (reasoning, content string, calls []toolCallOut) {
	reasoning, content = a.think.push(text)
	content, calls = a.calls.push(content)
	return reasoning, content, calls
}

// end takes the text held for a stop string and returns what is left to
// send, and whether the choice made calls.
func (a *answerStream) end(tail string) (reasoning, content string, calls []toolCallOut, called bool) {
	r1, c1 := a.think.push(tail)
	r2, c2 := a.think.end()
	content, calls, called = a.calls.end(c1 + c2)
	return r1 + r2, content, calls, called
}

// countToken takes a token's text, to count the tokens of the reasoning:
// its opening, its text and its close. A nil stream counts nothing.
func (s *thinkStream) countToken(text string) {
	if s == nil {
		return
	}
	before := s.state
	s.push(text)
	switch {
	case s.state == thinkBlank:
		s.blank++
	case s.state == reasoningStarts || s.state == inReasoning,
		before == reasoningStarts || before == inReasoning, // its close
		before == thinkBlank && s.state != inContent:       // opened and closed at once
		s.tokens += s.blank + 1
		s.blank = 0
	default:
		s.blank = 0
	}
}

// reasoningTokens is what countToken counted.
func (s *thinkStream) reasoningTokens() int {
	if s == nil {
		return 0
	}
	return s.tokens
}

// push takes text and returns the reasoning and the content it settles.
// A nil stream passes every text as content.
func (s *thinkStream) push(text string) (reasoning, content string) {
	if s == nil {
		return "", text
	}
	s.held.WriteString(text)
	return s.scan(false)
}

// end returns what is left: an unclosed reasoning stays reasoning.
func (s *thinkStream) end() (reasoning, content string) {
	if s == nil {
		return "", ""
	}
	return s.scan(true)
}

func (s *thinkStream) scan(last bool) (reasoning, content string) {
	h := s.held.String()
	s.held.Reset()
	if s.state == thinkBlank {
		t := strings.TrimLeft(h, spaces)
		switch {
		case strings.HasPrefix(t, thinkOpen):
			s.state, h = reasoningStarts, t[len(thinkOpen):]
		case !last && (t == "" || strings.HasPrefix(thinkOpen, t)):
			s.held.WriteString(h) // blank, or the opening's beginning
			return "", ""
		case s.inThink:
			s.state, h = reasoningStarts, t
		default:
			s.state = inContent
		}
	}
	if s.state == reasoningStarts {
		if h = strings.TrimLeft(h, spaces); h == "" {
			return "", ""
		}
		s.state = inReasoning
	}
	if s.state == inReasoning {
		i := strings.Index(h, thinkClose)
		if i < 0 {
			keep := 0
			if !last {
				// A close's beginning waits, and the spaces before it,
				// which are not the reasoning's.
				keep = suffixOf(h, thinkClose)
				keep += len(h[:len(h)-keep]) - len(strings.TrimRight(h[:len(h)-keep], spaces))
			}
			s.held.WriteString(h[len(h)-keep:])
			return h[:len(h)-keep], ""
		}
		reasoning, h, s.state = strings.TrimRight(h[:i], spaces), h[i+len(thinkClose):], contentStarts
	}
	if s.state == contentStarts {
		if h = strings.TrimLeft(h, spaces); h == "" {
			return reasoning, ""
		}
		s.state = inContent
	}
	return reasoning, h
}

// suffixOf is the length of the longest proper prefix of tag that ends h.
func suffixOf(h, tag string) int {
	for k := min(len(tag)-1, len(h)); k > 0; k-- {
		if strings.HasSuffix(h, tag[:k]) {
			return k
		}
	}
	return 0
}
