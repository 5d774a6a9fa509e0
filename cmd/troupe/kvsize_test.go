package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/gpu/ref"
	"github.com/troupe/troupe/models"
)

// memDev is a device that reports free bytes of memory, or err.
type memDev struct {
	gpu.Device
	free int64
	err  error
}

func (d memDev) FreeMemory() (int64, int64, error) { return d.free, 2 * d.free, d.err }

// coderDev is a device that reports free bytes of memory and plans coded
// weights as the CUDA lane does.
type coderDev struct {
	gputest.Coder
	free int64
}

func (d coderDev) FreeMemory() (int64, int64, error) { return d.free, 2 * d.free, nil }

// TestKVBlocks sizes the KV cache of OLMo-2-1B's shape (16 layers, 16
// KV heads of 128, 4,096 positions: a bf16 block of 16 tokens is 2 MiB,
// a full context 256 blocks) by the device's free memory.
func TestKVBlocks(t *testing.T) {
	mc := &models.Config{Layers: 16, Heads: 16, KVHeads: 16, HeadDim: 128, MaxPositions: 4096, Vocab: 100352, Hidden: 2048, Intermediate: 8192}
	const gib, weights = int64(1) << 30, int64(2_560_000_000)
	cfg := defaultServeConfig()
	scratch := int64(cfg.MaxBatchTokens) * int64(mc.Vocab+8*mc.Hidden+4*mc.Intermediate) * 4
	fits := func(free int64, replicas int) int {
		return int((int64(kvShare*float64(free)) - weights - int64(replicas)*scratch) / (int64(replicas) * (2 << 20)))
	}
	// The coded twins: the head's (308 MB) and with all the MLP products'
	// too (1.52 GB in all), which auto takes where they fit in an eighth of
	// the memory free beside the weights.
	coded := func(free int64, c models.Coding) int {
		return int((int64(kvShare*float64(free)) - weights - models.TwinBytes(mc, c, coderDev{}) - scratch) / (2 << 20))
	}
	if head, all := models.TwinBytes(mc, models.CodeHead, coderDev{}), models.TwinBytes(mc, models.CodeAll, coderDev{}); head != 100352*2048*3/2 || all <= head {
		t.Fatalf("twins: head %d bytes, all %d", head, all)
	}
	for _, c := range []struct {
		name     string
		kvBlocks int
		replicas int
		tp       int
		device   string
		dev      gpu.Device
		want     int
		note     string // a part of the log line; "" for none
		err      string
		shards   int // 0 for one stage
	}{
		{"--kv-blocks", 100, 1, 1, "cpu", memDev{Device: ref.New(), free: gib}, 100, "", "", 0},
		{"no memory figures", 0, 1, 1, "cpu", struct{ gpu.Device }{ref.New()}, 64 * 256, "", "", 0},
		{"figures unknown", 0, 1, 1, "cpu", memDev{Device: ref.New(), err: errors.New("no /proc")}, 64 * 256, "free memory unknown: no /proc", "", 0},
		{"room for all", 0, 1, 1, "cpu", memDev{Device: ref.New(), free: 141 * gib}, 64 * 256, "64 full contexts, of 141.00 GiB free", "", 0},
		{"room for some", 0, 1, 1, "cpu", memDev{Device: ref.New(), free: 20 * gib}, fits(20*gib, 1), "where --max-seqs asks for 64", "", 0},
		{"two replicas share it", 0, 2, 1, "cpu", memDev{Device: ref.New(), free: 40 * gib}, fits(40*gib, 2), "where --max-seqs asks for 64", "", 0},
		{"less than a context", 0, 1, 1, "cpu", memDev{Device: ref.New(), free: 3500 << 20}, fits(3500<<20, 1), "less than one full context of 4096 tokens", "", 0},
		{"too little", 0, 1, 1, "cpu", memDev{Device: ref.New(), free: 3 * gib}, 0, "", "--kv-blocks", 0},
		{"auto codes all beside the weights", 0, 1, 1, "cuda", coderDev{gputest.Coder{Device: ref.New()}, 20 * gib}, coded(20*gib, models.CodeAll), "where --max-seqs asks for 64", "", 0},
		{"auto codes the head where memory is short", 0, 1, 1, "cuda", coderDev{gputest.Coder{Device: ref.New()}, 12 * gib}, coded(12*gib, models.CodeHead), "where --max-seqs asks for 64", "", 0},
		// On GPUs each rank holds half the weights and half of every
		// block, one replica a GPU; on the CPU lane the two replicas' four
		// ranks share the memory, each replica holding the whole weights
		// and every rank its scratch.
		{"tensor-parallel GPUs halve it", 0, 2, 2, "cuda", memDev{Device: ref.New(), free: 10 * gib},
			int((int64(kvShare*float64(10*gib)) - weights/2 - scratch) / (1 << 20)), "where --max-seqs asks for 64", "", 0},
		{"tensor-parallel CPU ranks share the memory", 0, 2, 2, "cpu", memDev{Device: ref.New(), free: 40 * gib},
			int((int64(kvShare*float64(40*gib)) - 2*weights - 2*2*scratch) / (2 * (2 << 20))), "where --max-seqs asks for 64", "", 0},
		// Two stages of two ranks: every GPU holds a quarter of the
		// weights and of every block.
		{"tensor-parallel stages on GPUs", 0, 1, 2, "cuda", memDev{Device: ref.New(), free: 5 * gib},
			int((int64(kvShare*float64(5*gib)) - weights/4 - scratch) / (512 << 10)), "where --max-seqs asks for 64", "", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := cfg
			cfg.KVBlocks, cfg.Replicas, cfg.TP, cfg.Device, cfg.Shards = c.kvBlocks, c.replicas, c.tp, c.device, max(1, c.shards)
			got, auto, note, err := kvBlocks(cfg, mc, weights, gpu.BF16, c.dev)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %d blocks, error %v; want an error naming %s", got, err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got %d blocks, want %d", got, c.want)
			}
			if (c.note == "") != (note == "") || !strings.Contains(note, c.note) {
				t.Errorf("note %q, want one containing %q", note, c.note)
			}
			// What sized the cache by memory is kept for the replicas
			// added later.
			if _, reports := c.dev.(gpu.MemoryReporter); (auto != nil) != (reports && c.kvBlocks == 0 && !strings.Contains(c.note, "unknown")) {
				t.Errorf("sized by memory: %v", auto != nil)
			}
		})
	}
}

