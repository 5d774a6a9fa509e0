package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

type usage struct {
	PromptTokens            int               `json:"prompt_tokens"`
	CompletionTokens        int               `json:"completion_tokens"`
	TotalTokens             int               `json:"total_tokens"`
	PromptTokensDetails     *promptDetail     `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *completionDetail `json:"completion_tokens_details,omitempty"`
}

// completionDetail is usage's completion_tokens_details: the tokens of a
// thinking model's reasoning among the completion's.
type completionDetail struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

// promptDetail is usage's prompt_tokens_details: the prompt tokens the
// backend found computed (its prefix cache), not computed for this request.
type promptDetail struct {
	CachedTokens int `json:"cached_tokens"`
}

// Chat completion shapes.

type chatLogprob struct {
	Token       string          `json:"token"`
	Logprob     float32         `json:"logprob"`
	Bytes       []int           `json:"bytes"`
	TopLogprobs []chatTopLogpob `json:"top_logprobs"`
}

type chatTopLogpob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

type chatMessageOut struct {
	Role             string        `json:"role"`
	Content          *string       `json:"content"`
	ReasoningContent *string       `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallOut `json:"tool_calls,omitempty"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatMessageOut `json:"message"`
	Logprobs     *chatLogprobs  `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
}

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

type chatDelta struct {
	Role             string        `json:"role,omitempty"`
	Content          *string       `json:"content,omitempty"`
	ReasoningContent *string       `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallOut `json:"tool_calls,omitempty"`
}

type chatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        chatDelta     `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	Usage   *usage            `json:"usage,omitempty"`
}

// Legacy completion shapes.

