package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkPipelineHosts serves the demo model from three troupe processes
// on three hosts (network namespaces joined by veth pairs to a bridge, as
// in TestClusterNetns; needs root) and measures, for each placement of the
// one replica that host h0 schedules: decode time per token of one stream
// (batch 1), and tokens/s of eight concurrent streams (batch 8). The
// placement changes between sub-benchmarks with troupe scale, while the
// processes run; micro-batching (--micro-batches) is off in one cluster
// and on, one micro-batch per stage, in another.
//
//	go test -run XXX -bench PipelineHosts -benchtime 3x ./cmd/troupe
//
// "h0" is one host running the whole model; "h0,h0,h0" three stages on
// one host; "h0,h1,h2" three stages on three hosts. A token of the last
// crosses between hosts three times (activations h0 to h1 and h1 to h2,
// logits h2 to h0): the added latency per hop is the difference between
// the last two, divided by three. With replicas=3 the three-host pipeline
// carries three replica groups whose shards share each host's weights:
// their steps interleave, so that every host works while the others do.
func BenchmarkPipelineHosts(b *testing.B) {
	bin := os.Getenv("TROUPE_BIN") // a prebuilt binary, or build one
	if bin == "" {
		bin = buildTroupe(b)
	}
	refs := demoRefs(b)
	lab := newNetnsLab(b, 3)
	// Each setting of --micro-batches on host h0 (1: off; 2; 0: one per
	// stage, here 3) gets processes of its own; a single stage is not cut.
	for _, micro := range []int{1, 2, 0} {
		b.Run(fmt.Sprintf("micro-batches=%d", micro), func(b *testing.B) {
			url := startPipelineHosts(b, lab, bin, "--micro-batches", fmt.Sprint(micro))
			for _, c := range []struct {
				placement string
				replicas  int
			}{{"h0", 1}, {"h0,h0,h0", 1}, {"h0,h1,h2", 1}, {"h0,h1,h2", 3}} {
				if micro != 1 && c.placement == "h0" {
					continue
				}
				b.Run(fmt.Sprintf("placement=%s/replicas=%d", c.placement, c.replicas), func(b *testing.B) {
					benchPlacement(b, url, refs, c.placement, c.replicas)
				})
			}
		})
	}
}

// startPipelineHosts starts three troupe processes on the three hosts of
// lab, which stop at the end of b; host h0 schedules one replica, with
// extra flags. It returns h0's URL once three hosts are live.
func startPipelineHosts(b *testing.B, lab *netnsLab, bin string, extra ...string) string {
	threads := os.Getenv("TROUPE_THREADS")
	if threads == "" {
		threads = "1"
	}
	for i := 2; i >= 0; i-- {
		args := lab.nodeArgs(i, "--threads", threads, "--kv-blocks", "512")
		if i == 0 {
			args = append(args, "--placement", "h0")
			args = append(args, extra...)
		} else {
			args = append(args, "--replicas", "0")
		}
		p := lab.start(bin, i, args...)
		b.Cleanup(func() { // before the lab's cleanup: the next processes take the ports
			p.cmd.Process.Signal(syscall.SIGTERM)
			<-p.done
		})
	}
	url := "http://" + lab.ip(0) + ":8080"
	waitReady(b, url)
	waitUntil(b, "three live hosts", 30*time.Second, func() bool {
		alive := 0
		for _, nd := range clusterOf(b, url).Nodes {
			if nd.Alive {
				alive++
			}
		}
		return alive == 3
	})
	return url
}

// benchPlacement moves h0's replica group to placement with troupe scale
// and measures b1 and b8 there.
func benchPlacement(b *testing.B, url string, refs []demoRef, placement string, replicas int) {
	prompt := refs[0].Prompt
	const gen = 128
	var out, errOut bytes.Buffer
	args := []string{"scale", "--server", url, "--placement", placement, "--replicas", fmt.Sprint(replicas)}
	if err := dispatch(context.Background(), args, &out, &errOut); err != nil {
		b.Fatalf("%v: %v", args, err)
	}
	// Warm up, then one stream alone: the decode time per token.
	if _, _, err := timedStream(url, prompt, gen); err != nil {
		b.Fatal(err)
	}
	var perToken []time.Duration
	for range 3 {
		_, d, err := timedStream(url, prompt, gen)
		if err != nil {
			b.Fatal(err)
		}
		perToken = append(perToken, d)
	}
	sort.Slice(perToken, func(i, j int) bool { return perToken[i] < perToken[j] })
	// Eight streams at once: one batch of eight per step.
	var tokens int
	var elapsed time.Duration
	for b.Loop() {
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		for s := 0; s < 8; s++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, _, err := timedStream(url, refs[s%len(refs)].Prompt, gen)
				if err != nil {
					b.Error(err)
				}
				mu.Lock()
				tokens += n
				mu.Unlock()
			}()
		}
		wg.Wait()
		elapsed += time.Since(start)
	}
	b.ReportMetric(float64(perToken[1].Microseconds())/1000, "b1_ms/token")
	b.ReportMetric(float64(tokens)/elapsed.Seconds(), "b8_tok/s")
}

// timedStream streams a greedy completion of gen tokens and returns the
// tokens streamed and the mean time between tokens after the first.
func timedStream(url, prompt string, gen int) (int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var first, last time.Time
	n := 0
	_, err := completion(ctx, url, prompt, gen, func(k int) {
		last = time.Now()
		if k == 1 {
			first = last
		}
		n = k
	})
	if err != nil {
		return n, 0, err
	}
	if n < 2 {
		return n, 0, fmt.Errorf("%d tokens streamed", n)
	}
	return n, last.Sub(first) / time.Duration(n-1), nil
}
