package scheduler

import (
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gpu"
)

// Messages of the scheduler's subjects (docs/subjects.md).

// SubmitMsg asks a scheduler to run a request; the reply is a SubmitReply
// or an error with code overloaded or bad_request. Frames follow on the
// request's tokens subject, which the client subscribes to before sending.
type SubmitMsg struct {
	ID                string            `msgpack:"id"`
	Tenant            string            `msgpack:"tenant"`
	Prompt            []int32           `msgpack:"prompt"`
	MaxTokens         int               `msgpack:"max_tokens"`
	Temperature       float32           `msgpack:"temperature"`
	TopP              float32           `msgpack:"top_p"`
	TopK              int               `msgpack:"top_k"`
	MinP              float32           `msgpack:"min_p"`
	RepetitionPenalty float32           `msgpack:"repetition_penalty"`
	PresencePenalty   float32           `msgpack:"presence_penalty"`
	FrequencyPenalty  float32           `msgpack:"frequency_penalty"`
	LogitBias         map[int32]float32 `msgpack:"logit_bias"`
	HasSeed           bool              `msgpack:"has_seed"`
	Seed              int64             `msgpack:"seed"`
	Stop              []string          `msgpack:"stop"`
	IgnoreEOS         bool              `msgpack:"ignore_eos"`
	Logprobs          bool              `msgpack:"logprobs"`
	TopLogprobs       int               `msgpack:"top_logprobs"`
	// PromptLogprobs asks for the prompt's tokens' log-probabilities
	// (generate.Params.PromptLogprobs), on the first frame.
	PromptLogprobs bool `msgpack:"prompt_logprobs,omitempty"`
	// JSON asks for JSON mode: the output is one JSON object; Schema, a
	// JSON schema that object follows.
	JSON       bool   `msgpack:"json"`
	JSONSchema string `msgpack:"json_schema,omitempty"`
	// JSONCompact, with JSONSchema, allows one space at most between the
	// JSON's tokens (grammar.Schema.Compact).
	JSONCompact bool `msgpack:"json_compact,omitempty"`
}

// Schema implements bus.Message.
func (SubmitMsg) Schema() bus.Schema { return bus.Schema{ID: "troupe.sched.submit", Version: 5} }

// SubmitReply accepts a request.
type SubmitReply struct {
	Queued int `msgpack:"queued"` // requests waiting, this one included
	// Service is the instance id of the scheduler's micro service, which
	// answers PING while the scheduler lives: the client asks it when the
	// frames stop coming.
	Service string `msgpack:"service,omitempty"`
}

// Schema implements bus.Message.
func (SubmitReply) Schema() bus.Schema {
	return bus.Schema{ID: "troupe.sched.submit_reply", Version: 2}
}

// CancelMsg ends a request.
type CancelMsg struct {
	ID string `msgpack:"id"`
}

// Schema implements bus.Message.
func (CancelMsg) Schema() bus.Schema { return bus.Schema{ID: "troupe.sched.cancel", Version: 1} }

// FrameMsg is one token of a request, or its end.
type FrameMsg struct {
	Seq              int       `msgpack:"seq"`
	ID               int32     `msgpack:"id"`
	Text             string    `msgpack:"text"`
	Logprob          float32   `msgpack:"logprob"`
	TopIDs           []int32   `msgpack:"top_ids"`
	TopLPs           []float32 `msgpack:"top_lps"`
	Final            bool      `msgpack:"final"`
	Reason           string    `msgpack:"reason"`
	Err              string    `msgpack:"err"`
	PromptTokens     int       `msgpack:"prompt_tokens"`
	CompletionTokens int       `msgpack:"completion_tokens"`
	CachedTokens     int       `msgpack:"cached_tokens"` // Frame.CachedTokens (v3)
	QueuedUS         int64     `msgpack:"queued_us"`
	SinceStartUS     int64     `msgpack:"since_start_us"`
	SinceLastUS      int64     `msgpack:"since_last_us"`
	TraceID          string    `msgpack:"trace_id"`
	// Prompt, on the first frame of a request that asks, holds its
	// prompt's log-probabilities (Frame.Prompt).
	Prompt []PromptLogprobMsg `msgpack:"prompt,omitempty"`
}

