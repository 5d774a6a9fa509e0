package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/scheduler"
	"go.uber.org/goleak"
)

// netnsLab is a set of network namespaces, each one host, joined by veth
// pairs to a bridge in the root namespace, which also has an address so
// that the test can reach every host.
type netnsLab struct {
	t      testing.TB
	prefix string
	subnet string // e.g. 10.231.7
	hosts  []string
	dir    string // the hosts' store directories
}

func run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// labs counts the labs of this process.
var labs atomic.Int32

func newNetnsLab(t testing.TB, hosts int) *netnsLab {
	if testing.Short() {
		t.Skip("multi-host test: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("multi-host test needs root to create network namespaces")
	}
	if err := exec.Command("ip", "netns", "list").Run(); err != nil {
		t.Skipf("multi-host test needs `ip netns`: %v", err)
	}
	// Cleanups run last-first: this one runs after every process of the
	// lab is reaped, and finds no goroutine of the test left behind.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		goleak.VerifyNone(t, ignore)
	})
	// Names and the subnet are unique per process and per lab, so that
	// labs of repeated runs (-count) never meet a link still going away.
	pid, lab := os.Getpid(), int(labs.Add(1))
	l := &netnsLab{t: t, dir: t.TempDir(), prefix: fmt.Sprintf("tr%d%c", pid%100000, 'a'+lab%26), subnet: fmt.Sprintf("10.%d.%d", 200+pid%50, (pid/50+lab)%250)}
	br := l.prefix + "br"
	run(t, "ip", "link", "add", br, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", br).Run() })
	run(t, "ip", "addr", "add", l.subnet+".254/24", "dev", br)
	run(t, "ip", "link", "set", br, "up")
	for i := 0; i < hosts; i++ {
		ns := fmt.Sprintf("%sh%d", l.prefix, i)
		veth := fmt.Sprintf("%sv%d", l.prefix, i)
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "link", "add", veth, "type", "veth", "peer", "name", veth+"p")
		t.Cleanup(func() { exec.Command("ip", "link", "del", veth).Run() })
		run(t, "ip", "link", "set", veth+"p", "netns", ns)
		run(t, "ip", "link", "set", veth, "master", br)
		run(t, "ip", "link", "set", veth, "up")
		run(t, "ip", "netns", "exec", ns, "ip", "addr", "add", l.ip(i)+"/24", "dev", veth+"p")
		run(t, "ip", "netns", "exec", ns, "ip", "link", "set", veth+"p", "up")
		run(t, "ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
		l.hosts = append(l.hosts, ns)
	}
	return l
}

func (l *netnsLab) ip(i int) string { return fmt.Sprintf("%s.%d", l.subnet, i+1) }

// The bus credentials of a lab's nodes.
const labUser, labPassword = "troupe", "s3cret-cluster-password"

// nodeArgs are the serve flags of node hi on host i, joined to every
// other host, then extra.
func (l *netnsLab) nodeArgs(i int, extra ...string) []string {
	var join []string
	for j := range l.hosts {
		if j != i {
			join = append(join, "nats-route://"+l.ip(j)+":6222")
		}
	}
	args := []string{"--node", fmt.Sprintf("h%d", i), "--listen", l.ip(i) + ":8080",
		"--route-listen", l.ip(i) + ":6222", "--bus-listen", l.ip(i) + ":4222", "--join", strings.Join(join, ","),
		"--bus-user", labUser, "--bus-password", labPassword, "--store-dir", filepath.Join(l.dir, fmt.Sprint(i)),
		"--threads", "1", "--max-seqs", "8", "--kv-blocks", "256", "--step-timeout", "3s"}
	return append(args, extra...)
}

// keptAcrossHosts answers a Responses request on the gateway at a, then
// continues it and fetches it on the one at b.
func keptAcrossHosts(t *testing.T, ctx context.Context, a, b string) {
	t.Helper()
	client := func(url string) openai.Client {
		return openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	}
	ca, cb := client(a), client(b)
	first, err := ca.Responses.New(ctx, responses.ResponseNewParams{Model: demo.Name, MaxOutputTokens: openai.Int(8), Temperature: openai.Float(0),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("How do I list files?")}})
	if err != nil {
		t.Fatal(err)
	}
	next, err := cb.Responses.New(ctx, responses.ResponseNewParams{Model: demo.Name, MaxOutputTokens: openai.Int(8), Temperature: openai.Float(0),
		PreviousResponseID: openai.String(first.ID), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("And hidden ones?")}})
	if err != nil {
		t.Fatalf("continued on another host: %v", err)
	}
	if next.PreviousResponseID != first.ID || next.Usage.InputTokens <= first.Usage.InputTokens {
		t.Errorf("continued on another host: previous %q (want %q), %d input tokens after %d", next.PreviousResponseID, first.ID,
			next.Usage.InputTokens, first.Usage.InputTokens)
	}
	got, err := cb.Responses.Get(ctx, first.ID, responses.ResponseGetParams{})
	if err != nil || got.OutputText() != first.OutputText() {
		t.Errorf("fetched on another host: %v, %q want %q", err, got.OutputText(), first.OutputText())
	}
}

