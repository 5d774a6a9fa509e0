package bus

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// startNode starts a node and shuts it down when the test ends.
func startNode(t testing.TB, cfg Config) *Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return n
}

func connect(t testing.TB, n *Node) *nats.Conn {
	t.Helper()
	nc, err := n.Conn(context.Background())
	if err != nil {
		t.Fatalf("Conn: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func TestDefaultNodeHasNoListener(t *testing.T) {
	n := startNode(t, DefaultConfig())
	if got := n.ClientURL(); got != "" {
		t.Errorf("ClientURL() = %q, want empty", got)
	}
	if got := n.RouteURL(); got != "" {
		t.Errorf("RouteURL() = %q, want empty", got)
	}
	nc := connect(t, n)
	sub, err := nc.SubscribeSync("x")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("x", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("NextMsg: %v", err)
	}
	if string(m.Data) != "hi" {
		t.Errorf("got %q, want %q", m.Data, "hi")
	}
	if got := nc.MaxPayload(); got != DefaultMaxPayload {
		t.Errorf("MaxPayload() = %d, want %d", got, DefaultMaxPayload)
	}
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(); err != nil {
		t.Errorf("JetStream AccountInfo: %v", err)
	}
}

func TestClientListenerRequiresCredentials(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.ClientAuth = Auth{User: "troupe", Password: "s3cret"}
	cfg.JetStream.Enabled = false
	n := startNode(t, cfg)
	url := n.ClientURL()
	if !strings.HasPrefix(url, "nats://127.0.0.1:") {
		t.Fatalf("ClientURL() = %q, want nats://127.0.0.1:port", url)
	}
	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("connect without credentials succeeded, want an authorization error")
	}
	nc, err := nats.Connect(url, nats.UserInfo("troupe", "s3cret"))
	if err != nil {
		t.Fatalf("connect with credentials: %v", err)
	}
	nc.Close()
	// The in-process connection carries the credentials itself.
	connect(t, n).Close()
}

func TestClusterPassesMessages(t *testing.T) {
	mk := func(name string, routes ...string) *Node {
		cfg := DefaultConfig()
		cfg.Name = name
		cfg.Listen = "127.0.0.1:0"
		cfg.ClientAuth = Auth{Token: "client-token"}
		cfg.JetStream.Enabled = false
		cfg.Cluster = Cluster{
			Name:   "c1",
			Listen: "127.0.0.1:0",
			Routes: routes,
			Auth:   Auth{User: "route", Password: "pw"},
		}
		return startNode(t, cfg)
	}
	a := mk("a")
	b := mk("b", a.RouteURL())
	c := mk("c", a.RouteURL())
	waitFor(t, "full mesh", func() bool {
		return a.NumRoutes() >= 2 && b.NumRoutes() >= 2 && c.NumRoutes() >= 2
	})

	ncC := connect(t, c)
	sub, err := ncC.Subscribe("ping", func(m *nats.Msg) { _ = m.Respond(append([]byte("pong "), m.Data...)) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := ncC.Flush(); err != nil {
		t.Fatal(err)
	}
	ncA := connect(t, a)
	var reply *nats.Msg
	waitFor(t, "reply across the cluster", func() bool {
		reply, err = ncA.Request("ping", []byte("from a"), 200*time.Millisecond)
		return err == nil
	})
	if got := string(reply.Data); got != "pong from a" {
		t.Errorf("reply = %q, want %q", got, "pong from a")
	}
}

func TestConfigValidate(t *testing.T) {
	base := DefaultConfig()
	if err := base.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v, want nil", err)
	}
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"empty name", func(c *Config) { c.Name = "" }, "server name"},
		{"dotted name", func(c *Config) { c.Name = "a.b" }, "server name"},
		{"bad listen", func(c *Config) { c.Listen = "localhost" }, "listen"},
		{"port range", func(c *Config) { c.Listen = "127.0.0.1:70000" }, "port"},
		{"user without password", func(c *Config) { c.ClientAuth.User = "u" }, "together"},
		{"token and user", func(c *Config) { c.ClientAuth = Auth{User: "u", Password: "p", Token: "t"} }, "not both"},
		{"tls without listener", func(c *Config) { c.ClientTLS = TLSFiles{Cert: "c", Key: "k"} }, "without a client listener"},
		{"cert without key", func(c *Config) { c.Listen = ":0"; c.ClientTLS = TLSFiles{Cert: "c"} }, "together"},
		{"verify without ca", func(c *Config) { c.Listen = ":0"; c.ClientTLS = TLSFiles{Cert: "c", Key: "k", Verify: true} }, "needs a ca"},
		{"zero payload", func(c *Config) { c.MaxPayload = 0 }, "max payload"},
		{"routes without listen", func(c *Config) { c.Cluster.Routes = []string{"127.0.0.1:6222"} }, "without a listen"},
		{"cluster without name", func(c *Config) { c.Cluster.Listen = ":0"; c.JetStream.StoreDir = "d" }, "name"},
		{"route token", func(c *Config) {
			c.Cluster = Cluster{Name: "c", Listen: ":0", Auth: Auth{Token: "t"}}
			c.JetStream.StoreDir = "d"
		}, "not a token"},
		{"bad route", func(c *Config) {
			c.Cluster = Cluster{Name: "c", Listen: ":0", Routes: []string{"http://x:1"}}
			c.JetStream.StoreDir = "d"
		}, "scheme"},
		{"clustered jetstream without dir", func(c *Config) { c.Listen = ":0"; c.Cluster = Cluster{Name: "c", Listen: ":0"} }, "store dir"},
		{"cluster without client listener", func(c *Config) {
			c.Cluster = Cluster{Name: "c", Listen: ":0"}
			c.JetStream.Enabled = false
		}, "client listener"},
		{"replicas without cluster", func(c *Config) { c.JetStream.Replicas = 3 }, "need a cluster"},
		{"bad storage", func(c *Config) { c.JetStream.Storage = 7 }, "storage(7)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want error containing %q", err, tt.want)
			}
			if _, serr := Start(context.Background(), c); serr == nil {
				t.Errorf("Start accepted an invalid config")
			}
		})
	}
}

func TestStartHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cfg := DefaultConfig()
	cfg.JetStream.Enabled = false
	n, err := Start(ctx, cfg)
	if err == nil {
		_ = n.Shutdown(context.Background())
		t.Fatal("Start with a canceled context succeeded")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Start = %v, want context canceled", err)
	}
}

// waitFor polls cond until it holds or five seconds pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLoopbackConfig: a node of its own on 127.0.0.1 that admits the
// token it drew and nobody without it; each config draws another token.
func TestLoopbackConfig(t *testing.T) {
	cfg, err := LoopbackConfig("loop")
	if err != nil {
		t.Fatal(err)
	}
	other, err := LoopbackConfig("loop")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.ClientAuth.Token) != 32 || cfg.ClientAuth.Token == other.ClientAuth.Token {
		t.Fatalf("tokens %q and %q: want two different 32-digit tokens", cfg.ClientAuth.Token, other.ClientAuth.Token)
	}
	n := startNode(t, cfg)
	if _, err := nats.Connect(n.ClientURL()); err == nil {
		t.Error("a client without the token connected")
	}
	nc, err := nats.Connect(n.ClientURL(), nats.Token(cfg.ClientAuth.Token))
	if err != nil {
		t.Fatalf("with the token: %v", err)
	}
	nc.Close()
}

