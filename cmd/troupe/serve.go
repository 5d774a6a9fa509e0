package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gateway"
	"github.com/troupe/troupe/models/chat"
	"github.com/troupe/troupe/trace"
)

// serveConfig is the configuration of `troupe serve`, read from a JSON file
// (--config) and overridden by flags.
type serveConfig struct {
	// Listen is the HTTP address of the gateway.
	Listen string `json:"listen"`
	// Model is a model directory; empty serves the embedded demo model.
	Model string `json:"model"`
	// Device is the compute lane: cpu, cuda or ref.
	Device  string `json:"device"`
	Threads int    `json:"threads"`
	// Shards is the number of pipeline stages per replica; Replicas the
	// number of full copies of the model.
	Shards   int `json:"shards"`
	Replicas int `json:"replicas"`
	// Scheduling limits.
	MaxQueue       int `json:"max_queue"`
	MaxBatchTokens int `json:"max_batch_tokens"`
	MaxSeqs        int `json:"max_seqs"`
	KVBlocks       int `json:"kv_blocks"`
	// APIKeys are required on every route but /health and /ready when set.
	APIKeys []string `json:"api_keys"`
	// Node names this process in the cluster.
	Node string `json:"node"`
	// Cluster is the bus configuration (routes, TLS, credentials).
	Cluster clusterConfig `json:"cluster"`
	// TraceSampleRatio is the fraction of requests traced.
	TraceSampleRatio float64 `json:"trace_sample_ratio"`
	// DataListen is the data-plane listener (host:port) that serves this
	// node's activations to other nodes; empty on a clustered node picks a
	// free port on the route listener's host.
	DataListen string `json:"data_listen"`
	// Placement places one replica group's stages on nodes: placements
	// separated by ';' in order of preference, each a ','-separated list of
	// the nodes of its stages. Empty runs Replicas local replicas.
	Placement string `json:"placement"`
	// StepTimeout bounds one stage's forward pass before the stage counts
	// as dead.
	StepTimeout time.Duration `json:"step_timeout"`
	// Insecure allows network listeners without credentials.
	Insecure bool `json:"insecure"`
}

// clusterConfig configures the embedded NATS server's listeners.
type clusterConfig struct {
	Name string `json:"name"`
	// ClientListen opens a NATS client port (host:port); empty keeps the
	// bus in-process only.
	ClientListen string `json:"client_listen"`
	// RouteListen opens the cluster route port (host:port).
	RouteListen string `json:"route_listen"`
	// Join lists other nodes' route URLs (nats-route://host:port).
	Join []string `json:"join"`
	// User and Password protect the client and route ports.
	User     string `json:"user"`
	Password string `json:"password"`
	// TLS files for the client and route ports.
	TLSCert string `json:"tls_cert"`
	TLSKey  string `json:"tls_key"`
	TLSCA   string `json:"tls_ca"`
	// StoreDir keeps JetStream data on disk; empty keeps it in memory.
	StoreDir string `json:"store_dir"`
}

func defaultServeConfig() serveConfig {
	host, _ := os.Hostname()
	return serveConfig{
		Listen: "127.0.0.1:8080", Device: "cpu", Shards: 1, Replicas: 1,
		MaxQueue: 256, MaxBatchTokens: 512, MaxSeqs: 64, KVBlocks: 0,
		Node: bus.Token(host), Cluster: clusterConfig{Name: "troupe"}, TraceSampleRatio: 1,
		StepTimeout: 10 * time.Second,
	}
}

