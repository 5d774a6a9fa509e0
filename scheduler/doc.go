// Package scheduler runs continuous batching: it admits requests, plans
// every step's batch of prefill chunks and decode tokens, samples, streams
// token frames out, cancels, and preempts under KV-cache pressure.
//
// The Scheduler is transport-neutral: it drives an Engine (the pipeline of
// layer-shard actors, or a model called directly) and a Blocks allocator
// (the KV-manager actor, or a local KV). The actor wrappers put it on the
// bus. The Pipeline and the KVClient reach actors of their own process
// through actors.Ask (Pipeline.Local, KVClient.Local) and others over the
// bus; an idle local actor runs the request on the scheduler's goroutine.
// A Client submits to a model's schedulers over the bus, or to those of its
// own process given to Client.Local, as Go calls with the frames in memory.
// With Pipeline.MicroBatches, a step of several sequences runs through the
// stages as a wavefront of micro-batches, a goroutine per stage that the
// step starts and waits for.
//
// Tensor parallelism: Lockstep is the Engine of a replica whose one stage
// is split over ranks, layer-shard actors that it drives in lock-step; a
// TPStage is such a stage as one actor of kind shard, so that a Pipeline
// runs stages of ranks as it runs layer-shards.
//
// Concurrency: Run is the scheduler's one goroutine; Submit, Cancel and
// Stats may be called from any goroutine. Frames are delivered to each
// request's Sink on the Run goroutine, in order; a Sink must not block.
package scheduler