type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float32           `json:"token_logprobs"` // the prompt's first is null (echo)
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type completionChoice struct {
	Text         string              `json:"text"`
	Index        int                 `json:"index"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usage             `json:"usage,omitempty"`
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var req chatRequest
	if !s.readJSON(w, r, &req) {
		return
	}
	j, aerr := s.val.chat(&req, tenantOf(r.Context()))
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	s.serveJob(w, r, j, true, received)
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var req completionRequest
	if !s.readJSON(w, r, &req) {
		return
	}
	j, aerr := s.val.completion(&req, tenantOf(r.Context()))
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	s.serveJob(w, r, j, false, received)
}

// choiceResult collects one non-streamed choice.
type choiceResult struct {
	text   strings.Builder
	chatLP []chatLogprob
	compLP completionLogprobs
	res    genResult
}

// admit takes a validated job's in-flight slots, or answers why not (ok
// false). release frees them, once, and cancel ends the job's context; the
// caller defers both.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, j *job) (ctx context.Context, cancel context.CancelFunc, release func(), ok bool) {
	if s.isClosing() {
		writeAPIError(w, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "shutting_down", Message: "the server is shutting down"})
		return nil, nil, nil, false
	}
	n, tenant := j.choices(), tenantOf(r.Context())
	if aerr := s.lim.tryAcquire(tenant, n, s.cfg.RetryAfter); aerr != nil {
		writeAPIError(w, aerr)
		return nil, nil, nil, false
	}
	// A streamed answer frees its in-flight slots before its [DONE], so
	// that a client that has read it may start another request at once.
	release = sync.OnceFunc(func() { s.lim.release(tenant, n) })
	ctx, cancel = s.workContext(r.Context())
	return ctx, cancel, release, true
}

// serveJob admits a validated job and answers it, streamed or not.
func (s *Server) serveJob(w http.ResponseWriter, r *http.Request, j *job, chat bool, received time.Time) {
	ctx, cancel, release, ok := s.admit(w, r, j)
	if !ok {
		return
	}
	defer release()
	defer cancel()
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	id := newID(prefix)
	if j.stream {
		s.streamJob(ctx, cancel, w, j, chat, id, received, release)
		return
	}
	n := j.choices()
	results := make([]choiceResult, n)
	err := runAll(n, cancel, func(i int) error {
		cr := &results[i]
		var err error
		// The prompt comes first where echo asks, with the first token's
		// log-probabilities of it, or at the end where no token came.
		echoed := j.echo == nil
		echo := func(plp []PromptLogprob) {
			if echoed {
				return
			}
			echoed = true
			text, lp := s.echo(j, i, plp)
			cr.text.WriteString(text)
			if lp != nil {
				cr.compLP = *lp
			}
		}
		cr.res, err = s.generate(ctx, j.request(id, i), received, j.newThinkStream(), func(ev *tokenEvent) error {
			echo(ev.tok.Prompt)
			if j.echoOnly {
				return nil
			}
			cr.addLogprobs(s, j, chat, ev)
			cr.text.WriteString(ev.text)
			return nil
		})
		echo(nil)
		if !j.echoOnly {
			cr.text.WriteString(cr.res.tail)
		}
		return err
	})
	if err != nil {
		writeAPIError(w, s.backendError(err))
		return
	}
	if r.Context().Err() != nil {
		return // the client went away; nobody to answer
	}
	if s.base.Err() != nil {
		writeAPIError(w, s.backendError(context.Canceled))
		return
	}
	u := j.usage(results)
	created := received.Unix()
	if chat {
		resp := chatResponse{ID: id, Object: "chat.completion", Created: created, Model: j.model.ID, Usage: u}
		for i := range results {
			reasoning, content, calls := j.answer(results[i].text.String())
			msg := chatMessageOut{Role: "assistant", Content: &content}
			if reasoning != "" {
				msg.ReasoningContent = &reasoning
			}
			for _, c := range calls {
				msg.ToolCalls = append(msg.ToolCalls, callOut(c))
			}
			if len(calls) > 0 && content == "" {
				msg.Content = nil
			}
			c := chatChoice{Index: i, Message: msg, FinishReason: j.reason(results[i].res.finish.Reason, len(calls) > 0)}
			if j.base.Logprobs {
				c.Logprobs = &chatLogprobs{Content: nonNil(results[i].chatLP)}
			}
			resp.Choices = append(resp.Choices, c)
		}
		writeJSON(w, http.StatusOK, resp)
		return
	}
	resp := completionResponse{ID: id, Object: "text_completion", Created: created, Model: j.model.ID, Usage: &u}
	for i := range results {
		reason := openAIReason(results[i].res.finish.Reason)
		c := completionChoice{Text: results[i].text.String(), Index: i, FinishReason: &reason}
		if j.base.Logprobs {
			lp := results[i].compLP
			c.Logprobs = &lp
		}
		resp.Choices = append(resp.Choices, c)
	}
	writeJSON(w, http.StatusOK, resp)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// usage adds up a job's token counts; each prompt counts once, however
// many choices, its cached tokens as the most any of its choices found.
func (j *job) usage(results []choiceResult) usage {
	var u usage
	for p := range j.prompts {
		u.PromptTokens += len(j.prompts[p])
	}
	u.PromptTokensDetails, u.CompletionTokensDetails = &promptDetail{}, &completionDetail{}
	cached := make([]int, len(j.prompts)) // result i is of prompt i/j.n (job.request)
	for i := range results {
		res := &results[i].res
		if !j.echoOnly {
			u.CompletionTokens += res.finish.CompletionTokens
		}
		u.CompletionTokensDetails.ReasoningTokens += res.reasoning
		cached[i/j.n] = max(cached[i/j.n], res.finish.CachedTokens)
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	for _, c := range cached {
		u.PromptTokensDetails.CachedTokens += c
	}
	return u
}

func openAIReason(r string) string {
	if r == FinishLength {
		return "length"
	}
	return "stop"
}

// reason is a chat choice's finish_reason: "tool_calls" where it ended
// calling functions it chose to call (not one tool_choice named).
func (j *job) reason(r string, called bool) string {
	if called && r != FinishLength && j.tools.mode != toolsNamed {
		return "tool_calls"
	}
	return openAIReason(r)
}

func (cr *choiceResult) addLogprobs(s *Server, j *job, chat bool, ev *tokenEvent) {
	if !j.base.Logprobs {
		return
	}
	if chat {
		cr.chatLP = append(cr.chatLP, s.chatLogprob(ev.tok, j.base.TopLogprobs))
		return
	}
	s.appendCompletionLogprob(&cr.compLP, ev.tok, cr.text.Len(), j.base.TopLogprobs)
}

func (s *Server) tokenText(id int32, text string) string {
	if text != "" {
		return text
	}
	return s.tok.Decode([]int32{id}, false)
}

func textBytes(t string) []int {
	b := make([]int, len(t))
	for i := range len(t) {
		b[i] = int(t[i])
	}
	return b
}

func (s *Server) chatLogprob(t Token, top int) chatLogprob {
	text := s.tokenText(t.ID, t.Text)
	lp := chatLogprob{Token: validUTF8(text), Logprob: t.Logprob, Bytes: textBytes(text), TopLogprobs: []chatTopLogpob{}}
	for i, a := range t.TopLogprobs {
		if i >= top {
			break
		}
		at := s.tokenText(a.ID, a.Text)
		lp.TopLogprobs = append(lp.TopLogprobs, chatTopLogpob{Token: validUTF8(at), Logprob: a.Logprob, Bytes: textBytes(at)})
	}
	return lp
}

func (s *Server) appendCompletionLogprob(lp *completionLogprobs, t Token, offset, top int) {
	text := validUTF8(s.tokenText(t.ID, t.Text))
	lp.Tokens = append(lp.Tokens, text)
	lp.TokenLogprobs = append(lp.TokenLogprobs, &t.Logprob)
	lp.TextOffset = append(lp.TextOffset, offset)
	lp.TopLogprobs = append(lp.TopLogprobs, s.topMap(t.TopLogprobs, top))
}

// topMap is a completion's top_logprobs entry: the first top alternatives
// by their text.
func (s *Server) topMap(alts []TokenLogprob, top int) map[string]float32 {
	m := make(map[string]float32, top)
	for i, a := range alts {
		if i >= top {
			break
		}
		m[validUTF8(s.tokenText(a.ID, a.Text))] = a.Logprob
	}
	return m
}

// echo is what a completion choice that echoes its prompt begins with:
// the prompt's text and, with logprobs, its tokens (the first's
// log-probability null) from offset 0.
func (s *Server) echo(j *job, i int, plp []PromptLogprob) (string, *completionLogprobs) {
	text := j.echoed(i)
	if !j.base.Logprobs {
		return text, nil
	}
	lp := &completionLogprobs{}
	off := 0
	for k, id := range j.prompts[i/j.n] {
		t := validUTF8(s.tokenText(id, ""))
		lp.Tokens = append(lp.Tokens, t)
		lp.TextOffset = append(lp.TextOffset, off)
		off += len(t)
		if k == 0 || k-1 >= len(plp) {
			lp.TokenLogprobs, lp.TopLogprobs = append(lp.TokenLogprobs, nil), append(lp.TopLogprobs, nil)
			continue
		}
		p := plp[k-1]
		lp.TokenLogprobs = append(lp.TokenLogprobs, &p.Logprob)
		lp.TopLogprobs = append(lp.TopLogprobs, s.topMap(p.Top, j.base.TopLogprobs))
	}
	return text, lp
}

func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// sse writes server-sent events. Headers go out with the first event, so an error
// before any token can still be answered with a proper status.
type sse struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	log     *eventLog // where set, events go to it instead of w (a background response's)
	started bool
	err     error
}

func (e *sse) send(v any) error {
	return e.named("", v)
}

// named sends v as an event of the given name ("": unnamed).
func (e *sse) named(event string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return e.write(event, b)
}

func (e *sse) raw(b []byte) error { return e.write("", b) }

func (e *sse) write(event string, b []byte) error {
	buf := make([]byte, 0, len(event)+len(b)+16)
	if event != "" {
		buf = append(buf, "event: "...)
		buf = append(buf, event...)
		buf = append(buf, '\n')
	}
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, '\n', '\n')
	return e.framed(buf)
}

// framed sends an event already framed: to the log where there is one,
// else to the client, the stream's headers first.
func (e *sse) framed(buf []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return e.err
	}
	if e.log != nil {
		e.started = true
		e.log.append(buf)
		return nil
	}
	if !e.started {
		h := e.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		e.w.WriteHeader(http.StatusOK)
		e.started = true
	}
	if _, err := e.w.Write(buf); err != nil {
		e.err = err
		return err
	}
	if err := http.NewResponseController(e.w).Flush(); err != nil {
		e.err = err
		return err
	}
	return nil
}

func (e *sse) isStarted() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.started
}

// streamJob answers a job as server-sent events, calling release (which
// frees the job's in-flight slots) before it writes [DONE].
func (s *Server) streamJob(ctx context.Context, cancel context.CancelFunc, w http.ResponseWriter, j *job, chat bool, id string, received time.Time, release func()) {
	out := &sse{w: w}
	created := received.Unix()
	model := j.model.ID
	n := j.choices()
	results := make([]choiceResult, n)
	err := runAll(n, cancel, func(i int) error {
		cr := &results[i]
		first := true
		answer := j.newAnswerStream()
		// delta sends a chat chunk of reasoning, content and calls.
		delta := func(reasoning, text string, tc []toolCallOut, lp *chatLogprobs, reason *string) error {
			if reasoning == "" && text == "" && tc == nil && lp == nil && reason == nil && !first {
				return nil
			}
			d := chatDelta{ToolCalls: tc}
			if reasoning != "" {
				d.ReasoningContent = &reasoning
			}
			if text != "" || reasoning == "" && tc == nil && (first || reason == nil) {
				d.Content = &text
			}
			if first {
				d.Role = "assistant"
				first = false
			}
			return out.send(chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: model,
				Choices: []chatChunkChoice{{Index: i, Delta: d, Logprobs: lp, FinishReason: reason}}})
		}
		var err error
		cr.res, err = s.generate(ctx, j.request(id, i), received, j.newThinkStream(), func(ev *tokenEvent) error {
			if chat {
				var lp *chatLogprobs
				if j.base.Logprobs {
					lp = &chatLogprobs{Content: []chatLogprob{s.chatLogprob(ev.tok, j.base.TopLogprobs)}}
				}
				reasoning, text, tc := answer.push(ev.text)
				return delta(reasoning, text, tc, lp, nil)
			}
			var lp *completionLogprobs
			var text string
			if first && j.echo != nil {
				// The prompt goes out with the first token.
				text, lp = s.echo(j, i, ev.tok.Prompt)
				cr.text.WriteString(text)
			}
			first = false
			if !j.echoOnly {
				if j.base.Logprobs {
					if lp == nil {
						lp = &completionLogprobs{}
					}
					s.appendCompletionLogprob(lp, ev.tok, cr.text.Len(), j.base.TopLogprobs)
				}
				cr.text.WriteString(ev.text)
				text += ev.text
			}
			if text == "" && lp == nil {
				return nil
			}
			return out.send(completionResponse{ID: id, Object: "text_completion", Created: created, Model: model,
				Choices: []completionChoice{{Text: text, Index: i, Logprobs: lp}}})
		})
		if err != nil {
			return err
		}
		if cr.res.finish.Reason == FinishCancelled {
			return nil
		}
		reason := openAIReason(cr.res.finish.Reason)
		if chat {
			reasoning, text, tc, called := answer.end(cr.res.tail)
			reason = j.reason(cr.res.finish.Reason, called)
			return delta(reasoning, text, tc, nil, &reason)
		}
		c := completionChoice{Text: cr.res.tail, Index: i, FinishReason: &reason}
		if j.echoOnly {
			c.Text = ""
		}
		if first && j.echo != nil { // no token came: the prompt goes out last
			pt, lp := s.echo(j, i, nil)
			c.Text, c.Logprobs = pt+c.Text, lp
		}
		return out.send(completionResponse{ID: id, Object: "text_completion", Created: created, Model: model, Choices: []completionChoice{c}})
	})
	if err != nil {
		ae := s.backendError(err)
		if !out.isStarted() {
			writeAPIError(w, ae)
			return
		}
		if out.err == nil {
			_ = out.send(ae.body())
			release()
			_ = out.raw([]byte("[DONE]"))
		}
		return
	}
	if ctx.Err() != nil {
		return // client gone or shutting down: the stream just ends
	}
	if j.includeUsage {
		u := j.usage(results)
		var chunk any
		if chat {
			chunk = chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: model, Choices: []chatChunkChoice{}, Usage: &u}
		} else {
			chunk = completionResponse{ID: id, Object: "text_completion", Created: created, Model: model, Choices: []completionChoice{}, Usage: &u}
		}
		if out.send(chunk) != nil {
			return
		}
	}
	release()
	_ = out.raw([]byte("[DONE]"))
}
