package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Tokenizer turns text into token ids and back. It must be safe for concurrent use.
type Tokenizer interface {
	Encode(s string) []int32
	Decode(ids []int32, skipSpecial bool) string
}

// Message is one chat message after decoding; Content is its text. An
// assistant's may hold the tool calls it made, and a tool's answers the
// call ToolCallID names.
type Message struct {
	Role       string
	Content    string
	Name       string
	ToolCalls  []ToolCall
	ToolCallID string
	// Reasoning is an assistant turn's reasoning, as a client sent it back
	// (reasoning_content, or a Responses reasoning item).
	Reasoning string
}

// Tool is a function the model may call: its name, description and
// parameters (a JSON schema object, compact JSON; empty when the function
// takes none).
type Tool struct {
	Name, Description, Parameters string
}

// ToolCall is a call of a Tool: its id, the function's name and its
// arguments (a JSON object's text).
type ToolCall struct {
	ID, Name, Arguments string
}

// ChatTemplate renders chat messages into a prompt string as o asks. It
// must be safe for concurrent use. A nil ChatTemplate makes chat requests
// fail with a 400.
type ChatTemplate interface {
	Render(msgs []Message, o RenderOptions) (string, error)
}

// RenderOptions shape a chat prompt: the tools the model may call (nil
// without), whether it ends with the opening of an assistant turn, and a
// request's chat_template_kwargs (a name's JSON value) for the template
// to read.
type RenderOptions struct {
	Tools               []Tool
	AddGenerationPrompt bool
	Vars                map[string]string
}

// Backend runs generations. It must be safe for concurrent use.
type Backend interface {
	// Generate runs one completion and calls emit once for each generated token, in
	// order, from one goroutine at a time. An error from emit means the gateway no longer
	// wants tokens (client gone, stop string matched): Generate must stop the sequence and
	// return. Generate returns when the sequence finishes, when ctx is cancelled (then
	// with Finish.Reason "cancelled" or ctx's error), or on error. An error that means
	// the queue is full must match ErrOverloaded (use *OverloadedError to give a retry
	// delay); an error that means the request itself is unacceptable must match
	// ErrInvalidRequest.
	Generate(ctx context.Context, req GenerateRequest, emit func(Token) error) (Finish, error)
	// Ready reports whether the backend accepts work: false until the model is loaded
	// and while overloaded, with a human-readable reason.
	Ready() (ok bool, reason string)
}

// GenerateRequest is one generation, validated by the gateway.
type GenerateRequest struct {
	RequestID string  // unique per generation; n choices get n ids
	Model     string  // a ModelInfo.ID from Config.Models
	Prompt    []int32 // never empty
	// MaxTokens bounds the completion; len(Prompt)+MaxTokens fits the context length.
	MaxTokens         int
	Temperature       float32           // 0 means greedy
	TopP              float32           // in (0, 1]
	TopK              int               // 0 means off
	MinP              float32           // 0 means off
	RepetitionPenalty float32           // 1 means off
	PresencePenalty   float32           // OpenAI's, in [-2, 2]; 0 means off
	FrequencyPenalty  float32           // OpenAI's, in [-2, 2]; 0 means off
	LogitBias         map[int32]float32 // token id → bias in [-100, 100]; ids within the vocabulary
	Seed              *int64
	Stop              []string // at most 4, none empty; the gateway applies them too
	Logprobs          bool     // report the sampled token's log-probability
	TopLogprobs       int      // how many alternatives to report per token (0..20)
	// PromptLogprobs asks for the log-probability of each prompt token
	// after the first, with TopLogprobs alternatives, on the first Token.
	PromptLogprobs bool
	IgnoreEOS      bool
	// JSON asks for JSON mode (response_format {"type": "json_object"}):
	// the completion is one JSON object, and ends when it closes. Schema,
	// with JSON, is a JSON schema the object must follow (response_format
	// {"type": "json_schema"}), compact; the backend refuses one it cannot
	// take with ErrInvalidRequest.
	JSON   bool
	Schema string
	// CompactJSON, with Schema, allows one space at most between the JSON's
	// tokens: the gateway asks it for tool calls, which programs read.
	CompactJSON bool
	Tenant      string // identity of the API key that sent the request; "" without keys
	User        string // the OpenAI "user" field, for abuse tracking
}

// Token is one generated token as the Backend reports it.
type Token struct {
	ID          int32
	Text        string // the text this token adds to the completion (incremental detokenization)
	Logprob     float32
	TopLogprobs []TokenLogprob
	// Prompt, on the first token of a generation that asked
	// (GenerateRequest.PromptLogprobs), holds the prompt's tokens after
	// the first, in order, each with its log-probability and alternatives.
	Prompt  []PromptLogprob
	TraceID string // the request's trace, for the demo page and debugging
	// QueuedAt is when the request entered the backend's queue, StartedAt when its
	// prefill started and EmittedAt when this token was sampled. Zero values are
	// filled in by the gateway with the time it learns of them.
	QueuedAt, StartedAt, EmittedAt time.Time
}

// PromptLogprob is a prompt token's log-probability given the tokens
// before it, and the most likely tokens there.
type PromptLogprob struct {
	ID      int32
	Logprob float32
	Top     []TokenLogprob
}

// TokenLogprob is one alternative token and its log-probability. Text may be empty;
// the gateway then decodes ID.
type TokenLogprob struct {
	ID      int32
	Text    string
	Logprob float32
}

// Finish reasons.
const (
	FinishStop      = "stop"
	FinishLength    = "length"
	FinishCancelled = "cancelled"
	FinishError     = "error"
)

// Finish is how a generation ended.
type Finish struct {
	Reason           string // FinishStop, FinishLength, FinishCancelled or FinishError
	PromptTokens     int
	CompletionTokens int
	// CachedTokens counts the prompt tokens the backend found computed
	// (a prefix cache), reported as usage's cached_tokens.
	CachedTokens int
}

// ErrOverloaded is matched (errors.Is) by Backend errors that mean "queue full, try
// later". The gateway answers 429 with a Retry-After header.
var ErrOverloaded = errors.New("backend overloaded")

// ErrInvalidRequest is matched by Backend errors that mean the request itself cannot be
// served; the gateway answers 400 with the error's text.
var ErrInvalidRequest = errors.New("invalid request")

// OverloadedError is an ErrOverloaded with a suggested delay before retrying.
type OverloadedError struct {
	RetryAfter time.Duration
	Reason     string
}

func (e *OverloadedError) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("backend overloaded, retry after %s", e.RetryAfter)
	}
	return fmt.Sprintf("backend overloaded (%s), retry after %s", e.Reason, e.RetryAfter)
}

// Is makes errors.Is(err, ErrOverloaded) true.
func (e *OverloadedError) Is(target error) bool { return target == ErrOverloaded }

// StatsSource is an optional Backend capability: a Backend that implements it has its
// figures exported on /metrics. Stats must be cheap and safe for concurrent use.
type StatsSource interface {
	Stats() Stats
}

// Stats is a snapshot of the serving side behind the gateway.
type Stats struct {
	QueueDepth    int            // requests waiting to start
	Running       int            // sequences in the running set
	KVUsage       float64        // fraction of KV blocks in use, 0..1
	MailboxDepths map[string]int // queued messages per actor (name -> depth)
}
