package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// Lock order: Server.mu, then stream.mu, then wsConn.mu.

const (
	maxStreamID      = 128 // bytes of a client-chosen request id
	framesPerTurn    = 64  // frames the writer sends from one stream before serving the next
	wsFrameTypeToken = "token"
)

// wsFrame is a client frame on /v1/stream.
type wsFrame struct {
	sampling
	Type        string        `json:"type"`
	ID          string        `json:"id"`
	AfterSeq    *int          `json:"after_seq"`
	Prompt      wsPrompt      `json:"prompt"`
	Messages    []chatMessage `json:"messages"`
	Logprobs    *bool         `json:"logprobs"`
	TopLogprobs *int          `json:"top_logprobs"`
	// With messages, as in a chat completion.
	toolFields
	ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs"`
	ReasoningEffort    *string                    `json:"reasoning_effort"`
}

type wsTimings struct {
	QueueMs      float64 `json:"queue_ms"`
	SinceStartMs float64 `json:"since_start_ms"`
	ITLMs        float64 `json:"itl_ms"`
}

type wsTokenFrame struct {
	Type    string    `json:"type"`
	ID      string    `json:"id"`
	Seq     int       `json:"seq"`
	Text    string    `json:"text"`
	TokenID int32     `json:"token_id"`
	Logprob *float32  `json:"logprob,omitempty"`
	TraceID string    `json:"trace_id,omitempty"`
	Timings wsTimings `json:"timings"`
}

