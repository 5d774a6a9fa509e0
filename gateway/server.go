package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

//go:embed web/index.html
var webFS embed.FS

// Server is the gateway. Create it with New.
type Server struct {
	cfg     Config
	backend Backend
	tok     Tokenizer
	val     validator
	// responses keeps the last Responses answers (POST /v1/responses).
	responses keptResponses
	bg        bgRuns        // background responses running here
	bgWait    time.Duration // cancelWait; shorter in tests
	bgBeat    time.Duration // beatEvery; shorter in tests
	bgChunk   int           // eventChunk; smaller in tests
	lim       *limiter
	met       *metrics
	mux       *http.ServeMux
	handler   http.Handler
	demo      []byte
	csp       string
	keys      []apiKey

	base       context.Context // cancelled at the end of Shutdown; parent of all work
	cancelBase context.CancelFunc

	wg   sync.WaitGroup // websocket handlers, their writers, websocket generations
	gens sync.WaitGroup // websocket generations only, waited on gracefully

	mu       sync.Mutex // guards the fields below
	closing  bool
	httpSrv  *http.Server
	streams  map[streamKey]*stream
	mountErr error
}

type apiKey struct {
	sum    [32]byte
	tenant string
}

// New checks cfg and returns a Server. tmpl may be nil: chat requests then get a 400.
func New(cfg Config, backend Backend, tok Tokenizer, tmpl ChatTemplate) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gateway config: %w", err)
	}
	if backend == nil {
		return nil, errors.New("gateway: nil backend")
	}
	if tok == nil {
		return nil, errors.New("gateway: nil tokenizer")
	}
	cfg.Models = append([]ModelInfo(nil), cfg.Models...)
	cfg.Build = maps.Clone(cfg.Build)
	cfg.APIKeys = append([]string(nil), cfg.APIKeys...)
	s := &Server{
		cfg:     cfg,
		bgWait:  cancelWait,
		bgBeat:  beatEvery,
		bgChunk: eventChunk,
		backend: backend,
		tok:     tok,
		lim:     &limiter{cap: cfg.MaxInFlight, per: cfg.MaxInFlightPerKey},
		met:     newMetrics(),
		mux:     http.NewServeMux(),
		streams: make(map[streamKey]*stream),
	}
	switch {
	case cfg.Responses != nil:
		s.responses.store = cfg.Responses
	case cfg.MaxStoredResponses > 0:
		s.responses.store = MemoryResponses(cfg.MaxStoredResponses)
	}
	s.val = validator{cfg: &s.cfg, models: make(map[string]ModelInfo, len(cfg.Models)), tok: tok, tmpl: tmpl}
	for _, m := range s.cfg.Models {
		s.val.models[m.ID] = m
	}
	for _, k := range cfg.APIKeys {
		sum := sha256.Sum256([]byte(k))
		s.keys = append(s.keys, apiKey{sum: sum, tenant: "key-" + hex.EncodeToString(sum[:6])})
	}
	s.base, s.cancelBase = context.WithCancel(context.Background())
	demo, err := renderDemo(cfg.TraceURLTemplate)
	if err != nil {
		return nil, fmt.Errorf("gateway: demo page: %w", err)
	}
	s.demo = demo
	s.csp = "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self' ws: wss:"
	if u, err := url.Parse(cfg.TraceURLTemplate); err == nil && u.Scheme != "" && u.Host != "" {
		s.csp += " " + u.Scheme + "://" + u.Host
	}

	s.mux.HandleFunc("GET /health", s.handleHealth)
	s.mux.HandleFunc("GET /ready", s.handleReady)
	s.mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	s.route("GET /metrics", "metrics", s.handleMetrics)
	s.route("GET /{$}", "demo", s.handleDemo)
	s.route("POST /v1/chat/completions", "chat", s.handleChat)
	s.route("POST /v1/completions", "completions", s.handleCompletions)
	s.route("POST /v1/responses", "responses", s.handleResponses)
	s.route("GET /v1/responses/{id}", "responses", s.handleGetResponse)
	s.route("GET /v1/responses/{id}/input_items", "responses", s.handleInputItems)
	s.route("DELETE /v1/responses/{id}", "responses", s.handleDeleteResponse)
	s.route("POST /v1/responses/{id}/cancel", "responses", s.handleCancelResponse)
	s.route("POST /v1/responses/input_tokens", "responses", s.handleInputTokens)
	s.route("POST /tokenize", "tokenize", s.handleTokenize)
	s.route("POST /detokenize", "tokenize", s.handleDetokenize)
	s.route("GET /v1/models", "models", s.handleModels)
	s.route("GET /v1/models/{id...}", "models", s.handleModel)
	s.mux.Handle("GET /v1/stream", s.authenticate(http.HandlerFunc(s.handleStream)))
	s.route("/v1/", "other", s.handleUnknown)
	s.handler = s.mux
	return s, nil
}

