package bus

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Node is a running embedded nats-server.
type Node struct {
	cfg    Config
	srv    *server.Server
	tmpDir string // private store dir removed at Shutdown; "" if none

	stopOnce sync.Once
	done     chan struct{} // closed when shutdown has completed
}

// Start validates cfg, starts the server and waits until it accepts
// connections or ctx ends. It refuses (ErrNameTaken) the name of a node of
// the cluster that a seed route leads to, for a second after the server
// starts of one that starts at the same moment, and of one the cluster's
// routes lead to once this node has joined (bus/name.go).
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bus: start %q: %w", cfg.Name, err)
	}
	silent, err := checkName(ctx, cfg)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, done: make(chan struct{})}
	opts, err := n.options()
	if err != nil {
		return nil, err
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		n.removeTmp()
		return nil, fmt.Errorf("bus: new server: %w", err)
	}
	watch := newNameWatch(cfg.Logger)
	srv.SetLoggerV2(watch, false, false, false)
	n.srv = srv
	srv.Start()
	for !srv.ReadyForConnections(20 * time.Millisecond) {
		if err := ctx.Err(); err != nil {
			n.stopOnce.Do(n.shutdown)
			return nil, fmt.Errorf("bus: server %q not ready: %w", cfg.Name, err)
		}
	}
	end := time.Now().Add(recheckWait)
	if err := recheckName(ctx, cfg, silent, srv.ID()); err != nil {
		n.stopOnce.Do(n.shutdown)
		return nil, err
	}
	if err := watchName(ctx, cfg, watch, srv.NumRoutes, end); err != nil {
		n.stopOnce.Do(n.shutdown)
		return nil, err
	}
	return n, nil
}

func (n *Node) options() (*server.Options, error) {
	c := n.cfg
	o := &server.Options{
		ServerName: c.Name,
		DontListen: c.Listen == "",
		MaxPayload: c.MaxPayload,
		NoLog:      false, // the log goes through a nameWatch, which drops it without a Logger
		NoSigs:     true,
	}
	if c.Listen != "" {
		host, port, _ := splitHostPort(c.Listen)
		o.Host, o.Port = host, randomIfZero(port)
		if c.ClientTLS.enabled() {
			tc, err := server.GenTLSConfig(tlsOpts(c.ClientTLS))
			if err != nil {
				return nil, fmt.Errorf("bus: client tls: %w", err)
			}
			o.TLSConfig, o.TLSVerify = tc, c.ClientTLS.Verify
		}
	} else {
		o.Port = server.RANDOM_PORT // never bound: DontListen
	}
	o.Username, o.Password, o.Authorization = c.ClientAuth.User, c.ClientAuth.Password, c.ClientAuth.Token

	if cl := c.Cluster; cl.Listen != "" {
		host, port, _ := splitHostPort(cl.Listen)
		o.Cluster = server.ClusterOpts{
			Name:      cl.Name,
			Host:      host,
			Port:      randomIfZero(port),
			Username:  cl.Auth.User,
			Password:  cl.Auth.Password,
			Advertise: cl.Advertise,
		}
		if cl.TLS.enabled() {
			tc, err := server.GenTLSConfig(tlsOpts(cl.TLS))
			if err != nil {
				return nil, fmt.Errorf("bus: route tls: %w", err)
			}
			o.Cluster.TLSConfig = tc
		}
		for _, r := range cl.Routes {
			u, err := routeURL(r, cl.Auth)
			if err != nil {
				return nil, fmt.Errorf("bus: %w", err)
			}
			o.Routes = append(o.Routes, u)
		}
	}

	if js := c.JetStream; js.Enabled {
		o.JetStream = true
		o.JetStreamMaxMemory, o.JetStreamMaxStore = js.MaxMemory, js.MaxStore
		o.StoreDir = js.StoreDir
		if o.StoreDir == "" {
			dir, err := os.MkdirTemp("", "troupe-js-")
			if err != nil {
				return nil, fmt.Errorf("bus: jetstream store dir: %w", err)
			}
			n.tmpDir, o.StoreDir = dir, dir
		}
	}
	return o, nil
}

func randomIfZero(port int) int {
	if port == 0 {
		return server.RANDOM_PORT
	}
	return port
}

func tlsOpts(t TLSFiles) *server.TLSConfigOpts {
	return &server.TLSConfigOpts{CertFile: t.Cert, KeyFile: t.Key, CaFile: t.CA, Verify: t.Verify}
}