// syncBuffer is a log that may be written while it is read.
type syncBuffer struct {
	mu  sync.Mutex
	out strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.out.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.out.String()
}

// proc is a troupe process in a namespace; it writes its output to its
// buffer.
type proc struct {
	syncBuffer
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) log() string { return p.String() }

func (l *netnsLab) start(bin string, host int, args ...string) *proc {
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", l.hosts[host], bin, "serve"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	l.t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		if l.t.Failed() {
			l.t.Logf("log of host %d:\n%s", host, p.log())
		}
	})
	return p
}

func buildTroupe(t testing.TB) string {
	bin := filepath.Join(t.TempDir(), "troupe")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// completion streams a greedy completion of prompt from url and returns
// its text; onChunk runs after each streamed chunk.
func completion(ctx context.Context, url, prompt string, maxTokens int, onChunk func(n int)) (string, error) {
	body, _ := json.Marshal(map[string]any{"model": demo.Name, "prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "stream": true, "ignore_eos": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("%s: %s", resp.Status, b)
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	n := 0
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct{ Text string }
			Error   *struct{ Message string }
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			return text.String(), err
		}
		if ch.Error != nil {
			return text.String(), fmt.Errorf("stream error: %s", ch.Error.Message)
		}
		for _, c := range ch.Choices {
			text.WriteString(c.Text)
		}
		n++
		if onChunk != nil {
			onChunk(n)
		}
	}
	return text.String(), sc.Err()
}

func clusterOf(t testing.TB, url string) ClusterStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, _, err := fetchCluster(ctx, url, "")
	if err != nil {
		t.Logf("cluster view: %v", err)
	}
	return st
}

