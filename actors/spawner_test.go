package actors

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/troupe/troupe/bus"
)

func testRegistry(t testing.TB, n *bus.Node, ttl time.Duration) *Registry {
	t.Helper()
	reg, _ := testRegistryConn(t, n, ttl)
	return reg
}

// testRegistryConn opens the registry on a connection of its own, which it
// also returns.
func testRegistryConn(t testing.TB, n *bus.Node, ttl time.Duration) (*Registry, *nats.Conn) {
	t.Helper()
	nc, err := n.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultRegistryConfig()
	cfg.TTL = ttl
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reg, err := OpenRegistry(ctx, js, cfg)
	if err != nil {
		t.Fatalf("OpenRegistry: %v", err)
	}
	return reg, nc
}

func echoFactory(ctx context.Context, sys *System, id string, args []byte) (Process, error) {
	return Spawn(ctx, sys, echoProps(id))
}

func startSpawner(t testing.TB, sys *System, reg *Registry) *Spawner {
	t.Helper()
	cfg := DefaultSpawnerConfig()
	cfg.Kinds["echo"] = echoFactory
	cfg.Heartbeat = 100 * time.Millisecond
	sp, err := StartSpawner(context.Background(), sys, reg, cfg)
	if err != nil {
		t.Fatalf("StartSpawner: %v", err)
	}
	t.Cleanup(func() {
		if err := sp.Close(context.Background()); err != nil {
			t.Errorf("Spawner.Close: %v", err)
		}
	})
	return sp
}

// TestRemoteSpawn starts an actor on node n2 through n2's spawner, asked
// from node n1; both nodes share one server, each with its own connection.
func TestRemoteSpawn(t *testing.T) {
	node, nc1 := testBus(t, "server")
	nc2, err := node.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc2.Close)
	reg := testRegistry(t, node, 5*time.Second)
	sys1 := testSystem(t, "n1", nc1)
	sys2 := testSystem(t, "n2", nc2)
	startSpawner(t, sys1, reg)
	sp2 := startSpawner(t, sys2, reg)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	subj := sys1.Subjects()
	rep, err := SpawnOn(ctx, nc1, subj, "n2", SpawnRequest{Kind: "echo", ID: "e9"})
	if err != nil {
		t.Fatalf("SpawnOn: %v", err)
	}
	want := Address{Kind: "echo", ID: "e9", Node: "n2"}
	if rep.Actor != want || rep.Subject != subj.Actor("echo", "e9") {
		t.Errorf("SpawnOn = %+v, want %v at %s", rep, want, subj.Actor("echo", "e9"))
	}
	if _, ok := sys2.Lookup("echo", "e9"); !ok {
		t.Error("actor not running on n2")
	}
	if _, ok := sys1.Lookup("echo", "e9"); ok {
		t.Error("actor running on n1, want n2 only")
	}
	resp, err := bus.Request[echoReq, echoResp](ctx, nc1, rep.Subject+".echo", echoReq{Text: "remote"})
	if err != nil || resp.Text != "remote" {
		t.Errorf("call from n1 = %+v, %v", resp, err)
	}
	rec, err := reg.Get(ctx, "echo", "e9")
	if err != nil {
		t.Fatalf("registry Get: %v", err)
	}
	if rec.Node != "n2" || !rec.Alive || rec.Status != StatusRunning || rec.Subject != rep.Subject {
		t.Errorf("registry record = %+v, want alive and running on n2", rec)
	}

	_, err = SpawnOn(ctx, nc1, subj, "n2", SpawnRequest{Kind: "echo", ID: "e9"})
	if bus.CodeOf(err) != bus.CodeConflict {
		t.Errorf("spawning e9 twice = %v, want conflict", err)
	}
	_, err = SpawnOn(ctx, nc1, subj, "n2", SpawnRequest{Kind: "gpu", ID: "g0"})
	if bus.CodeOf(err) != bus.CodeNotFound {
		t.Errorf("spawning an unknown kind = %v, want not_found", err)
	}
	_, err = SpawnOn(ctx, nc1, subj, "n3", SpawnRequest{Kind: "echo", ID: "x"})
	if bus.CodeOf(err) != bus.CodeUnavailable {
		t.Errorf("spawning on a node with no spawner = %v, want unavailable", err)
	}

	if err := StopOn(ctx, nc1, subj, "n2", "echo", "e9"); err != nil {
		t.Fatalf("StopOn: %v", err)
	}
	if _, ok := sys2.Lookup("echo", "e9"); ok {
		t.Error("actor still running after StopOn")
	}
	waitFor(t, "registry entry deleted", func() bool {
		_, err := reg.Get(ctx, "echo", "e9")
		return errors.Is(err, ErrNotRegistered)
	})
	if err := StopOn(ctx, nc1, subj, "n2", "echo", "e9"); bus.CodeOf(err) != bus.CodeNotFound {
		t.Errorf("stopping a stopped actor = %v, want not_found", err)
	}
	if sp2.Failures() != 0 {
		t.Errorf("spawner failures = %d, want 0", sp2.Failures())
	}
}