// parseServe reads the config file named by --config and applies the flags
// given on the command line over it.
func parseServe(args []string, stderr io.Writer) (serveConfig, error) {
	cfg := defaultServeConfig()
	fs := flags("serve", stderr)
	file := fs.String("config", "", "JSON configuration file (flags override it)")
	var fcfg serveConfig
	fs.StringVar(&fcfg.Listen, "listen", cfg.Listen, "HTTP listen address")
	fs.StringVar(&fcfg.Model, "model", "", "model directory (default: the embedded demo model)")
	fs.StringVar(&fcfg.Device, "device", cfg.Device, "compute lane: cpu, cuda or ref")
	fs.IntVar(&fcfg.Threads, "threads", 0, "CPU threads (0: all)")
	fs.IntVar(&fcfg.Shards, "shards", cfg.Shards, "pipeline stages per replica")
	fs.IntVar(&fcfg.Replicas, "replicas", cfg.Replicas, "replicas of the model")
	fs.IntVar(&fcfg.MaxQueue, "max-queue", cfg.MaxQueue, "requests waiting before 429s")
	fs.IntVar(&fcfg.MaxBatchTokens, "max-batch-tokens", cfg.MaxBatchTokens, "tokens per step")
	fs.IntVar(&fcfg.MaxSeqs, "max-seqs", cfg.MaxSeqs, "sequences per step")
	fs.IntVar(&fcfg.KVBlocks, "kv-blocks", 0, "KV cache blocks of 16 tokens per replica (0: max-seqs full contexts)")
	keys := fs.String("api-keys", "", "comma-separated API keys (default: none required)")
	fs.StringVar(&fcfg.Node, "node", cfg.Node, "this node's name")
	fs.StringVar(&fcfg.Cluster.Name, "cluster", cfg.Cluster.Name, "cluster name")
	fs.StringVar(&fcfg.Cluster.ClientListen, "bus-listen", "", "NATS client listen address (default: none)")
	fs.StringVar(&fcfg.Cluster.RouteListen, "route-listen", "", "NATS cluster route listen address (default: none)")
	join := fs.String("join", "", "comma-separated route URLs of other nodes")
	fs.StringVar(&fcfg.Cluster.User, "bus-user", "", "user for the bus ports")
	fs.StringVar(&fcfg.Cluster.Password, "bus-password", "", "password for the bus ports")
	fs.StringVar(&fcfg.Cluster.TLSCert, "tls-cert", "", "TLS certificate for the bus ports")
	fs.StringVar(&fcfg.Cluster.TLSKey, "tls-key", "", "TLS key for the bus ports")
	fs.StringVar(&fcfg.Cluster.TLSCA, "tls-ca", "", "CA that bus peers' certificates must chain to")
	fs.Float64Var(&fcfg.TraceSampleRatio, "trace-sample", cfg.TraceSampleRatio, "fraction of requests traced")
	fs.StringVar(&fcfg.Cluster.StoreDir, "store-dir", "", "JetStream store directory (default: a temporary one)")
	fs.StringVar(&fcfg.DataListen, "data-listen", "", "data-plane listen address (default: a free port on the route listener's host)")
	fs.StringVar(&fcfg.Placement, "placement", "", "stages of a replica group on nodes, e.g. \"a,b,c;a\" (default: --replicas local replicas)")
	fs.DurationVar(&fcfg.StepTimeout, "step-timeout", cfg.StepTimeout, "longest forward pass of one stage before it counts as dead")
	fs.BoolVar(&fcfg.Insecure, "insecure", false, "allow bus and data-plane listeners on the network without credentials")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	if *file != "" {
		raw, err := os.ReadFile(*file)
		if err != nil {
			return cfg, fmt.Errorf("serve: %w", err)
		}
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return cfg, fmt.Errorf("serve: %s: %w", *file, err)
		}
	}
	fcfg.APIKeys = splitList(*keys)
	fcfg.Cluster.Join = splitList(*join)
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "listen":
			cfg.Listen = fcfg.Listen
		case "model":
			cfg.Model = fcfg.Model
		case "device":
			cfg.Device = fcfg.Device
		case "threads":
			cfg.Threads = fcfg.Threads
		case "shards":
			cfg.Shards = fcfg.Shards
		case "replicas":
			cfg.Replicas = fcfg.Replicas
		case "max-queue":
			cfg.MaxQueue = fcfg.MaxQueue
		case "max-batch-tokens":
			cfg.MaxBatchTokens = fcfg.MaxBatchTokens
		case "max-seqs":
			cfg.MaxSeqs = fcfg.MaxSeqs
		case "kv-blocks":
			cfg.KVBlocks = fcfg.KVBlocks
		case "api-keys":
			cfg.APIKeys = fcfg.APIKeys
		case "node":
			cfg.Node = fcfg.Node
		case "cluster":
			cfg.Cluster.Name = fcfg.Cluster.Name
		case "bus-listen":
			cfg.Cluster.ClientListen = fcfg.Cluster.ClientListen
		case "route-listen":
			cfg.Cluster.RouteListen = fcfg.Cluster.RouteListen
		case "join":
			cfg.Cluster.Join = fcfg.Cluster.Join
		case "bus-user":
			cfg.Cluster.User = fcfg.Cluster.User
		case "bus-password":
			cfg.Cluster.Password = fcfg.Cluster.Password
		case "tls-cert":
			cfg.Cluster.TLSCert = fcfg.Cluster.TLSCert
		case "tls-key":
			cfg.Cluster.TLSKey = fcfg.Cluster.TLSKey
		case "tls-ca":
			cfg.Cluster.TLSCA = fcfg.Cluster.TLSCA
		case "trace-sample":
			cfg.TraceSampleRatio = fcfg.TraceSampleRatio
		case "store-dir":
			cfg.Cluster.StoreDir = fcfg.Cluster.StoreDir
		case "data-listen":
			cfg.DataListen = fcfg.DataListen
		case "placement":
			cfg.Placement = fcfg.Placement
		case "step-timeout":
			cfg.StepTimeout = fcfg.StepTimeout
		case "insecure":
			cfg.Insecure = fcfg.Insecure
		}
	})
	if cfg.Shards < 1 || cfg.Replicas < 0 {
		return cfg, fmt.Errorf("serve: --shards must be at least 1 and --replicas at least 0")
	}
	if cfg.StepTimeout <= 0 {
		return cfg, fmt.Errorf("serve: --step-timeout %v: want > 0", cfg.StepTimeout)
	}
	if cfg.Placement != "" {
		if _, err := parsePlacements(cfg.Placement); err != nil {
			return cfg, fmt.Errorf("serve: --placement: %w", err)
		}
	}
	if err := checkExposure(cfg); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func cmdServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseServe(args, stderr)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return serve(ctx, cfg, ln, stderr)
}

