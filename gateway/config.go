package gateway

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ModelInfo describes one model the gateway serves.
type ModelInfo struct {
	ID            string
	ContextLength int   // tokens of prompt plus completion
	VocabSize     int   // token ids in prompts must be below it; 0 skips the check
	Created       int64 // Unix seconds, reported by /v1/models
	OwnedBy       string
	// Reasoning says the model writes its reasoning between <think> and
	// </think> before its answer (its chat template thinks): chat answers
	// carry it apart, as reasoning_content.
	Reasoning bool
	// Defaults are the sampling a request takes where it names none of
	// its own (a model's generation_config.json, as troupe serve reads
	// it); nil fields leave the API's defaults.
	Defaults Sampling
}

// Sampling is default sampling parameters, each nil where unset.
type Sampling struct {
	Temperature, TopP, MinP, RepetitionPenalty *float64
	TopK                                       *int
}

// Config configures a Server. Start from DefaultConfig.
type Config struct {
	// Models served; requests naming another model get a 400. At least one.
	Models []ModelInfo

	// APIKeys, when non-empty, are required as "Authorization: Bearer KEY" (or the
	// api_key query parameter, for browsers opening a websocket) on every route except
	// /health and /ready.
	APIKeys []string

	// MaxBodyBytes bounds a request body and a websocket message; larger ones get 413
	// (or close the socket with status 1009).
	MaxBodyBytes int64
	// MaxInFlight bounds the generations this gateway runs at once (a request with n
	// choices counts n). Requests beyond it get 429 with Retry-After.
	MaxInFlight int
	// MaxInFlightPerKey bounds, where APIKeys are set, the generations one key
	// runs at once through this gateway, counted as MaxInFlight counts them, so
	// that one key cannot take every slot: a key's requests beyond it get 429
	// (key_limit) with Retry-After while other keys' go on. 0: no bound but
	// MaxInFlight.
	MaxInFlightPerKey int
	// RetryAfter is the delay suggested by a 429 from the gateway's own limit, and by a
	// Backend overload error that gives none.
	RetryAfter time.Duration

	// MaxN bounds the n parameter; MaxPrompts bounds the prompts of one completion request.
	MaxN       int
	MaxPrompts int
	// DefaultMaxTokens is the completion budget of a request that sets none; 0 means
	// the rest of the context.
	DefaultMaxTokens int
	// Responses keeps the Responses answers for previous_response_id and
	// GET /v1/responses/{id}; gateways that share it find each other's.
	// Without one, the gateway keeps the last MaxStoredResponses in its
	// own memory, the oldest dropped first; 0 keeps none.
	Responses          ResponseStore
	MaxStoredResponses int

	// ResumeGrace is how long a websocket request lives on after its socket went away,
	// waiting for a resume; its generation continues meanwhile.
	ResumeGrace time.Duration
	// ResumeBufferFrames bounds the frames kept per websocket request for replay.
	ResumeBufferFrames int
	// MaxStreamsPerConn bounds the requests that one websocket runs at once.
	MaxStreamsPerConn int
	// MaxRetainedStreams bounds websocket requests kept for resume across all sockets;
	// beyond it the oldest finished ones are dropped.
	MaxRetainedStreams int
	// AllowedOrigins are extra origin host patterns (path.Match) allowed to open the
	// websocket; the gateway's own host is always allowed.
	AllowedOrigins []string
	// PingInterval is how often the gateway pings each websocket; a client whose pong
	// has not come back by the next ping is disconnected (its requests stay resumable
	// for ResumeGrace).
	PingInterval time.Duration
	// WriteTimeout bounds one websocket frame's write; a client that stops reading is
	// disconnected once it passes.
	WriteTimeout time.Duration

	// Build names the build this gateway runs (version, revision, go, ...):
	// the labels of the troupe_build_info metric, left out when empty.
	// Label names are Prometheus's: [a-zA-Z_][a-zA-Z0-9_]*.
	Build map[string]string

	// TraceURLTemplate is where the demo page fetches a token's trace; "{trace_id}" is
	// replaced by the token's trace id.
	TraceURLTemplate string

	// HTTP server timeouts used by Serve.
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	// ShutdownTimeout bounds the graceful shutdown that Serve performs when its
	// context ends.
	ShutdownTimeout time.Duration
}

