package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/scheduler"
)

func TestCheckExposure(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{nil, ""},
		{[]string{"--bus-listen", "127.0.0.1:4222"}, ""},
		{[]string{"--route-listen", "10.0.0.1:6222"}, "--route-listen 10.0.0.1:6222 is reachable"},
		{[]string{"--bus-listen", "0.0.0.0:4222"}, "--bus-listen 0.0.0.0:4222 is reachable"},
		{[]string{"--data-listen", "10.0.0.1:0"}, "--data-listen"},
		{[]string{"--route-listen", "10.0.0.1:6222", "--insecure"}, ""},
		{[]string{"--route-listen", "10.0.0.1:6222", "--bus-user", "u", "--bus-password", "p"}, ""},
		{[]string{"--placement", "a,,b"}, "placement 0"},
		{[]string{"--placement", "a,b;c", "--step-timeout", "0s"}, "--step-timeout"},
		{[]string{"--tp", "2"}, ""},
		{[]string{"--tp", "0"}, "--tp 0"},
		{[]string{"--tp", "9"}, "at most 8"},
		{[]string{"--tp", "2", "--shards", "2"}, ""},
		{[]string{"--tp", "2", "--shards", "2", "--micro-batches", "0"}, ""},
		{[]string{"--tp", "2", "--shards", "3", "--replicas", "2", "--device", "cuda"}, "--tp 2 × --shards 3 × --replicas 2: at most 8 GPUs"},
		{[]string{"--tp", "8", "--shards", "8", "--replicas", "2"}, "--tp 8 × --shards 8 × --replicas 2: at most 64 CPU devices"},
		{[]string{"--tp", "2", "--placement", "a"}, ""},
		{[]string{"--tp", "2", "--replicas", "2"}, ""},
		{[]string{"--tp", "2", "--replicas", "0"}, ""},
		{[]string{"--tp", "4", "--replicas", "3", "--device", "cuda"}, "at most 8 GPUs"},
		{[]string{"--tp", "2", "--device", "ref"}, "--device cpu or cuda"},
	} {
		_, err := parseServe(tc.args, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: got %v, want an error containing %q", tc.args, err, tc.wantErr)
		}
	}
}

func TestParsePlacements(t *testing.T) {
	got, err := parsePlacements(" a, b ,c;a")
	if err != nil || len(got) != 2 || strings.Join(got[0], "|") != "a|b|c" || strings.Join(got[1], "|") != "a" {
		t.Fatalf("got %q, %v", got, err)
	}
	for _, bad := range []string{"", ";", "a;", "a b", "a.b", strings.Repeat("a;", 17) + "a"} {
		if _, err := parsePlacements(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzParsePlacements(f *testing.F) {
	f.Add("h0,h1,h2;h0")
	f.Add("a;;b")
	f.Fuzz(func(t *testing.T, spec string) {
		ps, err := parsePlacements(spec)
		if err != nil {
			return
		}
		for _, p := range ps {
			if len(p) == 0 {
				t.Fatalf("%q: empty placement accepted", spec)
			}
			for _, n := range p {
				if n == "" || strings.ContainsAny(n, ",; .*>") {
					t.Fatalf("%q: node %q accepted", spec, n)
				}
			}
		}
	})
}

// TestClusterCommand prints a cluster view served over HTTP: with the
// registry's actors, and without them when the registry could not be read.
func TestClusterCommand(t *testing.T) {
	seen := time.Now().Add(-5 * time.Second).UTC()
	views := map[string]ClusterStatus{
		"/whole/v1/cluster": {
			Node:       "h0",
			Nodes:      []ClusterNode{{Name: "h0", Alive: true, LastSeen: seen, Actors: 3}, {Name: "h1", LastSeen: seen}},
			Placements: []ClusterPlacement{{Replica: "h0-r0", Nodes: "h0,h1", Up: false}, {Replica: "h0-r0", Nodes: "h0", Up: true, Active: true}},
			Actors: []ClusterActor{{Kind: "shard", ID: "h0-r0-p1-s0", Node: "h0", Status: "running", Alive: true}, {Kind: "shard", ID: "h0-r0-p0-s1", Node: "h1", Status: "running"},
				{Kind: "group", ID: "g", Node: "h0", Status: "running", Alive: true, State: "1 replicas of 2 stages, placements h0,h1;h0"}},
		},
		"/degraded/v1/cluster": {
			Node:          "h0",
			Nodes:         []ClusterNode{{Name: "h0", Alive: true, LastSeen: seen}, {Name: "h1", LastSeen: seen}},
			RegistryError: "registry: list: context deadline exceeded",
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		st, ok := views[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(st)
	}))
	defer srv.Close()

	for _, tc := range []struct {
		path string
		want []string
	}{
		{"/whole", []string{
			"h0\talive\t", "h1\tdead\t",
			"h0-r0\th0,h1\tdown\n", "h0-r0\th0\tup, active\n",
			"h0\tshard\th0-r0-p1-s0\trunning\n", "h1\tshard\th0-r0-p0-s1\trunning (expired)\n",
			"h0\tgroup\tg\trunning: 1 replicas of 2 stages, placements h0,h1;h0\n",
		}},
		{"/degraded", []string{"h1\tdead\t", "actors unknown: registry: list: context deadline exceeded\n"}},
	} {
		out, _, err := runCLI(t, "", "cluster", "--server", srv.URL+tc.path, "--api-key", "k")
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.path, w, out)
			}
		}
		raw, _, err := runCLI(t, "", "cluster", "--server", srv.URL+tc.path, "--api-key", "k", "--json")
		var got ClusterStatus
		if err != nil || json.Unmarshal([]byte(raw), &got) != nil || got.RegistryError != views[tc.path+"/v1/cluster"].RegistryError || len(got.Nodes) != 2 {
			t.Errorf("%s --json: %v, %+v", tc.path, err, got)
		}
	}
	if _, _, err := runCLI(t, "", "cluster", "--server", srv.URL+"/whole"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("without the key: %v, want the server's 401", err)
	}
}