// PromptLogprobMsg is a prompt token's log-probability and the most
// likely tokens where it stood.
type PromptLogprobMsg struct {
	ID      int32     `msgpack:"id"`
	Logprob float32   `msgpack:"logprob"`
	TopIDs  []int32   `msgpack:"top_ids"`
	TopLPs  []float32 `msgpack:"top_lps"`
}

// Schema implements bus.Message.
func (FrameMsg) Schema() bus.Schema { return bus.Schema{ID: "troupe.sched.frame", Version: 3} }

// StatsMsg asks for, and answers with, a scheduler's state.
type StatsMsg struct {
	Waiting     int     `msgpack:"waiting"`
	Running     int     `msgpack:"running"`
	Steps       uint64  `msgpack:"steps"`
	Tokens      uint64  `msgpack:"tokens"`
	Preemptions uint64  `msgpack:"preemptions"`
	KV          KVStats `msgpack:"kv"`
}

// Schema implements bus.Message.
func (StatsMsg) Schema() bus.Schema { return bus.Schema{ID: "troupe.sched.stats", Version: 1} }

// ForwardMsg is one step's plan for a layer-shard: the batch's indexes and,
// for a stage after the first, a reference to the previous stage's output.
// Micro is 0 for a whole step, or m+1 for micro-batch m of a step cut into
// micro-batches: each has its own output buffer on the shard's plane.
type ForwardMsg struct {
	Step   uint64        `msgpack:"step"`
	Micro  int           `msgpack:"micro"`
	Tokens []int32       `msgpack:"tokens"`
	Pos    []int32       `msgpack:"pos"`
	Seq    []int32       `msgpack:"seq"`
	Tables [][]int32     `msgpack:"tables"`
	Logits []int32       `msgpack:"logits"`
	Input  bus.TensorRef `msgpack:"input"`
	// Argmax asks the last stage for each logits row's most likely token
	// (ForwardReply.IDs) instead of the logits.
	Argmax bool `msgpack:"argmax,omitempty"`
	// Sample asks the last stage for a token drawn from each logits row as
	// its entry says (ForwardReply.IDs) instead of the logits.
	Sample []gpu.SampleRow `msgpack:"sample,omitempty"`
	// Continues says the scheduler means to run next the step after this
	// one for the same sequences (models.Batch.Continues).
	Continues bool `msgpack:"continues,omitempty"`
	// NextSample, for a Sample step that Continues, are the draws of the
	// step after it (models.Batch.NextDraws).
	NextSample []gpu.SampleRow `msgpack:"next_sample,omitempty"`
	// Read, for an Argmax or Sample step, lists the logits rows (indexes
	// into Logits, increasing) the last stage returns with the tokens
	// (models.Batch.Read).
	Read []int32 `msgpack:"read,omitempty"`
	// Summaries asks for those rows summarized, with the Top most likely
	// tokens' log-probabilities (models.Batch.Summaries).
	Summaries bool `msgpack:"summaries,omitempty"`
	Top       int  `msgpack:"top,omitempty"`
}

// Schema implements bus.Message.
func (ForwardMsg) Schema() bus.Schema { return bus.Schema{ID: "troupe.shard.forward", Version: 5} }

// ForwardReply names a shard's output: activations, or logits from the last stage.
type ForwardReply struct {
	Output bus.TensorRef `msgpack:"output"`
	// IDs are the chosen tokens of an Argmax or Sample step's last stage,
	// one per logits row; Output then names the logits rows the step's
	// Read asked for, or is empty.
	IDs []int32 `msgpack:"ids,omitempty"`
}

// Schema implements bus.Message.
func (ForwardReply) Schema() bus.Schema {
	return bus.Schema{ID: "troupe.shard.forward_reply", Version: 1}
}
