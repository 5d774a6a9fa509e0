package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/scheduler"
)

// scaleCLI runs troupe scale against url and returns what it prints.
func scaleCLI(t *testing.T, url string, args ...string) string {
	t.Helper()
	out, _, err := runCLI(t, "", append([]string{"scale", "--server", url}, args...)...)
	if err != nil {
		t.Fatalf("scale %v: %v", args, err)
	}
	return strings.TrimSpace(out)
}

// TestScaleWhileServing adds a replica and removes it again while requests
// stream; every request completes with all its tokens.
func TestScaleWhileServing(t *testing.T) { bothSubmitPaths(t, testScaleWhileServing) }

func testScaleWhileServing(t *testing.T, overBus bool) {
	s := startServe(t, func(c *serveConfig) { c.submitOverBus = overBus })
	if got := scaleCLI(t, s.url); got != "1 replicas of 1 stages" {
		t.Fatalf("at start: %q", got)
	}
	if got := scaleCLI(t, s.url, "--replicas", "2"); got != "2 replicas of 1 stages" {
		t.Fatalf("after growing: %q", got)
	}
	c := s.client()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	const tokens = 48
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
				Model:       openai.CompletionNewParamsModel(demo.Name),
				Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("The kernel")},
				MaxTokens:   openai.Int(tokens),
				Temperature: openai.Float(0),
			})
			if err != nil {
				errs <- err
				return
			}
			if resp.Choices[0].Text != demoRefs(t)[0].Text {
				errs <- fmt.Errorf("request %d: text %q", i, resp.Choices[0].Text)
			}
		}()
	}
	// Shrink while the requests run: the replica that goes finishes its own.
	if got := scaleCLI(t, s.url, "--replicas", "1"); got != "1 replicas of 1 stages" {
		t.Errorf("after shrinking: %q", got)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, _, err := runCLI(t, "", "scale", "--server", s.url, "--replicas", "-1"); err == nil {
		t.Error("scaling to -1 replicas: no error")
	}
}

// streamLoad keeps clients streaming the demo prompts from url, each checked
// against its reference text, until stop is called; stop returns how many
// requests completed.
type streamLoad struct {
	t       *testing.T
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	done    atomic.Int64
	started chan struct{} // one value per request that streamed a token
}

func startLoad(t *testing.T, url string, clients int) *streamLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &streamLoad{t: t, cancel: cancel, started: make(chan struct{}, 1<<16)}
	refs := demoRefs(t)
	for i := 0; i < clients; i++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for k := i; ctx.Err() == nil; k += clients {
				ref := refs[k%len(refs)]
				// A request runs to its end even after stop: a request
				// lost or changed in the switch must show.
				rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
				got, err := completion(rctx, url, ref.Prompt, len(ref.GreedyIDs), func(n int) {
					if n == 1 {
						l.started <- struct{}{}
					}
				})
				rcancel()
				if err != nil {
					t.Errorf("client %d, request %d: %v", i, k, err)
					return
				}
				if got != ref.Text {
					t.Errorf("client %d, prompt %q: got %q, want %q", i, ref.Prompt, got, ref.Text)
				}
				l.done.Add(1)
			}
		}()
	}
	return l
}

// waitStarted waits until n more requests have streamed a token.
func (l *streamLoad) waitStarted(n int) {
	for ; n > 0; n-- {
		select {
		case <-l.started:
		case <-time.After(time.Minute):
			l.t.Fatalf("load: requests do not start")
		}
	}
}

func (l *streamLoad) stop() int64 {
	l.cancel()
	l.wg.Wait()
	return l.done.Load()
}

// shardIDs lists the layer-shards in the cluster's registry.
func shardIDs(t *testing.T, url string) []string {
	var ids []string
	for _, a := range clusterOf(t, url).Actors {
		if a.Kind == scheduler.ShardKind {
			ids = append(ids, a.ID)
		}
	}
	return ids
}