// TestAddedBlocks sizes the cache of a replica added while serving by the
// memory free then: the start's size where it fits, with the weights of
// stages not loaded yet, else less, else an error.
func TestAddedBlocks(t *testing.T) {
	mc := &models.Config{Layers: 16, KVHeads: 16, HeadDim: 128, MaxPositions: 4096, Vocab: 100352, Hidden: 2048, Intermediate: 8192}
	const gib, weights = int64(1) << 30, int64(2 << 30)
	need := kvNeeds{want: 64 * 256, context: 256, replicas: 1, blockBytes: 2 << 20, weights: weights, scratch: 300 << 20}
	loaded := map[[2]int]*sharedWeights{{0, 16}: {}}
	for _, c := range []struct {
		name    string
		auto    *kvNeeds
		started bool
		free    int64
		stages  int
		want    int
		err     bool
	}{
		{"the start's replicas", &need, false, 1 * gib, 1, 4096, false},
		{"--kv-blocks", nil, true, 1 * gib, 1, 4096, false},
		{"room for the start's size", &need, true, 20 * gib, 1, 4096, false},
		{"less room", &need, true, 5 * gib, 1, int((int64(0.9*float64(5*gib)) - need.scratch) / (2 << 20)), false},
		{"new stages load weights", &need, true, 5 * gib, 2, int((int64(0.9*float64(5*gib)) - weights - need.scratch) / (2 << 20)), false},
		{"no room", &need, true, 400 << 20, 1, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var log strings.Builder
			n := &node{bundle: &models.Bundle{Config: mc}, dev: memDev{Device: ref.New(), free: c.free}, log: &log,
				blocks: 4096, kvAuto: c.auto, started: c.started, weights: loaded}
			got, err := n.addedBlocks(c.stages)
			if (err != nil) != c.err {
				t.Fatalf("got %d blocks, error %v", got, err)
			}
			if err == nil && got != c.want {
				t.Errorf("got %d blocks, want %d", got, c.want)
			}
			if said := log.Len() > 0; err == nil && said != (got < 4096) {
				t.Errorf("log %q for %d blocks of 4096", log.String(), got)
			}
		})
	}
}
