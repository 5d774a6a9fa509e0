package main

import (
	"fmt"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
)

// kvShare is the share of a device's free memory the KV caches of its
// replicas may take, with the weights and each replica's activations; the
// rest is left to the allocator, CUDA graphs and (on the host) the
// operating system.
const kvShare = 0.9

// minKVBlocks is the smallest cache a replica is started with unless
// --kv-blocks asks for it: 1,024 tokens.
const minKVBlocks = 64

// kvNeeds is what sizes a replica's KV cache when --kv-blocks is 0.
type kvNeeds struct {
	want       int   // blocks of --max-seqs full contexts (at most 64)
	context    int   // blocks of one full context
	replicas   int   // replicas sharing the device
	blockBytes int64 // one block of every layer, on one device
	weights    int64 // the weights on one device, shared by its replicas
	scratch    int64 // one replica's activations at --max-batch-tokens
}

// kvPlan is a replica's KV cache as sized by memory.
type kvPlan struct {
	blocks int
	note   string // the choice in words, for the log
}

// planKV sizes each replica's cache: n.want blocks where they fit in
// kvShare of free bytes once the weights and every replica's activations
// are set aside, else as many as fit. It fails where fewer than
// minKVBlocks fit.
func planKV(n kvNeeds, free int64) (kvPlan, error) {
	room := int64(kvShare*float64(free)) - n.weights - int64(n.replicas)*n.scratch
	fits := int64(0)
	if room > 0 && n.blockBytes > 0 {
		fits = room / (int64(n.replicas) * n.blockBytes)
	}
	blocks := int(min(int64(n.want), fits))
	tokens := func(b int) string {
		return fmt.Sprintf("%d blocks of 16 tokens (%s)", b, bytesOf(int64(b)*n.blockBytes))
	}
	if blocks < minKVBlocks {
		return kvPlan{}, fmt.Errorf("serve: the KV cache does not fit: %s of %s free leaves room for %d blocks of 16 tokens a replica (%d replica(s), weights %s), fewer than %d; give --kv-blocks, fewer --replicas or --max-batch-tokens, or a device with more memory",
			bytesOf(int64(kvShare*float64(free))), bytesOf(free), max(0, fits), n.replicas, bytesOf(n.weights), minKVBlocks)
	}
	p := kvPlan{blocks: blocks}
	switch {
	case blocks == n.want:
		p.note = fmt.Sprintf("kv cache: %s a replica, %d full contexts, of %s free", tokens(blocks), blocks/n.context, bytesOf(free))
	case blocks < n.context:
		p.note = fmt.Sprintf("kv cache: %s a replica, less than one full context of %d tokens, as fits in %s free; longer sequences fail (--kv-blocks sets it)", tokens(blocks), 16*n.context, bytesOf(free))
	default:
		p.note = fmt.Sprintf("kv cache: %s a replica, %d full contexts where --max-seqs asks for %d, as fits in %s free (--kv-blocks sets it)", tokens(blocks), blocks/n.context, n.want/n.context, bytesOf(free))
	}
	return p, nil
}

// kvBlocks is a replica's KV cache in blocks of 16 tokens: --kv-blocks,
// or with 0 --max-seqs full contexts (at most 64) where the device's free
// memory holds them (gpu.MemoryReporter), else as many as it holds. The
// second result says how it was chosen, for the log ("" for --kv-blocks
// or a device that does not report its memory).
func kvBlocks(cfg serveConfig, mc *models.Config, ckpt int64, cache gpu.DType, dev gpu.Device) (int, string, error) {
	if cfg.KVBlocks > 0 {
		return cfg.KVBlocks, "", nil
	}
	ctx := (mc.MaxPositions + 15) / 16
	want := min(cfg.MaxSeqs, 64) * ctx
	mr, ok := dev.(gpu.MemoryReporter)
	if !ok {
		return want, "", nil
	}
	free, _, err := mr.FreeMemory()
	if err != nil {
		return want, fmt.Sprintf("kv cache: %d blocks of 16 tokens a replica (free memory unknown: %v)", want, err), nil
	}
	n := kvNeeds{
		want: want, context: ctx, replicas: max(1, cfg.Replicas),
		blockBytes: int64(2 * mc.Layers * 16 * mc.KVHeads * mc.HeadDim * cache.Size()),
		weights:    ckpt,
		// The logits of a step's rows and room for its activations, f32.
		scratch: int64(cfg.MaxBatchTokens) * int64(mc.Vocab+8*mc.Hidden+4*mc.Intermediate) * 4,
	}
	if tp := int64(max(1, cfg.TP)); tp > 1 {
		if cfg.Device == "cuda" {
			// Each rank holds a share of the weights and of every block on
			// a GPU of its own, one replica a GPU.
			n.replicas, n.blockBytes, n.weights = 1, n.blockBytes/tp, n.weights/tp
		} else {
			// The ranks share the host's memory, and each replica's ranks
			// load their own shares of the weights.
			n.weights *= int64(n.replicas)
			n.scratch *= tp
		}
	}
	p, err := planKV(n, free)
	if err != nil {
		return 0, "", err
	}
	return p.blocks, p.note, nil
}