// Config returns the configuration the node was started with.
func (n *Node) Config() Config { return n.cfg }

// Name returns the server name.
func (n *Node) Name() string { return n.cfg.Name }

// Conn connects to the node. The connection is in-process (no socket) and
// carries the client credentials; opts are applied after troupe's own and
// may override them. The caller owns the connection and closes it.
func (n *Node) Conn(ctx context.Context, opts ...nats.Option) (*nats.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bus: connect to %q: %w", n.cfg.Name, err)
	}
	base := []nats.Option{
		nats.InProcessServer(n.srv),
		nats.Name(n.cfg.Name + "-inproc"),
		nats.MaxReconnects(-1),
	}
	switch a := n.cfg.ClientAuth; {
	case a.Token != "":
		base = append(base, nats.Token(a.Token))
	case a.User != "":
		base = append(base, nats.UserInfo(a.User, a.Password))
	}
	nc, err := nats.Connect("", append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("bus: connect to %q: %w", n.cfg.Name, err)
	}
	return nc, nil
}

// ClientURL is the nats:// URL of the client listener, or "" when the node
// has none (the default).
func (n *Node) ClientURL() string {
	if n.cfg.Listen == "" {
		return ""
	}
	return n.srv.ClientURL()
}

// RouteURL is the nats-route:// URL other nodes use as a seed route to this
// one, or "" when the node is not clustered.
func (n *Node) RouteURL() string {
	if n.cfg.Cluster.Listen == "" {
		return ""
	}
	addr := n.srv.ClusterAddr()
	if addr == nil {
		return ""
	}
	u := url.URL{Scheme: "nats-route", Host: addr.String()}
	return u.String()
}

// NumRoutes is the number of routes currently connected.
func (n *Node) NumRoutes() int { return n.srv.NumRoutes() }

// Shutdown stops the server, closing its clients, and waits until every
// server goroutine has returned or ctx ends. If ctx ends first the shutdown
// still completes in the background and Shutdown returns ctx's error.
// Calling Shutdown again waits for the same shutdown.
// A clustered JetStream server first hands the streams it leads to their
// other peers (HandOff), for up to a second.
func (n *Node) Shutdown(ctx context.Context) error {
	n.stopOnce.Do(func() {
		hctx, cancel := context.WithTimeout(ctx, handOffWait)
		n.HandOff(hctx)
		cancel()
		go n.shutdown()
	})
	select {
	case <-n.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bus: shutdown %q: %w", n.cfg.Name, ctx.Err())
	}
}

// handOffWait bounds how long Shutdown waits for the streams' new
// leaders: an election among live peers takes well under a second.
const handOffWait = time.Second

// HandOff moves the leadership of each replicated stream this server
// leads to another of its peers, and returns when each has a leader
// elsewhere or ctx ends. A clustered server that stops while it leads a
// stream stalls the stream's writes until its peers' election timeout
// passes (seconds): a registry whose leases must be renewed within a TTL
// cannot wait that long. A server that is not clustered does nothing.
func (n *Node) HandOff(ctx context.Context) {
	if !n.srv.JetStreamIsClustered() {
		return
	}
	nc, err := n.Conn(ctx, nats.Name(n.cfg.Name+"-handoff"))
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	acc := n.srv.GlobalAccount().Name
	var led []string
	streams := js.ListStreams(ctx)
	for info := range streams.Info() {
		name := info.Config.Name
		// A stream of one replica has no peer to take it.
		if info.Config.Replicas > 1 && n.srv.JetStreamIsStreamLeader(acc, name) && n.srv.JetStreamStepdownStream(acc, name) == nil {
			led = append(led, name)
		}
	}
	for _, name := range led {
		for n.srv.JetStreamIsStreamLeader(acc, name) || !ledElsewhere(ctx, js, name, n.cfg.Name) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// ledElsewhere reports whether stream name has a leader other than self.
func ledElsewhere(ctx context.Context, js jetstream.JetStream, name, self string) bool {
	ictx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	st, err := js.Stream(ictx, name)
	if err != nil {
		return false
	}
	c := st.CachedInfo().Cluster
	return c != nil && c.Leader != "" && c.Leader != self
}

func (n *Node) shutdown() {
	n.srv.Shutdown() // idempotent; a second call returns at once
	n.srv.WaitForShutdown()
	n.removeTmp()
	close(n.done)
}

func (n *Node) removeTmp() {
	if n.tmpDir != "" {
		_ = os.RemoveAll(n.tmpDir)
	}
}