type wsDoneFrame struct {
	Type         string `json:"type"`
	ID           string `json:"id"`
	FinishReason string `json:"finish_reason"`
	Usage        usage  `json:"usage"`
	Text         string `json:"text,omitempty"` // text held back for a possible stop string
	// With tools: the answer read from the whole text, as a chat
	// completion's message gives it.
	Content   *string       `json:"content,omitempty"`
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

type wsErrorFrame struct {
	Type         string `json:"type"`
	ID           string `json:"id"`
	Code         string `json:"code"`
	Message      string `json:"message"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
}

// decodeWSFrame decodes and checks the envelope of a client frame.
func decodeWSFrame(data []byte) (*wsFrame, *apiError) {
	var f wsFrame
	if aerr := decodeJSON(data, &f); aerr != nil {
		return &f, aerr
	}
	switch f.Type {
	case "generate", "cancel", "resume":
	case "":
		return &f, badRequest("type", "bad_frame", "frame has no type; want generate, cancel or resume")
	default:
		return &f, badRequest("type", "bad_frame", "unknown frame type %q; want generate, cancel or resume", truncate(f.Type, 40))
	}
	if f.ID == "" {
		return &f, badRequest("id", "bad_frame", "%s frame has no id", f.Type)
	}
	if len(f.ID) > maxStreamID {
		return &f, badRequest("id", "bad_frame", "id is %d bytes, want at most %d", len(f.ID), maxStreamID)
	}
	if f.Type == "resume" {
		if f.AfterSeq == nil {
			return &f, badRequest("after_seq", "bad_frame", "resume frame has no after_seq; send 0 to replay from the start")
		}
		if *f.AfterSeq < 0 {
			return &f, badRequest("after_seq", "bad_frame", "after_seq is %d, want >= 0", *f.AfterSeq)
		}
	}
	return &f, nil
}

// ws validates a websocket generate frame.
func (v *validator) ws(f *wsFrame, tenant string) (*job, *apiError) {
	j := &job{}
	if err := v.sampling(&f.sampling, j); err != nil {
		return nil, err
	}
	j.base.Tenant = tenant
	if j.n != 1 {
		return nil, invalidParam("n", "n is %d; the websocket runs one completion per generate frame", j.n)
	}
	if f.Logprobs != nil && *f.Logprobs {
		j.base.Logprobs = true
	}
	if f.TopLogprobs != nil {
		if *f.TopLogprobs < 0 || *f.TopLogprobs > maxTopLogprobs {
			return nil, invalidParam("top_logprobs", "top_logprobs is %d, want 0 to %d", *f.TopLogprobs, maxTopLogprobs)
		}
		j.base.TopLogprobs = *f.TopLogprobs
	}
	promptParam := "prompt"
	switch {
	case f.Prompt.set && len(f.Messages) > 0:
		return nil, invalidParam("prompt", "send either prompt or messages, not both")
	case len(f.Messages) > 0:
		if v.tmpl == nil {
			return nil, badRequest("messages", "chat_unsupported", "model %q has no chat template; send a prompt instead of messages", j.model.ID)
		}
		tools, aerr := v.useTools(j, f.toolFields)
		if aerr != nil {
			return nil, aerr
		}
		text, aerr := v.chatText(f.Messages, tools, nil, f.ChatTemplateKwargs, f.ReasoningEffort, "")
		if aerr != nil {
			return nil, aerr
		}
		j.prompts = [][]int32{v.tok.Encode(text)}
		j.inThink = strings.HasSuffix(strings.TrimRight(text, spaces), thinkOpen)
		promptParam = "messages"
	case !unset(f.Tools):
		return nil, invalidParam("tools", "tools need messages")
	case f.Prompt.set && f.Prompt.ids != nil:
		j.prompts = [][]int32{f.Prompt.ids}
	case f.Prompt.set:
		j.prompts = [][]int32{v.tok.Encode(f.Prompt.text)}
	default:
		return nil, invalidParam("prompt", "generate frame needs a prompt or messages")
	}
	if err := v.budget(j, f.MaxTokens, "max_tokens", promptParam); err != nil {
		return nil, err
	}
	return j, nil
}

type streamKey struct{ tenant, id string }

// stream is one websocket request: its frames, kept for replay, and its subscriber.
type stream struct {
	key    streamKey
	cancel context.CancelFunc
	limit  int

	mu        sync.Mutex
	frames    [][]byte // the last frames, encoded; frame k (0-based) is token seq k+1, or the final frame
	dropped   int      // frames evicted from the front
	final     bool     // the last frame is the done or error frame
	delivered bool     // the final frame went out; the stream can no longer be resumed
	sub       *wsConn  // the connection it streams to, nil while detached
	cursor    int      // next frame for sub
	timer     *time.Timer
	endedAt   time.Time
}

func (st *stream) append(b []byte, final bool) {
	st.mu.Lock()
	st.frames = append(st.frames, b)
	if len(st.frames) > st.limit {
		st.frames = st.frames[1:]
		st.dropped++
	}
	if final {
		st.final = true
		st.endedAt = time.Now()
	}
	sub := st.sub
	st.mu.Unlock()
	if sub != nil {
		sub.wakeup()
	}
}

// take returns the next frames for c, whether the final frame is among them, and
// whether frames c still needed were already evicted.
func (st *stream) take(c *wsConn, max int) (frames [][]byte, done, gap bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.sub != c {
		return nil, false, false
	}
	if st.cursor < st.dropped {
		return nil, false, true
	}
	total := st.dropped + len(st.frames)
	end := min(total, st.cursor+max)
	frames = slices.Clone(st.frames[st.cursor-st.dropped : end-st.dropped])
	st.cursor = end
	if st.final && end == total {
		st.delivered = true
		st.sub = nil
		return frames, true, false
	}
	return frames, false, false
}

func (st *stream) isFinal() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.final
}

func (st *stream) stopTimer() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
}

// wsConn is one websocket connection.
type wsConn struct {
	s      *Server
	conn   *websocket.Conn
	tenant string
	wake   chan struct{}

	mu      sync.Mutex
	ctl     [][]byte  // frames not tied to a stream's buffer (errors)
	streams []*stream // attached streams, in the order they were attached
}

func (c *wsConn) wakeup() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *wsConn) sendControl(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	c.mu.Lock()
	c.ctl = append(c.ctl, b)
	c.mu.Unlock()
	c.wakeup()
}

func (c *wsConn) sendError(id string, e *apiError) {
	f := wsErrorFrame{Type: "error", ID: id, Code: e.Code, Message: e.Message}
	if e.RetryAfter > 0 {
		f.RetryAfterMs = e.RetryAfter.Milliseconds()
	}
	c.sendControl(f)
}

func (c *wsConn) attach(st *stream) {
	c.mu.Lock()
	if !slices.Contains(c.streams, st) {
		c.streams = append(c.streams, st)
	}
	c.mu.Unlock()
	c.wakeup()
}

func (c *wsConn) detach(st *stream) {
	c.mu.Lock()
	c.streams = slices.DeleteFunc(c.streams, func(x *stream) bool { return x == st })
	c.mu.Unlock()
}

func (s *Server) handleStream(w http.ResponseWriter, r *http.Request) {
	if !s.track() {
		writeAPIError(w, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "shutting_down", Message: "the server is shutting down"})
		return
	}
	defer s.wg.Done()
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		OriginPatterns:  s.cfg.AllowedOrigins,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		return // Accept has answered
	}
	conn.SetReadLimit(s.cfg.MaxBodyBytes)
	c := &wsConn{s: s, conn: conn, tenant: tenantOf(r.Context()), wake: make(chan struct{}, 1)}
	s.met.wsConns.Add(1)
	defer s.met.wsConns.Add(-1)

	ctx, cancel := context.WithCancel(s.base)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		defer cancel() // a failed write ends the connection
		c.writeLoop(ctx)
	})
	wg.Go(func() {
		defer cancel() // so does a missing pong
		c.pingLoop(ctx)
	})
	c.readLoop(ctx)
	cancel()
	wg.Wait()
	s.detachAll(c)
	_ = conn.CloseNow()
}

// pingLoop pings the client every PingInterval and returns when a pong has not
// come back by the next ping, or when ctx ends. Pongs are read by readLoop.
func (c *wsConn) pingLoop(ctx context.Context) {
	every := c.s.cfg.PingInterval
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, every)
		err := c.conn.Ping(pctx)
		cancel()
		if err != nil {
			return
		}
	}
}

// write sends one text frame, giving up after WriteTimeout.
func (c *wsConn) write(ctx context.Context, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, c.s.cfg.WriteTimeout)
	defer cancel()
	return c.conn.Write(ctx, websocket.MessageText, b)
}

func (c *wsConn) readLoop(ctx context.Context) {
	for {
		typ, data, err := c.conn.Read(ctx)
		if err != nil {
			return
		}
		if typ != websocket.MessageText {
			c.sendError("", badRequest("", "bad_frame", "binary frames are not supported; send JSON text frames"))
			continue
		}
		c.handleFrame(data)
	}
}

func (c *wsConn) handleFrame(data []byte) {
	f, aerr := decodeWSFrame(data)
	if aerr != nil {
		c.sendError(f.ID, aerr)
		return
	}
	key := streamKey{c.tenant, f.ID}
	switch f.Type {
	case "generate":
		c.generate(f, key)
	case "cancel":
		if !c.s.cancelStream(key) {
			c.sendError(f.ID, badRequest("id", "unknown_id", "no running request %q to cancel", truncate(f.ID, 40)))
		}
	case "resume":
		if aerr := c.s.resume(c, key, *f.AfterSeq); aerr != nil {
			c.sendError(f.ID, aerr)
		}
	}
}

func (c *wsConn) generate(f *wsFrame, key streamKey) {
	s := c.s
	received := time.Now()
	fail := func(e *apiError) {
		s.met.requests.inc("stream", strconv.Itoa(e.Status))
		c.sendError(f.ID, e)
	}
	j, aerr := s.val.ws(f, c.tenant)
	if aerr != nil {
		fail(aerr)
		return
	}
	c.mu.Lock()
	busy := len(c.streams) >= s.cfg.MaxStreamsPerConn
	c.mu.Unlock()
	if busy {
		fail(tooManyRequests("too_many_streams", fmt.Sprintf("this connection already runs %d requests", s.cfg.MaxStreamsPerConn), s.cfg.RetryAfter))
		return
	}
	ctx, cancel := context.WithCancel(s.base)
	st := &stream{key: key, cancel: cancel, limit: s.cfg.ResumeBufferFrames}
	if aerr := s.register(st, c); aerr != nil {
		cancel()
		fail(aerr)
		return
	}
	undo := func(e *apiError) {
		c.detach(st)
		s.remove(st)
		fail(e)
	}
	if aerr := s.lim.tryAcquire(c.tenant, 1, s.cfg.RetryAfter); aerr != nil {
		undo(aerr)
		return
	}
	started := s.start(true, func() {
		defer cancel()
		s.runStream(ctx, st, j, received, func() { s.lim.release(c.tenant, 1) })
	})
	if !started {
		s.lim.release(c.tenant, 1)
		undo(&apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "shutting_down", Message: "the server is shutting down"})
	}
}

// runStream runs a websocket generation into its stream's buffer. It calls
// release, which frees the request's in-flight slot, before it appends the
// final frame: a client that has read the done frame may start another
// request at once.
func (s *Server) runStream(ctx context.Context, st *stream, j *job, received time.Time, release func()) {
	id := st.key.id
	var text strings.Builder // the whole text, where the answer is read from it
	answers := len(j.tools.tools) > 0
	res, err := s.generate(ctx, j.request(newID("ws-"), 0), received, j.newThinkStream(), func(ev *tokenEvent) error {
		if answers {
			text.WriteString(ev.text)
		}
		f := wsTokenFrame{Type: wsFrameTypeToken, ID: id, Seq: ev.seq, Text: ev.text, TokenID: ev.tok.ID, TraceID: ev.tok.TraceID,
			Timings: wsTimings{QueueMs: millis(ev.queue), SinceStartMs: millis(ev.sinceStart), ITLMs: millis(ev.itl)}}
		if j.base.Logprobs {
			lp := ev.tok.Logprob
			f.Logprob = &lp
		}
		b, err := json.Marshal(f)
		if err != nil {
			return fmt.Errorf("encode token frame: %w", err)
		}
		st.append(b, false)
		return nil
	})
	var final any
	if err != nil {
		ae := s.backendError(err)
		s.met.requests.inc("stream", strconv.Itoa(ae.Status))
		ef := wsErrorFrame{Type: "error", ID: id, Code: ae.Code, Message: ae.Message}
		if ae.RetryAfter > 0 {
			ef.RetryAfterMs = ae.RetryAfter.Milliseconds()
		}
		final = ef
	} else {
		code := "200"
		if res.finish.Reason == FinishCancelled {
			code = "499"
		}
		s.met.requests.inc("stream", code)
		f := res.finish
		done := wsDoneFrame{Type: "done", ID: id, FinishReason: f.Reason, Text: res.tail,
			Usage: usage{PromptTokens: f.PromptTokens, CompletionTokens: f.CompletionTokens, TotalTokens: f.PromptTokens + f.CompletionTokens,
				PromptTokensDetails: &promptDetail{CachedTokens: f.CachedTokens}, CompletionTokensDetails: &completionDetail{ReasoningTokens: res.reasoning}}}
		if answers {
			_, content, calls := j.answer(text.String() + res.tail)
			done.Content = &content
			for _, c := range calls {
				done.ToolCalls = append(done.ToolCalls, callOut(c))
			}
			if f.Reason != FinishCancelled {
				done.FinishReason = j.reason(f.Reason, len(calls) > 0)
			}
		}
		final = done
	}
	b, _ := json.Marshal(final)
	release()
	st.append(b, true)
}

func (c *wsConn) writeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		for {
			c.mu.Lock()
			ctl := c.ctl
			c.ctl = nil
			sts := slices.Clone(c.streams)
			c.mu.Unlock()
			wrote := len(ctl) > 0
			for _, b := range ctl {
				if c.write(ctx, b) != nil {
					return
				}
			}
			for _, st := range sts {
				frames, done, gap := st.take(c, framesPerTurn)
				if gap {
					c.s.dropSlow(c, st)
					wrote = true
					continue
				}
				for _, b := range frames {
					if c.write(ctx, b) != nil {
						return
					}
				}
				wrote = wrote || len(frames) > 0
				if done {
					c.detach(st)
					c.s.remove(st)
				}
			}
			if !wrote {
				break
			}
		}
	}
}

// register adds a new stream attached to c.
func (s *Server) register(st *stream, c *wsConn) *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "shutting_down", Message: "the server is shutting down"}
	}
	if old, ok := s.streams[st.key]; ok {
		if !old.isFinal() {
			return badRequest("id", "duplicate_id", "a request with id %q is still running; ids must be unique", truncate(st.key.id, 40))
		}
		s.forget(old)
	}
	if len(s.streams) >= s.cfg.MaxRetainedStreams && !s.evictFinished() {
		return tooManyRequests("too_many_streams", "too many websocket requests are retained for resume", s.cfg.RetryAfter)
	}
	st.sub = c
	s.streams[st.key] = st
	c.attach(st)
	return nil
}

// evictFinished drops the finished, detached stream that ended first. Called with s.mu held.
func (s *Server) evictFinished() bool {
	var oldest *stream
	var at time.Time
	for _, st := range s.streams {
		st.mu.Lock()
		ok := st.final && st.sub == nil
		ended := st.endedAt
		st.mu.Unlock()
		if ok && (oldest == nil || ended.Before(at)) {
			oldest, at = st, ended
		}
	}
	if oldest == nil {
		return false
	}
	s.forget(oldest)
	return true
}

// forget removes st from the registry and cancels it. Called with s.mu held.
func (s *Server) forget(st *stream) {
	if s.streams[st.key] == st {
		delete(s.streams, st.key)
	}
	st.stopTimer()
	st.cancel()
}

func (s *Server) remove(st *stream) {
	s.mu.Lock()
	s.forget(st)
	s.mu.Unlock()
}

func (s *Server) retainedStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

func (s *Server) cancelStream(key streamKey) bool {
	s.mu.Lock()
	st, ok := s.streams[key]
	s.mu.Unlock()
	if !ok || st.isFinal() {
		return false
	}
	st.cancel()
	return true
}

// resume attaches the stream key to c and replays its frames after afterSeq.
func (s *Server) resume(c *wsConn, key streamKey, afterSeq int) *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.streams[key]
	if !ok {
		return badRequest("id", "unknown_id", "no request %q to resume: it finished and was delivered, its grace period ran out, or it never started", truncate(key.id, 40))
	}
	st.mu.Lock()
	if st.delivered {
		st.mu.Unlock()
		return badRequest("id", "unknown_id", "request %q already finished and was delivered", truncate(key.id, 40))
	}
	if afterSeq < st.dropped {
		st.mu.Unlock()
		return badRequest("after_seq", "resume_gap", "frames after seq %d are no longer buffered; the oldest kept is seq %d", afterSeq, st.dropped+1)
	}
	old := st.sub
	st.sub = c
	st.cursor = min(afterSeq, st.dropped+len(st.frames))
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
	st.mu.Unlock()
	if old != nil && old != c {
		old.detach(st)
	}
	s.met.wsResumes.Add(1)
	c.attach(st)
	return nil
}

// detachAll detaches the streams of a closed connection; each lives on for the grace
// period, waiting for a resume.
func (s *Server) detachAll(c *wsConn) {
	c.mu.Lock()
	sts := c.streams
	c.streams = nil
	c.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range sts {
		st.mu.Lock()
		if st.sub == c {
			st.sub = nil
			if st.timer != nil {
				st.timer.Stop()
			}
			st.timer = time.AfterFunc(s.cfg.ResumeGrace, func() { s.expire(st) })
		}
		st.mu.Unlock()
	}
}

// expire ends a stream nobody resumed within the grace period.
func (s *Server) expire(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.mu.Lock()
	resumed := st.sub != nil
	st.mu.Unlock()
	if resumed {
		return
	}
	if s.streams[st.key] == st {
		delete(s.streams, st.key)
	}
	st.cancel()
}

// dropSlow ends a stream whose client fell so far behind that frames it needs were evicted.
func (s *Server) dropSlow(c *wsConn, st *stream) {
	c.detach(st)
	s.remove(st)
	c.sendError(st.key.id, &apiError{Status: http.StatusServiceUnavailable, Code: "slow_consumer",
		Message: fmt.Sprintf("the client fell more than %d frames behind; the request was cancelled", st.limit)})
}

// track counts a request handler that must end before Shutdown returns.
func (s *Server) track() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Add(1)
	return true
}
