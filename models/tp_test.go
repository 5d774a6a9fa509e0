package models_test

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/modeltest"
)

// hostReducer sums f32 buffers of several host devices through host
// memory: each rank reads its buffer, the last to arrive adds them in rank
// order, and every rank writes the sum back. It stands in for xgmi's CUDA
// fabric on the CPU lane.
type hostReducer struct {
	mu      sync.Mutex
	cond    *sync.Cond
	devs    []gpu.Device
	parts   [][]float32
	arrived int
	gen     int
	sum     []float32
}

func newHostReducer(devs []gpu.Device) *hostReducer {
	r := &hostReducer{devs: devs, parts: make([][]float32, len(devs))}
	r.cond = sync.NewCond(&r.mu)
	return r
}

type hostRank struct {
	r    *hostReducer
	rank int
}

func (h hostRank) AllReduceN(dst, src gpu.Buffer, n int) error {
	r := h.r
	if src.DType() != gpu.F32 || dst.DType() != gpu.F32 {
		return fmt.Errorf("host reducer: f32 only")
	}
	part := make([]float32, n)
	if err := r.devs[h.rank].Read(gpu.F32Bytes(part), src, 0); err != nil {
		return err
	}
	r.mu.Lock()
	gen := r.gen
	r.parts[h.rank] = part
	r.arrived++
	if r.arrived == len(r.devs) {
		sum := make([]float32, n)
		for k, p := range r.parts {
			for i, v := range p {
				if k == 0 {
					sum[i] = v
				} else {
					sum[i] += v
				}
			}
		}
		r.sum, r.arrived = sum, 0
		r.gen++
		r.cond.Broadcast()
	}
	for r.gen == gen {
		r.cond.Wait()
	}
	sum := r.sum
	r.mu.Unlock()
	return r.devs[h.rank].Write(dst, 0, gpu.F32Bytes(sum))
}

// AllGather is unused on the CPU lane (its LM head is not split: the CPU
// device has no views).
func (h hostRank) AllGather(dst, src gpu.Buffer) error {
	return fmt.Errorf("host reducer: all-gather is not implemented")
}

// TestTensorParallelCPU splits the pre-norm fixtures (grouped-query
// attention, per-head QK-norm) over two CPU devices summing through host
// memory, and checks the logits and the greedy path against the whole
// model's, and the queued steps (IssueStep) of the group and of ranks
// driven each by itself against their loops.
// OLMo 2's sharded QK-norm needs a gpu.ShardNormer (the CUDA lane;
// TestCUDATensorParallel).
func TestTensorParallelCPU(t *testing.T) {
	for _, f := range []string{"llama-gqa", "qwen3"} {
		t.Run(f, func(t *testing.T) {
			b, err := models.OpenDir(modeltest.MustShared(t, filepath.Join("fixtures", f)))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			devs := oneThreadCPUs(t, 3)
			red := newHostReducer(devs[1:])
			o := models.Options{MaxTokens: 16}
			whole, err := models.Load(b.Config, b.Checkpoint, devs[0], o)
			if err != nil {
				t.Fatal(err)
			}
			defer whole.Close()
			split, err := models.LoadTP(b.Config, b.Checkpoint, devs[1:], []models.Reducer{hostRank{red, 0}, hostRank{red, 1}}, o)
			if err != nil {
				t.Fatal(err)
			}
			defer split.Close()
			prompt := []int32{1, 45, 84, 33, 26, 29, 17, 28, 5, 9, 100, 7, 3, 8, 60, 61, 62, 63, 64, 2} // more than MaxTokens: two chunks
			rel, greedy := compareSplit(t, whole, split, prompt, 12)
			t.Logf("%s over 2 ranks: logits relative L2 %.2e, greedy %v", f, rel, greedy[1])
			if split.Ranks() != 2 || rel > 1e-5 || math.IsNaN(rel) {
				t.Errorf("split logits differ from the whole model's: relative L2 %.3e", rel)
			}
			for i := range greedy[0] {
				if greedy[0][i] != greedy[1][i] {
					t.Fatalf("greedy step %d: split %v, whole %v", i, greedy[1], greedy[0])
				}
			}
			// The group queues steps on every rank, fed on the devices.
			if !split.Chains() || !split.ChainsDraws(chainDraws(0)) {
				t.Fatal("the split model does not chain")
			}
			checkChains(t, split)
			// Ranks of their own, as scheduler.Lockstep drives them: each
			// queues its steps itself, and the collectives inside keep
			// them in lock-step.
			own := newHostReducer(devs[1:])
			var ranks []*models.Model
			for r := range 2 {
				ro := o
				ro.Shard = &models.Shard{Rank: r, Size: 2, Comm: hostRank{own, r}}
				m, err := models.Load(b.Config, b.Checkpoint, devs[1+r], ro)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				ranks = append(ranks, m)
			}
			t.Run("ranks", func(t *testing.T) {
				for r, m := range ranks {
					t.Run(fmt.Sprint(r), func(t *testing.T) {
						t.Parallel()
						if !m.Chains() {
							t.Fatal("a rank of its own does not chain")
						}
						checkChains(t, m)
					})
				}
			})
		})
	}
}

// oneThreadCPUs opens n CPU devices of a thread each, closed when the test
// ends.
func oneThreadCPUs(t *testing.T, n int) []gpu.Device {
	t.Helper()
	var devs []gpu.Device
	for range n {
		d, err := cpu.New(cpu.Config{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		devs = append(devs, d)
	}
	return devs
}

// compareSplit feeds prompt to the whole model and to its tensor-parallel
// split, then decodes steps greedy tokens with each; it returns the relative
// L2 distance of the split's prompt logits from the whole model's, and both
// greedy paths (whole first).
func compareSplit(t *testing.T, whole, split *models.Model, prompt []int32, steps int) (float64, [2][]int32) {
	t.Helper()
	ctx := context.Background()
	V := whole.Config.Vocab
	var logits [2][]float32
	var greedy [2][]int32
	for k, m := range []*models.Model{whole, split} {
		s, err := m.NewSequence(len(prompt) + steps + 1)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		l, err := s.Feed(ctx, prompt, true)
		if err != nil {
			t.Fatalf("model %d: %v", k, err)
		}
		logits[k] = append([]float32(nil), l...)
		next := argmaxF(l[(len(prompt)-1)*V:])
		for range steps {
			greedy[k] = append(greedy[k], next)
			if next, err = s.FeedArgmax(ctx, []int32{next}); err != nil {
				t.Fatalf("model %d: %v", k, err)
			}
		}
		// Sequence.Greedy (steps chained on the devices where they can be)
		// chooses the same tokens.
		g, err := m.NewSequence(len(prompt) + steps + 1)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if _, err := g.Feed(ctx, prompt, false); err != nil {
			t.Fatalf("model %d: %v", k, err)
		}
		var chained []int32
		if err := g.Greedy(ctx, greedy[k][0], steps-1, func(id int32) { chained = append(chained, id) }); err != nil {
			t.Fatalf("model %d: Greedy: %v", k, err)
		}
		if !slices.Equal(chained, greedy[k][1:]) {
			t.Errorf("model %d: Greedy chose %v, FeedArgmax %v", k, chained, greedy[k][1:])
		}
	}
	var num, den float64
	for i, w := range logits[0] {
		d := float64(logits[1][i] - w)
		num += d * d
		den += float64(w) * float64(w)
	}
	return math.Sqrt(num / den), greedy
}

func argmaxF(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}