func renderDemo(traceTemplate string) ([]byte, error) {
	src, err := webFS.ReadFile("web/index.html")
	if err != nil {
		return nil, err
	}
	t, err := template.New("demo").Delims("[[", "]]").Parse(string(src))
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, struct{ TraceURL string }{traceTemplate}); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// route registers an authenticated handler that is counted in the request metrics.
func (s *Server) route(pattern, name string, h http.HandlerFunc) {
	s.mux.Handle(pattern, s.authenticate(s.counted(name, h)))
}

// Mount adds h at pattern (http.ServeMux syntax) behind the gateway's API-key check,
// for example the trace viewer at "GET /debug/traces/{id}". Call it before serving.
func (s *Server) Mount(pattern string, h http.Handler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("gateway: mount %q: %v", pattern, r)
		}
	}()
	s.mux.Handle(pattern, s.authenticate(h))
	return nil
}

// Handler returns the gateway's routes, for callers that run their own http.Server.
// Shutdown still stops websocket work and cancels generations served through it.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves on ln until ctx ends or the listener fails, then shuts down gracefully,
// waiting at most Config.ShutdownTimeout for running requests.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
	s.mu.Lock()
	if s.closing || s.httpSrv != nil {
		s.mu.Unlock()
		return errors.New("gateway: serve after shutdown or twice")
	}
	s.httpSrv = srv
	s.mu.Unlock()

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	stop := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
		defer cancel()
		return s.Shutdown(sctx)
	}
	select {
	case err := <-errc:
		serr := stop()
		if errors.Is(err, http.ErrServerClosed) {
			return serr
		}
		return errors.Join(fmt.Errorf("gateway: serve: %w", err), serr)
	case <-ctx.Done():
		err := stop()
		<-errc
		return err
	}
}

// Shutdown stops accepting work, waits until running requests end or ctx ends, then
// cancels what is left and waits for every goroutine the Server started. It is safe to
// call more than once.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	srv := s.httpSrv
	s.mu.Unlock()

	var errs []error
	if srv != nil {
		if err := srv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("gateway: http shutdown: %w", err))
		}
	}
	drained := make(chan struct{})
	go func() { // ends once every generation has; cancelBase below guarantees that
		s.gens.Wait()
		close(drained)
	}()
	select {
	case <-drained:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("gateway: generations still running: %w", ctx.Err()))
	}
	s.cancelBase()
	<-drained
	if srv != nil && ctx.Err() != nil {
		_ = srv.Close()
	}
	s.mu.Lock()
	for k, st := range s.streams {
		st.stopTimer()
		delete(s.streams, k)
	}
	s.mu.Unlock()
	s.wg.Wait()
	return errors.Join(errs...)
}