// TestReapOrphans: a stage whose replica has no scheduler anywhere (its
// scheduling node died for good) is stopped after --orphan-grace, and its
// memory freed; the stages of a live replica stay.
func TestReapOrphans(t *testing.T) {
	ctx := context.Background()
	cfg := testServeConfig()
	cfg.MaxBatchTokens, cfg.OrphanGrace = 256, minOrphanGrace
	var log syncBuffer
	n, tp := startTestNode(t, cfg, nil, &log)
	defer tp.Shutdown(ctx)
	defer n.Close()
	// What a spawn request from another node's scheduler starts.
	mc := n.bundle.Config
	args, err := bus.Encode(scheduler.ShardArgs{Model: n.bundle.Name, Replica: "gone-r0", Index: 1, First: 4, Last: mc.Layers, Blocks: 64, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.spawnShard(ctx, n.actors, "gone-r0-p0-s1", args); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	waitUntil(t, "the orphaned stage stopped", 3*minOrphanGrace, func() bool {
		_, ok := n.actors.Lookup(scheduler.ShardKind, "gone-r0-p0-s1")
		return !ok
	})
	if took := time.Since(began); took < minOrphanGrace {
		t.Errorf("the orphan was stopped after %v, before its grace of %v", took, minOrphanGrace)
	}
	waitUntil(t, "its memory freed", 10*time.Second, func() bool {
		return strings.Contains(log.String(), "shard gone-r0-p0-s1 stopped, memory freed")
	})
	if !strings.Contains(log.String(), "shard gone-r0-p0-s1: replica gone-r0 has had no scheduler for 10s: stopping it") {
		t.Errorf("log lacks the reason:\n%s", log.String())
	}
	if _, ok := n.actors.Lookup(scheduler.ShardKind, scheduler.ShardID("test-r0", 0)); !ok {
		t.Errorf("the live replica's stage was stopped too:\n%s", log.String())
	}
}

// TestClaimNames: a node refuses a name a live replica group has, and a
// group a name a live node has; other names pass, the nodes of one group
// share its name, and a node takes its own name over (a restart). Of a
// node and a group of one name that claim it at once, exactly one wins.
func TestClaimNames(t *testing.T) {
	ctx := context.Background()
	cfg := testServeConfig()
	n, tp := startTestNode(t, cfg, nil, nil)
	defer tp.Shutdown(ctx)
	defer n.Close()
	if err := n.registry.Put(ctx, actors.Entry{Kind: nameKind, ID: "g", Node: "test", Status: actors.StatusRunning, State: claimGroup}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		node, group, want string
	}{
		{"other", "", ""},
		{"other2", "g2", ""},
		{"other3", "g", ""},
		{"test", "", ""},
		{"g", "", "--node g: name taken: a replica group of that name runs (on node test): name the node otherwise"},
		{"other4", "test", "--group test: name taken: a node of that name runs: name the group otherwise"},
	} {
		_, err := claimNames(ctx, n.registry, c.node, c.group, io.Discard)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("node %q, group %q: %v, want %q", c.node, c.group, err, c.want)
		}
	}
	for i := range 20 {
		name := fmt.Sprintf("x%d", i)
		errs := make(chan error, 2)
		go func() { _, err := claimNames(ctx, n.registry, name, "", io.Discard); errs <- err }()
		go func() { _, err := claimNames(ctx, n.registry, "y"+name, name, io.Discard); errs <- err }()
		a, b := <-errs, <-errs
		if (a == nil) == (b == nil) {
			t.Errorf("node %s and group %s at once: %v and %v; want one error", name, name, a, b)
		}
	}
}