// TestShutdownHandsStreamsOff: the server that leads a replicated stream
// and JetStream's meta group hands both to peers as it stops, so that the
// stream takes writes and the cluster creates streams the moment the
// server is gone, not after its peers' election timeout.
func TestShutdownHandsStreamsOff(t *testing.T) {
	// Clustered JetStream servers become ready together: fixed route ports,
	// started at once.
	names := []string{"a", "b", "c"}
	var routes []string
	for range names {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, ln.Addr().String())
		ln.Close()
	}
	nodes := map[string]*Node{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, name := range names {
		cfg := DefaultConfig()
		cfg.Name = name
		cfg.Listen = "127.0.0.1:0"
		cfg.ClientAuth = Auth{Token: "client-token"}
		cfg.JetStream.StoreDir = t.TempDir()
		cfg.Cluster = Cluster{Name: "c1", Listen: routes[i], Auth: Auth{User: "route", Password: "pw"}}
		for j, r := range routes {
			if j != i {
				cfg.Cluster.Routes = append(cfg.Cluster.Routes, r)
			}
		}
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			n, err := Start(sctx, cfg)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("Start %s: %v", name, err)
				return
			}
			nodes[name] = n
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, n := range nodes {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := n.Shutdown(ctx); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			cancel()
		}
	})
	if len(nodes) != len(names) {
		t.FailNow()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := map[string]jetstream.JetStream{}
	for name, n := range nodes {
		j, err := jetstream.New(connect(t, n))
		if err != nil {
			t.Fatal(err)
		}
		js[name] = j
	}
	var st jetstream.Stream
	for {
		var err error
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		st, err = js["a"].CreateOrUpdateStream(cctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Replicas: 3})
		ccancel()
		if err == nil && st.CachedInfo().Cluster.Leader != "" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no replicated stream: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The node to stop leads both the stream and JetStream's meta group
	// (which creates and updates streams): the stream's leadership moves
	// until it is there.
	var leader string
	waitFor(t, "a meta leader", func() bool {
		for name, n := range nodes {
			if n.srv.JetStreamIsLeader() {
				leader = name
			}
		}
		return leader != ""
	})
	acc := nodes[leader].srv.GlobalAccount().Name
	for l := st.CachedInfo().Cluster.Leader; l != leader; {
		if err := nodes[l].srv.JetStreamStepdownStream(acc, "S"); err != nil {
			t.Fatalf("stream S's leader %s stepping down: %v", l, err)
		}
		waitFor(t, "a new leader of stream S", func() bool {
			ictx, icancel := context.WithTimeout(ctx, time.Second)
			defer icancel()
			s, err := js[leader].Stream(ictx, "S")
			if err != nil || s.CachedInfo().Cluster.Leader == "" || s.CachedInfo().Cluster.Leader == l {
				return false
			}
			l = s.CachedInfo().Cluster.Leader
			return true
		})
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	if err := nodes[leader].Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	other := "a"
	if leader == "a" {
		other = "b"
	}
	// Right away: a meta leader elsewhere (nats-server steps its raft
	// leaders down as it shuts down), a stream leader elsewhere, and a
	// write that lands.
	// An election without the handoff takes 4 s at least (nats-server's
	// shortest election timeout).
	metaAt := time.Now().Add(2 * time.Second)
	for !nodes[other].srv.JetStreamIsLeader() && !nodes[third(names, leader, other)].srv.JetStreamIsLeader() {
		if time.Now().After(metaAt) {
			t.Fatalf("no meta leader 2 s after the meta leader %s stopped", leader)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ictx, icancel := context.WithTimeout(ctx, time.Second)
	defer icancel()
	s, err := js[other].Stream(ictx, "S")
	if err != nil {
		t.Fatalf("stream info after %s stopped: %v", leader, err)
	}
	if l := s.CachedInfo().Cluster.Leader; l == "" || l == leader {
		t.Errorf("stream S led by %q after its leader %s stopped", l, leader)
	}
	if _, err := js[other].Publish(ictx, "s", []byte("x")); err != nil {
		t.Errorf("a write after the leader %s stopped: %v", leader, err)
	}
}

// third is the name of names that is neither a nor b.
func third(names []string, a, b string) string {
	for _, n := range names {
		if n != a && n != b {
			return n
		}
	}
	return ""
}

// TestStartRefusesTakenName: a node that joins the cluster through a seed
// of its own name is refused before its server starts (the cluster would
// refuse its routes and leave it alone), and says which seed; another name
// joins, and the same name in another cluster is no conflict.
func TestStartRefusesTakenName(t *testing.T) {
	cfgOf := func(name, cluster string, routes ...string) Config {
		cfg := DefaultConfig()
		cfg.Name = name
		cfg.Listen = "127.0.0.1:0"
		cfg.ClientAuth = Auth{Token: "client-token"}
		cfg.JetStream.Enabled = false
		cfg.Cluster = Cluster{Name: cluster, Listen: "127.0.0.1:0", Routes: routes, Auth: Auth{User: "route", Password: "pw"}}
		return cfg
	}
	a := startNode(t, cfgOf("alpha", "c1"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := Start(ctx, cfgOf("alpha", "c1", a.RouteURL()))
	if err == nil {
		_ = n.Shutdown(ctx)
		t.Fatal("a second node named alpha started")
	}
	host := a.RouteURL()[strings.LastIndex(a.RouteURL(), "/")+1:]
	if !errors.Is(err, ErrNameTaken) || !strings.Contains(err.Error(), host) {
		t.Errorf("the second alpha: %v; want ErrNameTaken naming %s", err, host)
	}
	b := startNode(t, cfgOf("beta", "c1", a.RouteURL()))
	waitFor(t, "beta routed to alpha", func() bool { return a.NumRoutes() >= 1 && b.NumRoutes() >= 1 })
	startNode(t, cfgOf("alpha", "c2", a.RouteURL()))
}

// TestStartRefusesNameMetThroughRoutes: a node that joins through a seed
// of another name is refused when the cluster's routes lead it to a node
// of its own name (two hosts cloned from one image joining through a
// third); the node already there stays, and a third name joins.
func TestStartRefusesNameMetThroughRoutes(t *testing.T) {
	cfgOf := func(name string, routes ...string) Config {
		cfg := DefaultConfig()
		cfg.Name = name
		cfg.Listen = "127.0.0.1:0"
		cfg.ClientAuth = Auth{Token: "client-token"}
		cfg.JetStream.Enabled = false
		cfg.Cluster = Cluster{Name: "c1", Listen: "127.0.0.1:0", Routes: routes, Auth: Auth{User: "route", Password: "pw"}}
		return cfg
	}
	a := startNode(t, cfgOf("alpha"))
	b := startNode(t, cfgOf("beta", a.RouteURL()))
	waitFor(t, "beta routed to alpha", func() bool { return a.NumRoutes() >= 1 && b.NumRoutes() >= 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := Start(ctx, cfgOf("beta", a.RouteURL()))
	if err == nil {
		_ = n.Shutdown(ctx)
		t.Fatal("a second node named beta started")
	}
	if !errors.Is(err, ErrNameTaken) || !strings.Contains(err.Error(), "duplicate name") {
		t.Errorf("the second beta: %v; want ErrNameTaken for a route refused as a duplicate name", err)
	}
	c := startNode(t, cfgOf("gamma", a.RouteURL()))
	waitFor(t, "a cluster of three", func() bool { return a.NumRoutes() >= 2 && b.NumRoutes() >= 2 && c.NumRoutes() >= 2 })
}

// TestStartAtOnceRefusesOneName: of two nodes of one name that start at
// the same moment, each the other's seed, one at least refuses once it
// finds the other up. A seed that is the node itself is no conflict.
func TestStartAtOnceRefusesOneName(t *testing.T) {
	var routes []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, ln.Addr().String())
		ln.Close()
	}
	cfgOf := func(listen string, seeds ...string) Config {
		cfg := DefaultConfig()
		cfg.Name = "alpha"
		cfg.Listen = "127.0.0.1:0"
		cfg.ClientAuth = Auth{Token: "client-token"}
		cfg.JetStream.Enabled = false
		cfg.Cluster = Cluster{Name: "c1", Listen: listen, Routes: seeds, Auth: Auth{User: "route", Password: "pw"}}
		return cfg
	}
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			n, err := Start(ctx, cfgOf(routes[i], routes...)) // itself among its seeds
			if err == nil {
				// Up for as long as the other may ask it.
				time.Sleep(2 * recheckWait)
				_ = n.Shutdown(ctx)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	refused := 0
	for err := range errs {
		switch {
		case errors.Is(err, ErrNameTaken):
			refused++
		case err != nil:
			t.Errorf("Start: %v", err)
		}
	}
	if refused == 0 {
		t.Error("two nodes named alpha started at once, each the other's seed, and neither was refused")
	}
	// Alone, with itself among its seeds: it starts.
	startNode(t, cfgOf(routes[0], routes[0]))
}