// start runs f on a goroutine owned by the Server, unless it is shutting down.
func (s *Server) start(gen bool, f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Add(1)
	if gen {
		s.gens.Add(1)
	}
	go func() {
		defer s.wg.Done()
		if gen {
			defer s.gens.Done()
		}
		f()
	}()
	return true
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// workContext returns a context for a generation: cancelled with parent or at the end
// of Shutdown.
func (s *Server) workContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	stop := context.AfterFunc(s.base, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

type tenantKey struct{}

func tenantOf(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

// authenticate checks the API key, if keys are configured, and records the tenant.
func (s *Server) authenticate(h http.Handler) http.Handler {
	if len(s.keys) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := ""
		if a := r.Header.Get("Authorization"); a != "" {
			scheme, rest, ok := strings.Cut(a, " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") {
				s.deny(w, r, "the Authorization header must be \"Bearer <api key>\"")
				return
			}
			key = strings.TrimSpace(rest)
		} else {
			key = r.URL.Query().Get("api_key")
		}
		if key == "" {
			s.deny(w, r, "missing API key; send \"Authorization: Bearer <api key>\" (or ?api_key= for browser websockets)")
			return
		}
		sum := sha256.Sum256([]byte(key))
		tenant := ""
		for _, k := range s.keys {
			if subtle.ConstantTimeCompare(sum[:], k.sum[:]) == 1 {
				tenant = k.tenant
			}
		}
		if tenant == "" {
			s.deny(w, r, "invalid API key")
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

func (s *Server) deny(w http.ResponseWriter, r *http.Request, msg string) {
	s.met.requests.inc(routeName(r), "401")
	w.Header().Set("WWW-Authenticate", `Bearer realm="troupe"`)
	writeAPIError(w, &apiError{Status: http.StatusUnauthorized, Type: typeAuthentication, Code: "invalid_api_key", Message: msg})
}

func routeName(r *http.Request) string {
	switch p := r.URL.Path; {
	case p == "/v1/chat/completions":
		return "chat"
	case p == "/v1/completions":
		return "completions"
	case p == "/v1/stream":
		return "stream"
	case strings.HasPrefix(p, "/v1/models"):
		return "models"
	case p == "/metrics":
		return "metrics"
	case p == "/":
		return "demo"
	}
	return "other"
}

// statusWriter records the status code for the request metrics.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) counted(name string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			code := sw.status
			if code == 0 {
				code = 499 // the client went away before an answer
			}
			s.met.requests.inc(name, strconv.Itoa(code))
		}()
		h(sw, r)
	}
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	if s.isClosing() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": "shutting down"})
		return
	}
	if used := s.lim.inUse(); used >= s.cfg.MaxInFlight {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": fmt.Sprintf("at the in-flight limit (%d generations)", used)})
		return
	}
	ok, reason := s.backend.Ready()
	if !ok {
		if reason == "" {
			reason = "backend not ready"
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": reason})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true})
}

func (s *Server) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_ = s.writeMetrics(w)
}

func (s *Server) handleDemo(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", s.csp)
	_, _ = w.Write(s.demo)
}

type modelObject struct {
	ID            string `json:"id"`
	Object        string `json:"object"`
	Created       int64  `json:"created"`
	OwnedBy       string `json:"owned_by"`
	ContextLength int    `json:"context_length"`
}

func toModelObject(m ModelInfo) modelObject {
	owner := m.OwnedBy
	if owner == "" {
		owner = "troupe"
	}
	return modelObject{ID: m.ID, Object: "model", Created: m.Created, OwnedBy: owner, ContextLength: m.ContextLength}
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	data := make([]modelObject, len(s.cfg.Models))
	for i, m := range s.cfg.Models {
		data[i] = toModelObject(m)
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	m, ok := s.val.models[id]
	if !ok {
		writeAPIError(w, &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("the model %q does not exist; served models: %s", truncate(id, 200), s.val.modelList())})
		return
	}
	writeJSON(w, http.StatusOK, toModelObject(m))
}

func (s *Server) handleUnknown(w http.ResponseWriter, r *http.Request) {
	writeAPIError(w, &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Code: "unknown_url",
		Message: fmt.Sprintf("unknown request URL: %s %s", r.Method, truncate(r.URL.Path, 200))})
}

// readJSON reads the request body (at most MaxBodyBytes) into each of vs
// and reports whether it could; where not, it has answered with the error.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, vs ...any) bool {
	var b bytes.Buffer
	var aerr *apiError
	if _, err := b.ReadFrom(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			aerr = &apiError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest, Code: "request_too_large",
				Message: fmt.Sprintf("request body is larger than %d bytes", mbe.Limit)}
		} else {
			aerr = badRequest("", "invalid_body", "cannot read request body: %v", err)
		}
	}
	for _, v := range vs {
		if aerr != nil {
			break
		}
		aerr = decodeJSON(b.Bytes(), v)
	}
	if aerr != nil {
		writeAPIError(w, aerr)
		return false
	}
	return true
}

// since returns d in milliseconds with microsecond precision.
func millis(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}