// serve runs a node: the bus, the replicas' actors and the gateway on ln,
// until ctx ends.
func serve(ctx context.Context, cfg serveConfig, ln net.Listener, log io.Writer) error {
	defer ln.Close()
	start := time.Now()
	tcfg := trace.DefaultConfig()
	tcfg.NodeName, tcfg.SampleRatio = cfg.Node, cfg.TraceSampleRatio
	exp, err := trace.ExportFromEnv(os.LookupEnv)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	tcfg.Export = exp
	tp, err := trace.Setup(ctx, tcfg)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tp.Shutdown(sctx)
	}()
	n, err := startNode(ctx, cfg, tp, log)
	if err != nil {
		return err
	}
	defer n.Close()
	var tmpl gateway.ChatTemplate
	if n.bundle.TokenizerConfig != nil {
		cc, err := chat.ParseConfig(n.bundle.TokenizerConfig)
		if err != nil {
			return fmt.Errorf("serve: tokenizer_config.json: %w", err)
		}
		if cc.HasTemplate() {
			tmpl = chatTemplate{cc}
		}
	}
	gcfg := gateway.DefaultConfig()
	gcfg.Models = []gateway.ModelInfo{{ID: n.bundle.Name, ContextLength: n.bundle.Config.MaxPositions, Created: start.Unix(), OwnedBy: "troupe"}}
	gcfg.APIKeys = cfg.APIKeys
	gw, err := gateway.New(gcfg, n.backend, n.tok, tmpl)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if err := gw.Mount("/debug/", trace.Handler(tp.Store())); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if err := gw.Mount("GET /v1/cluster", n.clusterHandler()); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if err := gw.Mount("/v1/admin/replicas", n.replicasHandler()); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	// The gateway is a micro service like every actor kind: PING, INFO and
	// STATS (with the backend's queue and KV figures) on the bus.
	gsvc, err := micro.AddService(n.nc, micro.Config{
		Name:         "gateway",
		Version:      "1.0.0",
		Description:  "OpenAI-compatible HTTP and websocket gateway",
		Metadata:     map[string]string{"node": cfg.Node, "listen": ln.Addr().String(), "model": n.bundle.Name},
		StatsHandler: func(*micro.Endpoint) any { return n.backend.Stats() },
	})
	if err != nil {
		return fmt.Errorf("serve: gateway service: %w", err)
	}
	defer gsvc.Stop()
	fmt.Fprintf(log, "serving %s on http://%s (ready in %s): OpenAI API at /v1, demo page at /\n", n.bundle.Name, ln.Addr(), time.Since(start).Round(time.Millisecond))
	err = gw.Serve(ctx, ln)
	if errors.Is(err, context.Canceled) || ctx.Err() != nil {
		return nil
	}
	return err
}

// chatTemplate adapts the chat package to the gateway's interface.
type chatTemplate struct{ c *chat.Config }

func (t chatTemplate) Render(msgs []gateway.Message, addGenerationPrompt bool) (string, error) {
	cm := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		cm[i] = chat.Message{Role: m.Role, Content: m.Content}
	}
	return t.c.Render(cm, addGenerationPrompt)
}