// TestScaleStagesWhileServing changes the number of pipeline stages, and
// of replicas with it, while clients stream without pause: every text
// equals the reference, and the old stages are gone after each change.
func TestScaleStagesWhileServing(t *testing.T) {
	// The KV caches sized by the host's free memory: 8 full contexts
	// where they fit, for the start's replica and every replica added.
	s := startServe(t, func(c *serveConfig) { c.MaxSeqs, c.KVBlocks = 8, 0 })
	l := startLoad(t, s.url, 6)
	steps := []struct {
		args   []string
		want   string
		shards string
	}{
		{[]string{"--stages", "3"}, "1 replicas of 3 stages", "test-r1-s0,test-r1-s1,test-r1-s2"},
		{[]string{"--stages", "2", "--replicas", "2"}, "2 replicas of 2 stages", "test-r2-s0,test-r2-s1,test-r3-s0,test-r3-s1"},
		{[]string{"--stages", "1", "--replicas", "1"}, "1 replicas of 1 stages", "test-r4-s0"},
	}
	for _, st := range steps {
		// Requests are under way when the change starts.
		l.waitStarted(6)
		if got := scaleCLI(t, s.url, st.args...); got != st.want {
			t.Fatalf("scale %v: got %q, want %q", st.args, got, st.want)
		}
		waitUntil(t, "the old shards gone from the registry", 30*time.Second, func() bool {
			return strings.Join(shardIDs(t, s.url), ",") == st.shards
		})
	}
	l.waitStarted(6)
	n := l.stop()
	t.Logf("%d requests completed across %d changes of shape", n, len(steps))
	for _, bad := range [][]string{
		{"--stages", "99"},
		{"--stages", "-1"},
		{"--placement", "a,b"},
	} {
		out, _, err := runCLI(t, "", append([]string{"scale", "--server", s.url}, bad...)...)
		if err == nil || !strings.Contains(err.Error(), "now 1 replicas of 1 stages") {
			t.Errorf("scale %v: got %q, %v; want an error and the shape unchanged", bad, out, err)
		}
	}
}

// TestScaleGroupKey: a group's leader writes the group's key with the shape
// a scale asks for before its first replica changes, so that a standby
// taking the group over after a crash midway starts it as asked; and the
// scale answers once the key says what then serves. The scale to two stages
// waits while the old replica drains a long request: the key says two
// stages all that while.
func TestScaleGroupKey(t *testing.T) {
	s := startServe(t, func(c *serveConfig) { c.Placement = "test"; c.Group = "g" })
	key := func() string {
		for _, a := range clusterOf(t, s.url).Actors {
			if a.Kind == groupKind && a.ID == "g" && a.Alive {
				return a.State
			}
		}
		return ""
	}
	const before, after = "1 replicas of 1 stages, placements test", "1 replicas of 2 stages, placements test,test"
	waitUntil(t, "the group's key", 30*time.Second, func() bool { return key() == before })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	streaming := make(chan struct{})
	long := make(chan error, 1)
	var once sync.Once
	go func() {
		_, err := completion(ctx, s.url, demoRefs(t)[0].Prompt, 900, func(int) { once.Do(func() { close(streaming) }) })
		long <- err
	}()
	select {
	case <-streaming:
	case err := <-long:
		t.Fatalf("the long request: %v", err)
	}
	scaled := make(chan string, 1)
	go func() {
		out, _, err := runCLI(t, "", "scale", "--server", s.url, "--stages", "2")
		if err != nil {
			out = err.Error()
		}
		scaled <- strings.TrimSpace(out)
	}()
	seen := false
	for !seen {
		select {
		case out := <-scaled:
			t.Fatalf("the scale answered %q before the key said %q", out, after)
		case <-time.After(50 * time.Millisecond):
		}
		switch st := key(); st {
		case after:
			seen = true
		case before, "": // not yet, or the view could not read the registry
		default:
			t.Fatalf("the key during the scale: %q, want %q or %q", st, before, after)
		}
	}
	select {
	case err := <-long:
		t.Fatalf("the long request ended before the key was seen (%v): the scale did not wait on it", err)
	default:
	}
	if out := <-scaled; out != after {
		t.Fatalf("scale --stages 2: %q", out)
	}
	if st := key(); st != after {
		t.Errorf("the key once the scale answered: %q, want %q", st, after)
	}
	if err := <-long; err != nil {
		t.Errorf("the long request across the scale: %v", err)
	}
}
