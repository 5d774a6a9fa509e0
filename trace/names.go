package trace

import "go.opentelemetry.io/otel/attribute"

// Span names. One trace covers one request; its spans nest as the package
// documentation shows.
const (
	// SpanRequest covers a request from admission to its last token.
	SpanRequest = "request"
	// SpanQueue covers the time a request waits before its prefill starts.
	SpanQueue = "queue"
	// SpanPrefill covers one prefill chunk. The chunk that produces the first
	// token carries AttrTokenSeq and has shard.forward, sample and emit children.
	SpanPrefill = "prefill"
	// SpanDecodeStep covers the production of one token of one request.
	SpanDecodeStep = "decode.step"
	// SpanShardForward covers one layer-shard's forward pass within a step.
	SpanShardForward = "shard.forward"
	// SpanSample covers sampling the next token from the logits.
	SpanSample = "sample"
	// SpanEmit covers sending the token frame towards the client.
	SpanEmit = "emit"
)

// Attribute keys.
const (
	AttrRequestID  = attribute.Key("request.id")
	AttrBatchSize  = attribute.Key("batch.size")
	AttrPosition   = attribute.Key("position")
	AttrKVBlocks   = attribute.Key("kv.blocks")
	AttrTokenSeq   = attribute.Key("token.seq")
	AttrTokenID    = attribute.Key("token.id")
	AttrShardIndex = attribute.Key("shard.index")
	// AttrLayerStart and AttrLayerEnd give a shard's layers as the half-open
	// range [start, end).
	AttrLayerStart = attribute.Key("shard.layer.start")
	AttrLayerEnd   = attribute.Key("shard.layer.end")
	// AttrShardRank is a tensor-parallel rank's index in its group; the
	// ranks of one step share shard.index.
	AttrShardRank = attribute.Key("shard.rank")
	// AttrPromptTokens is the number of prompt tokens a prefill chunk covers.
	AttrPromptTokens = attribute.Key("prefill.tokens")
	// AttrShardAhead says how a shard that queues greedy steps ahead met a
	// step: "answered" (the step was queued already), "issued" (it was
	// not), "dropped" (another step was queued, and dropped for it).
	AttrShardAhead = attribute.Key("shard.ahead")
)