// waitReady waits until the server at url answers /ready.
func waitReady(t testing.TB, url string) {
	t.Helper()
	waitUntil(t, url+" ready", 90*time.Second, func() bool {
		resp, err := http.Get(url + "/ready")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
}

func waitUntil(t testing.TB, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// TestClusterNetns runs three troupe processes on three hosts (network
// namespaces). Host 0 schedules one replica group with two placements: a
// pipeline whose three stages span the three hosts, and a whole copy on
// host 0. It checks the pipeline against the reference, SIGKILLs host 1
// mid-stream, checks the request completes with the fault-free tokens, the
// cluster reports the dead node, the restarted node gets work again, the
// stages change while serving, and nothing joins or subscribes
// without the credentials.
func TestClusterNetns(t *testing.T) {
	lab := newNetnsLab(t, 3)
	bin := buildTroupe(t)
	const user, pass = labUser, labPassword
	nodeArgs := lab.nodeArgs
	procs := make([]*proc, 3)
	for _, i := range []int{1, 2} {
		procs[i] = lab.start(bin, i, nodeArgs(i, "--replicas", "0")...)
	}
	// Host 0 cuts steps of several sequences into one micro-batch per
	// stage: the concurrent streams of step 5 run through the hosts as a
	// wavefront.
	procs[0] = lab.start(bin, 0, nodeArgs(0, "--placement", "h0,h1,h2;h0", "--micro-batches", "0")...)
	url := "http://" + lab.ip(0) + ":8080"
	began := time.Now()
	waitReady(t, url)
	t.Logf("cluster of 3 up in %v", time.Since(began).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// 1. The pipeline across three hosts gives the reference tokens.
	for _, ref := range demoRefs(t)[:2] {
		got, err := completion(ctx, url, ref.Prompt, len(ref.GreedyIDs), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got != ref.Text {
			t.Errorf("prompt %q over three hosts: got %q, want %q", ref.Prompt, got, ref.Text)
		}
	}
	// A Responses answer of host 0's gateway is continued and fetched
	// through host 2's: kept responses are the cluster's.
	keptAcrossHosts(t, ctx, url, "http://"+lab.ip(2)+":8080")
	// Every node beats and has its stage in the registry.
	var st ClusterStatus
	waitUntil(t, "every node alive with its stage registered", 10*time.Second, func() bool {
		st = clusterOf(t, url)
		alive, stages := map[string]bool{}, map[string]bool{}
		for _, nd := range st.Nodes {
			alive[nd.Name] = nd.Alive
		}
		for _, a := range st.Actors {
			stages[a.Node] = stages[a.Node] || (a.Kind == scheduler.ShardKind && a.Alive && strings.HasPrefix(a.ID, "h0-r0-p0-"))
		}
		return alive["h0"] && alive["h1"] && alive["h2"] && stages["h0"] && stages["h1"] && stages["h2"] &&
			len(st.Placements) == 2 && st.Placements[0].Up
	})
	// A node that starts before its placement's other nodes beat starts it
	// down, and moves back to it at the first step after it is restored.
	if !st.Placements[0].Active {
		if _, err := completion(ctx, url, demoRefs(t)[0].Prompt, 4, nil); err != nil {
			t.Fatal(err)
		}
		st = clusterOf(t, url)
	}
	if len(st.Placements) != 2 || !st.Placements[0].Active || st.Placements[0].Nodes != "h0,h1,h2" {
		t.Fatalf("placements %+v: want h0,h1,h2 active", st.Placements)
	}

	// 2. A fault-free run, then the same request with host 1 killed mid-stream.
	prompt := demoRefs(t)[0].Prompt
	const long = 160
	want, err := completion(ctx, url, prompt, long, nil)
	if err != nil {
		t.Fatal(err)
	}
	var killed time.Time
	got, err := completion(ctx, url, prompt, long, func(n int) {
		if n == 10 {
			procs[1].cmd.Process.Signal(syscall.SIGKILL)
			killed = time.Now()
		}
	})
	if err != nil {
		t.Fatalf("request across the kill: %v", err)
	}
	if killed.IsZero() {
		t.Fatal("the stream ended before the kill")
	}
	if got != want {
		t.Errorf("request across the kill:\ngot  %q\nwant %q", got, want)
	}
	<-procs[1].done

	// 3. The cluster reports the dead node.
	noticed := time.Since(killed).Round(100 * time.Millisecond)
	var seen ClusterStatus
	defer func() {
		if t.Failed() {
			t.Logf("last cluster view: %+v", seen)
		}
	}()
	waitUntil(t, "node h1 reported dead", 15*time.Second, func() bool {
		seen = clusterOf(t, url)
		for _, nd := range seen.Nodes {
			if nd.Name == "h1" {
				return !nd.Alive
			}
		}
		return false
	})
	t.Logf("request finished %v after the kill; dead node reported %v after the kill", noticed, time.Since(killed).Round(100*time.Millisecond))
	st = clusterOf(t, url)
	if st.Placements[0].Up || !st.Placements[1].Active {
		t.Errorf("placements after the kill %+v: want h0,h1,h2 down and h0 active", st.Placements)
	}

	// 4. The restarted node rejoins and the pipeline through it serves again.
	procs[1] = lab.start(bin, 1, nodeArgs(1, "--replicas", "0")...)
	waitUntil(t, "placement h0,h1,h2 back", 60*time.Second, func() bool {
		st := clusterOf(t, url)
		return len(st.Placements) == 2 && st.Placements[0].Up
	})
	got, err = completion(ctx, url, prompt, long, nil)
	if err != nil || got != want {
		t.Errorf("after the restart: got %q, %v; want %q", got, err, want)
	}
	st = clusterOf(t, url)
	if !st.Placements[0].Active {
		t.Errorf("placements after the restart %+v: want h0,h1,h2 active", st.Placements)
	}
	if !strings.Contains(procs[1].log(), "shard h0-r0-p0-s1 runs layers") {
		t.Errorf("restarted node started no shard:\n%s", procs[1].log())
	}

	// 5. The stages change while clients stream: the preferred placement
	// shrinks to one stage on h0, then grows to three stages spread over
	// the live hosts, started there through their spawners. Every text is
	// the reference; the old stages stop on every host.
	l := startLoad(t, url, 4)
	for _, step := range []struct {
		args []string
		want string
	}{
		{[]string{"--stages", "1"}, "1 replicas of 1 stages, placements h0;h0"},
		{[]string{"--stages", "3"}, "1 replicas of 3 stages, placements h0,h1,h2;h0"},
		// A second replica group on the same hosts, sharing their weights.
		{[]string{"--replicas", "2"}, "2 replicas of 3 stages, placements h0,h1,h2;h0"},
	} {
		l.waitStarted(4)
		if got := scaleCLI(t, url, step.args...); got != step.want {
			t.Fatalf("scale %v: got %q, want %q", step.args, got, step.want)
		}
	}
	l.waitStarted(4)
	t.Logf("%d requests completed across three changes", l.stop())
	st = clusterOf(t, url)
	if len(st.Placements) != 4 || st.Placements[0].Replica != "h0-r2" || st.Placements[0].Nodes != "h0,h1,h2" || !st.Placements[0].Active {
		t.Errorf("placements after scaling %+v: want h0-r2 and h0-r3 on h0,h1,h2 active", st.Placements)
	}
	waitUntil(t, "only the new stages in the registry", 30*time.Second, func() bool {
		var got []string
		for _, a := range clusterOf(t, url).Actors {
			if a.Kind == scheduler.ShardKind {
				got = append(got, a.ID+"@"+a.Node)
			}
		}
		return strings.Join(got, " ") == "h0-r2-p0-s0@h0 h0-r2-p1-s0@h0 h0-r3-p0-s0@h0 h0-r3-p1-s0@h0 h0-r2-p0-s1@h1 h0-r3-p0-s1@h1 h0-r2-p0-s2@h2 h0-r3-p0-s2@h2"
	})
	waitUntil(t, "host 1 freeing the old stage", 30*time.Second, func() bool {
		return strings.Contains(procs[1].log(), "shard h0-r0-p0-s1 stopped, memory freed")
	})

	// 6. Without credentials: no client connection, no route.
	for _, opts := range [][]nats.Option{nil, {nats.UserInfo(user, "wrong")}} {
		nc, err := nats.Connect("nats://"+lab.ip(0)+":4222", append(opts, nats.Timeout(3*time.Second), nats.MaxReconnects(0))...)
		if err == nil {
			nc.Close()
			t.Error("a client without the credentials connected to the bus")
		}
	}
	rogue := bus.DefaultConfig()
	rogue.Name, rogue.Listen = "rogue", "127.0.0.1:0"
	rogue.JetStream.Enabled = false
	rogue.Cluster = bus.Cluster{Name: "troupe", Listen: "127.0.0.1:0", Routes: []string{"nats-route://" + lab.ip(0) + ":6222"}}
	rn, err := bus.Start(ctx, rogue)
	if err != nil {
		t.Fatal(err)
	}
	defer rn.Shutdown(context.Background())
	rc, err := rn.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	sub, err := rc.SubscribeSync("troupe.>")
	if err != nil {
		t.Fatal(err)
	}
	// Heartbeats flow every second on the cluster; none may reach the rogue.
	if msg, err := sub.NextMsg(3 * time.Second); err == nil {
		t.Errorf("a node without credentials received %s", msg.Subject)
	}
	if rn.NumRoutes() != 0 {
		t.Errorf("a node without credentials has %d routes", rn.NumRoutes())
	}
}

// TestClusterNetnsTensorParallel runs a replica group over two hosts in
// network namespaces, each stage as two tensor-parallel ranks on its
// host (--tp 2): host 0 schedules and runs the first stage, host 1 only
// hosts the second (--replicas 0). The second stage's ranks read their
// input from host 0 over the data plane, and host 0 the logits from host
// 1's rank 0; concurrent requests, cut into micro-batches, get the
// reference text, and the registry shows each stage's ranks on its host.
func TestClusterNetnsTensorParallel(t *testing.T) {
	lab := newNetnsLab(t, 2)
	bin := buildTroupe(t)
	procs := []*proc{nil, lab.start(bin, 1, lab.nodeArgs(1, "--tp", "2", "--replicas", "0")...)}
	procs[0] = lab.start(bin, 0, lab.nodeArgs(0, "--tp", "2", "--placement", "h0,h1", "--micro-batches", "0")...)
	url := "http://" + lab.ip(0) + ":8080"
	waitReady(t, url)
	// Host 0 may start the placement before host 1 beats: it starts down,
	// and is up once host 1's stage runs.
	waitUntil(t, "the placement up", 30*time.Second, func() bool {
		st := clusterOf(t, url)
		return len(st.Placements) == 1 && st.Placements[0].Up
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	refs := demoRefs(t)
	var wg sync.WaitGroup
	for _, ref := range refs {
		wg.Go(func() {
			got, err := completion(ctx, url, ref.Prompt, len(ref.GreedyIDs), nil)
			if err != nil {
				t.Errorf("prompt %q: %v", ref.Prompt, err)
			} else if got != ref.Text {
				t.Errorf("prompt %q over two hosts of two ranks: got %q, want %q", ref.Prompt, got, ref.Text)
			}
		})
	}
	wg.Wait()
	waitUntil(t, "each stage's ranks registered on its host", 10*time.Second, func() bool {
		ranks := map[string]int{}
		for _, a := range clusterOf(t, url).Actors {
			if a.Kind == scheduler.ShardKind && a.Alive && strings.HasPrefix(a.ID, "h0-r0-p0-s") && strings.Contains(a.ID, "-t") {
				ranks[a.Node]++
			}
		}
		return ranks["h0"] == 2 && ranks["h1"] == 2
	})
	for i, p := range procs {
		if want := "as rank 1 of 2"; !strings.Contains(p.log(), want) {
			t.Errorf("host %d's log does not say %q", i, want)
		}
	}
}