// DefaultConfig returns a configuration with every limit set; callers fill in Models.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes:       4 << 20,
		MaxInFlight:        256,
		RetryAfter:         time.Second,
		MaxN:               16,
		MaxPrompts:         32,
		MaxStoredResponses: 1024,
		ResumeGrace:        30 * time.Second,
		ResumeBufferFrames: 8192,
		MaxStreamsPerConn:  64,
		MaxRetainedStreams: 4096,
		PingInterval:       20 * time.Second,
		WriteTimeout:       10 * time.Second,
		TraceURLTemplate:   "/debug/traces/{trace_id}",
		ReadHeaderTimeout:  10 * time.Second,
		IdleTimeout:        120 * time.Second,
		ShutdownTimeout:    30 * time.Second,
	}
}

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	if len(c.Models) == 0 {
		errs = append(errs, errors.New("no models configured"))
	}
	for k := range c.Build {
		if !labelName(k) {
			errs = append(errs, fmt.Errorf("build label %q: not a Prometheus label name", k))
		}
	}
	seen := make(map[string]bool, len(c.Models))
	for i, m := range c.Models {
		switch {
		case strings.TrimSpace(m.ID) == "":
			errs = append(errs, fmt.Errorf("model %d: empty id", i))
		case seen[m.ID]:
			errs = append(errs, fmt.Errorf("model %q: listed twice", m.ID))
		}
		seen[m.ID] = true
		if m.ContextLength <= 0 {
			errs = append(errs, fmt.Errorf("model %q: context length %d, want > 0", m.ID, m.ContextLength))
		}
		if m.VocabSize < 0 {
			errs = append(errs, fmt.Errorf("model %q: vocab size %d, want >= 0", m.ID, m.VocabSize))
		}
		// The defaults pass as a request's own values would.
		var req sampling
		m.Defaults.fill(&req)
		if aerr := req.sampler(&GenerateRequest{}); aerr != nil {
			errs = append(errs, fmt.Errorf("model %q: default %s", m.ID, aerr.Message))
		}
	}
	for i, k := range c.APIKeys {
		if k == "" {
			errs = append(errs, fmt.Errorf("api key %d is empty", i))
		}
	}
	positive := []struct {
		name string
		v    int64
	}{
		{"max body bytes", c.MaxBodyBytes},
		{"max in-flight", int64(c.MaxInFlight)},
		{"retry-after", int64(c.RetryAfter)},
		{"max n", int64(c.MaxN)},
		{"max prompts", int64(c.MaxPrompts)},
		{"resume grace", int64(c.ResumeGrace)},
		{"resume buffer frames", int64(c.ResumeBufferFrames)},
		{"max streams per connection", int64(c.MaxStreamsPerConn)},
		{"max retained streams", int64(c.MaxRetainedStreams)},
		{"websocket ping interval", int64(c.PingInterval)},
		{"websocket write timeout", int64(c.WriteTimeout)},
		{"read header timeout", int64(c.ReadHeaderTimeout)},
		{"idle timeout", int64(c.IdleTimeout)},
		{"shutdown timeout", int64(c.ShutdownTimeout)},
	}
	for _, p := range positive {
		if p.v <= 0 {
			errs = append(errs, fmt.Errorf("%s is %d, want > 0", p.name, p.v))
		}
	}
	if c.MaxInFlightPerKey < 0 {
		errs = append(errs, fmt.Errorf("max in-flight per key is %d, want >= 0", c.MaxInFlightPerKey))
	}
	if c.MaxStoredResponses < 0 {
		errs = append(errs, fmt.Errorf("max stored responses is %d, want >= 0", c.MaxStoredResponses))
	}
	if c.DefaultMaxTokens < 0 {
		errs = append(errs, fmt.Errorf("default max tokens is %d, want >= 0", c.DefaultMaxTokens))
	}
	if !strings.Contains(c.TraceURLTemplate, "{trace_id}") {
		errs = append(errs, fmt.Errorf("trace url template %q lacks {trace_id}", c.TraceURLTemplate))
	}
	return errors.Join(errs...)
}
