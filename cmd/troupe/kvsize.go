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
		return kvPlan{}, fmt.Errorf("the KV cache does not fit: %s of %s free leaves room for %d blocks of 16 tokens a replica (%d replica(s), weights %s), fewer than %d; give --kv-blocks, fewer --replicas or --max-batch-tokens, or a device with more memory",
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
// second result is what sized it by memory, for the replicas added while
// serving (nil for --kv-blocks or a device that does not report its
// memory); the third says how it was chosen, for the log.
func kvBlocks(cfg serveConfig, mc *models.Config, ckpt int64, cache gpu.DType, dev gpu.Device) (int, *kvNeeds, string, error) {
	if cfg.KVBlocks > 0 {
		return cfg.KVBlocks, nil, "", nil
	}
	ctx := (mc.MaxPositions + 15) / 16
	want := min(cfg.MaxSeqs, 64) * ctx
	mr, ok := dev.(gpu.MemoryReporter)
	if !ok {
		return want, nil, "", nil
	}
	free, _, err := mr.FreeMemory()
	if err != nil {
		return want, nil, fmt.Sprintf("kv cache: %d blocks of 16 tokens a replica (free memory unknown: %v)", want, err), nil
	}
	n := kvNeeds{
		want: want, context: ctx, replicas: max(1, cfg.Replicas),
		blockBytes: int64(2 * mc.Layers * 16 * mc.KVHeads * mc.HeadDim * cache.Size()),
		weights:    ckpt,
		// The logits of a step's rows and room for its activations, f32.
		scratch: int64(cfg.MaxBatchTokens) * int64(mc.Vocab+8*mc.Hidden+4*mc.Intermediate) * 4,
	}
	if cfg.Device == "cuda" && cfg.TP <= 1 {
		// The coded twins, as loading resolves the coding beside the
		// weights.
		n.weights += models.TwinBytes(mc, cfg.CodeWeights.Resolve(mc, dev, free-ckpt), dev)
	}
	if tp := int64(max(1, cfg.TP)); tp > 1 {
		// A replica's stages split its layers, and each stage's ranks
		// split the stage's weights and blocks.
		ways := tp * int64(max(1, cfg.Shards))
		if cfg.Device == "cuda" {
			// Each rank holds its share on a GPU of its own, one replica
			// a GPU.
			n.replicas, n.blockBytes, n.weights = 1, n.blockBytes/ways, n.weights/ways
		} else {
			// The ranks share the host's memory, and each replica's ranks
			// load their own shares of the weights.
			n.weights *= int64(n.replicas)
			n.scratch *= ways
		}
	}
	p, err := planKV(n, free)
	if err != nil {
		return 0, nil, "", fmt.Errorf("serve: %w", err)
	}
	return p.blocks, &n, p.note, nil
}

// addedBlocks sizes the cache of a local replica of stageCount stages
// added while serving, where the node's caches are sized by memory
// (n.kvAuto): the start's n.blocks where the device's free memory holds
// them beside the weights of the stages not loaded here yet and the
// replica's activations, else as many as fit, and an error where fewer
// than minKVBlocks do. The replicas of the node's start, of tensor-parallel
// nodes and of groups over placements take n.blocks.
func (n *node) addedBlocks(stageCount int) (int, error) {
	mr, ok := n.dev.(gpu.MemoryReporter)
	if n.kvAuto == nil || !n.started || !ok || n.tpd != nil {
		return n.blocks, nil
	}
	free, _, err := mr.FreeMemory()
	if err != nil {
		return n.blocks, nil
	}
	need := *n.kvAuto
	need.want, need.replicas, need.weights = n.blocks, 1, 0
	layers := n.bundle.Config.Layers
	n.weightsMu.Lock()
	for s := range stageCount {
		if span := stageSpan(s, stageCount, layers); n.weights[span] == nil {
			need.weights += n.kvAuto.weights * int64(span[1]-span[0]) / int64(layers)
		}
	}
	n.weightsMu.Unlock()
	p, err := planKV(need, free)
	if err != nil {
		return 0, fmt.Errorf("a replica added: %w", err)
	}
	if p.blocks < n.blocks {
		fmt.Fprintf(n.log, "kv cache: %d blocks of 16 tokens (%s) for a new replica, where the others have %d, as fits in %s free\n",
			p.blocks, bytesOf(int64(p.blocks)*need.blockBytes), n.blocks, bytesOf(free))
	}
	return p.blocks, nil
}