func TestRegistryHeartbeatExpiry(t *testing.T) {
	node, _ := testBus(t, "server")
	reg := testRegistry(t, node, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var mu sync.Mutex
	var changes []Change
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- reg.Watch(watchCtx, func(c Change) error {
			mu.Lock()
			defer mu.Unlock()
			changes = append(changes, c)
			return nil
		})
	}()
	defer func() {
		stopWatch()
		if err := <-watchDone; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch = %v, want context.Canceled", err)
		}
	}()

	e := Entry{Kind: "shard", ID: "r0.s1", Node: "n1", Subject: "x", Started: time.Now(), Status: StatusRunning}
	if err := reg.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	recs, err := reg.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].ID != "r0.s1" || !recs[0].Alive {
		t.Fatalf("List = %+v, want one live r0.s1", recs)
	}
	// No more heartbeats: the entry must be reported dead within the TTL
	// plus the server's expiry latency.
	waitFor(t, "expiry reported by Watch", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range changes {
			if c.Kind == "shard" && c.ID == "r0.s1" && c.Gone && c.Expired {
				return true
			}
		}
		return false
	})
	if _, err := reg.Get(ctx, "shard", "r0.s1"); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("Get after expiry = %v, want ErrNotRegistered", err)
	}
	mu.Lock()
	first := changes[0]
	mu.Unlock()
	if first.Gone || first.Record.Node != "n1" || !first.Record.Alive {
		t.Errorf("first change = %+v, want the live put", first)
	}
}

func TestRegistryConfigValidate(t *testing.T) {
	if err := DefaultRegistryConfig().Validate(); err != nil {
		t.Fatalf("default: %v", err)
	}
	for _, edit := range []func(*RegistryConfig){
		func(c *RegistryConfig) { c.Bucket = "a.b" },
		func(c *RegistryConfig) { c.TTL = time.Millisecond },
		func(c *RegistryConfig) { c.Replicas = 0 },
		func(c *RegistryConfig) { c.Storage = 9 },
	} {
		c := DefaultRegistryConfig()
		edit(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
}

// TestHeartbeatWithStalledRegistry: a registry that never answers (here,
// a subscriber that takes its writes and does not ack them, as a cluster
// without a leader would) delays the node's registry refreshes, not its
// heartbeats.
func TestHeartbeatWithStalledRegistry(t *testing.T) {
	node, nc := testBus(t, "server")
	reg := testRegistry(t, node, 5*time.Second)
	sys := testSystem(t, "n1", nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range []string{"e1", "e2", "e3"} {
		if _, err := Spawn(ctx, sys, echoProps(id)); err != nil {
			t.Fatal(err)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	bucket := DefaultRegistryConfig().Bucket
	if err := js.DeleteKeyValue(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	sink, err := nc.Subscribe("$KV."+bucket+".>", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Unsubscribe()

	var mu sync.Mutex
	var beats []time.Time
	sub, err := bus.Subscribe(ctx, nc, sys.Subjects().Heartbeat("n1"), func(_ context.Context, hb Heartbeat) {
		mu.Lock()
		beats = append(beats, time.Now())
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	sp := startSpawner(t, sys, reg)
	// Were the heartbeats held back by the refreshes, each of the four
	// entries' writes would wait out the client's timeout (5 s) first.
	waitFor(t, "three heartbeats", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(beats) >= 3
	})
	if sp.Failures() == 0 {
		t.Error("no failed refresh counted with the registry stalled")
	}
}
