package main

import (
	"bytes"
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
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/chat"
	"github.com/troupe/troupe/scheduler"
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
	// KVCache is the KV cache's element type: auto, f32, bf16 or f16.
	KVCache string `json:"kv_cache"`
	// CodeWeights names the weights also held in a lossless 12-bit code on
	// the CUDA lane: none, head, all or auto (models.Options.CodeWeights).
	CodeWeights models.Coding `json:"code_weights"`
	// Shards is the number of pipeline stages per replica; Replicas the
	// number of full copies of the model.
	Shards   int `json:"shards"`
	Replicas int `json:"replicas"`
	// TP is the number of tensor-parallel ranks of each stage of a
	// replica: CPU devices sharing the threads, or GPUs (replica r's
	// stage s on (r·Shards+s)·TP to (r·Shards+s)·TP+TP-1).
	TP int `json:"tp"`
	// Scheduling limits.
	MaxQueue       int `json:"max_queue"`
	MaxBatchTokens int `json:"max_batch_tokens"`
	MaxSeqs        int `json:"max_seqs"`
	KVBlocks       int `json:"kv_blocks"`
	// APIKeys are required on every route but /health and /ready when set.
	APIKeys []string `json:"api_keys"`
	// ServedModelNames are the model ids the API answers to, in place of
	// the model's own name (its folder's or repository's); the first is
	// listed first.
	ServedModelNames []string `json:"served_model_names"`
	// MaxInFlightPerKey bounds the generations one API key runs at once
	// through a node's gateway (gateway.Config.MaxInFlightPerKey); 0: none.
	MaxInFlightPerKey int `json:"max_in_flight_per_key"`
	// KeptResponses bounds the Responses API answers the cluster keeps for
	// previous_response_id (every node's gateway finds them); 0 keeps none.
	KeptResponses int `json:"kept_responses"`
	// GenerationConfig is "auto" (requests that leave a sampler's
	// parameter out take the model's generation_config.json's) or "none".
	GenerationConfig string `json:"generation_config"`
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
	// Group names the replica groups of Placement across nodes: every node
	// started with the same Group (and the same Placement) campaigns to
	// schedule them, one at a time, and the others stand by to take over
	// when it is gone. Empty: this node schedules its groups alone.
	Group string `json:"group"`
	// OrphanGrace is how long a stage on this node may have no scheduler
	// (its replica's KV-manager gone from the registry) before the node
	// stops it and frees its memory; 0 keeps orphans. In a config file, a
	// duration string.
	OrphanGrace time.Duration `json:"orphan_grace"`
	// StepTimeout bounds one stage's forward pass before the stage counts
	// as dead; in a config file, a duration string such as "10s".
	StepTimeout time.Duration `json:"step_timeout"`
	// MicroBatches is the most micro-batches a step of a pipeline of two or
	// more stages is cut into (by sequences), to keep the stages busy at
	// once: 0 is one per stage, 1 is off.
	MicroBatches int `json:"micro_batches"`
	// Insecure allows network listeners without credentials.
	Insecure bool `json:"insecure"`

	// submitOverBus makes the gateway reach the schedulers of this
	// process over the bus too, as it does those of other nodes; tests
	// set it to check that both paths behave the same.
	submitOverBus bool
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

// UnmarshalJSON decodes a config file strictly (unknown keys are errors),
// reading durations as Go duration strings ("10s", "1m30s").
func (c *serveConfig) UnmarshalJSON(b []byte) error {
	type plain serveConfig
	aux := struct {
		*plain
		StepTimeout *string `json:"step_timeout"`
		OrphanGrace *string `json:"orphan_grace"`
	}{plain: (*plain)(c)}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&aux); err != nil {
		return err
	}
	for _, f := range []struct {
		key string
		raw *string
		to  *time.Duration
	}{{"step_timeout", aux.StepTimeout, &c.StepTimeout}, {"orphan_grace", aux.OrphanGrace, &c.OrphanGrace}} {
		if f.raw == nil {
			continue
		}
		d, err := time.ParseDuration(*f.raw)
		if err != nil {
			return fmt.Errorf("%s: %w", f.key, err)
		}
		*f.to = d
	}
	return nil
}

func defaultServeConfig() serveConfig {
	host, _ := os.Hostname()
	return serveConfig{
		Listen: "127.0.0.1:8080", Device: "cpu", KVCache: "auto", CodeWeights: models.CodeAuto, Shards: 1, Replicas: 1, TP: 1,
		MaxQueue: 256, MaxBatchTokens: 512, MaxSeqs: 64, KVBlocks: 0, KeptResponses: 4096, GenerationConfig: "auto",
		Node: bus.Token(host), Cluster: clusterConfig{Name: "troupe"}, TraceSampleRatio: 1,
		StepTimeout: 10 * time.Second, OrphanGrace: time.Minute, MicroBatches: scheduler.DefaultMicroBatches,
	}
}

// bindServeFlags binds the flags of `troupe serve` to c's fields, with c's
// values as their defaults, and returns the --config flag.
func bindServeFlags(fs *flag.FlagSet, c *serveConfig) *string {
	file := fs.String("config", "", "JSON configuration file (flags override it)")
	fs.StringVar(&c.Listen, "listen", c.Listen, "HTTP listen address")
	fs.StringVar(&c.Model, "model", c.Model, modelUsage)
	fs.StringVar(&c.Device, "device", c.Device, "compute lane: cpu, cuda or ref")
	fs.IntVar(&c.Threads, "threads", c.Threads, "CPU threads (0: all)")
	fs.StringVar(&c.KVCache, "kv-cache", c.KVCache, kvCacheUsage)
	fs.TextVar(&c.CodeWeights, "code-weights", c.CodeWeights, codeWeightsUsage)
	fs.IntVar(&c.Shards, "shards", c.Shards, "pipeline stages per replica")
	fs.IntVar(&c.Replicas, "replicas", c.Replicas, "replicas of the model")
	fs.IntVar(&c.TP, "tp", c.TP, "tensor-parallel ranks of each replica's stage: CPU devices sharing --threads, or GPUs (--device cuda; at the start replica r's stage s on GPUs (r·S+s)·N to (r·S+s)·N+N-1 for --shards S)")
	fs.IntVar(&c.MaxQueue, "max-queue", c.MaxQueue, "requests waiting before 429s")
	fs.IntVar(&c.MaxBatchTokens, "max-batch-tokens", c.MaxBatchTokens, "tokens per step")
	fs.IntVar(&c.MaxSeqs, "max-seqs", c.MaxSeqs, "sequences per step")
	fs.IntVar(&c.KVBlocks, "kv-blocks", c.KVBlocks, "KV cache blocks of 16 tokens per replica (0: max-seqs full contexts, at most 64, or as many as 90% of the free memory holds)")
	fs.IntVar(&c.KeptResponses, "kept-responses", c.KeptResponses, "Responses API answers kept for previous_response_id and GET /v1/responses/{id}, shared by the cluster's gateways, the oldest dropped first (at most 256 MiB; 0: none)")
	fs.StringVar(&c.GenerationConfig, "generation-config", c.GenerationConfig, "auto: requests that leave temperature, top_p, top_k, min_p or repetition_penalty out take the model's generation_config.json's values; none: the API's defaults")
	fs.Func("api-keys", "comma-separated API keys (default: none required)", func(v string) error { c.APIKeys = splitList(v); return nil })
	fs.Func("served-model-name", "comma-separated model ids the API answers to, in place of the model's own name", func(v string) error { c.ServedModelNames = splitList(v); return nil })
	fs.IntVar(&c.MaxInFlightPerKey, "max-in-flight-per-key", c.MaxInFlightPerKey, "generations one API key may run at once through this node's gateway, so that no key takes every slot (0: no bound but the gateway's)")
	fs.StringVar(&c.Node, "node", c.Node, "this node's name")
	fs.StringVar(&c.Cluster.Name, "cluster", c.Cluster.Name, "cluster name")
	fs.StringVar(&c.Cluster.ClientListen, "bus-listen", c.Cluster.ClientListen, "NATS client listen address (default: none)")
	fs.StringVar(&c.Cluster.RouteListen, "route-listen", c.Cluster.RouteListen, "NATS cluster route listen address (default: none)")
	fs.Func("join", "comma-separated route URLs of other nodes", func(v string) error { c.Cluster.Join = splitList(v); return nil })
	fs.StringVar(&c.Cluster.User, "bus-user", c.Cluster.User, "user for the bus ports")
	fs.StringVar(&c.Cluster.Password, "bus-password", c.Cluster.Password, "password for the bus ports")
	fs.StringVar(&c.Cluster.TLSCert, "tls-cert", c.Cluster.TLSCert, "TLS certificate for the bus ports")
	fs.StringVar(&c.Cluster.TLSKey, "tls-key", c.Cluster.TLSKey, "TLS key for the bus ports")
	fs.StringVar(&c.Cluster.TLSCA, "tls-ca", c.Cluster.TLSCA, "CA that bus peers' certificates must chain to")
	fs.Float64Var(&c.TraceSampleRatio, "trace-sample", c.TraceSampleRatio, "fraction of requests traced")
	fs.StringVar(&c.Cluster.StoreDir, "store-dir", c.Cluster.StoreDir, "JetStream store directory (default: a temporary one)")
	fs.StringVar(&c.DataListen, "data-listen", c.DataListen, "data-plane listen address (default: a free port on the route listener's host)")
	fs.StringVar(&c.Placement, "placement", c.Placement, "stages of a replica group on nodes, e.g. \"a,b,c;a\" (default: --replicas local replicas)")
	fs.StringVar(&c.Group, "group", c.Group, "name of the replica groups of --placement, shared by the nodes that schedule them one at a time (default: none, this node alone)")
	fs.DurationVar(&c.OrphanGrace, "orphan-grace", c.OrphanGrace, "how long a stage here may have no scheduler before it is stopped (0: never)")
	fs.DurationVar(&c.StepTimeout, "step-timeout", c.StepTimeout, "longest forward pass of one stage before it counts as dead")
	fs.IntVar(&c.MicroBatches, "micro-batches", c.MicroBatches, "most micro-batches a pipelined step is cut into (0: one per stage, 1: off)")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "allow bus and data-plane listeners on the network without credentials")
	return file
}

// serveFlagsOver applies the flags in args over c.
func serveFlagsOver(c *serveConfig, args []string) error {
	fs := flag.NewFlagSet("troupe serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	bindServeFlags(fs, c)
	return fs.Parse(args)
}

// parseServe reads the config file named by --config and applies the flags
// given on the command line over it.
func parseServe(args []string, stderr io.Writer) (serveConfig, error) {
	cfg := defaultServeConfig()
	fs := flags("serve", stderr)
	file := bindServeFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	if *file != "" {
		// The file replaces the defaults; the flags, parsed again, override it.
		cfg = defaultServeConfig()
		raw, err := os.ReadFile(*file)
		if err != nil {
			return cfg, fmt.Errorf("serve: %w", err)
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return cfg, fmt.Errorf("serve: %s: %w", *file, err)
		}
		if err := serveFlagsOver(&cfg, args); err != nil {
			return cfg, err
		}
	}
	return cfg, cfg.validate()
}

// minOrphanGrace is the shortest --orphan-grace: twice the registry's TTL,
// past which a live KV-manager's entry is always back.
const minOrphanGrace = 10 * time.Second

// validate checks every setting before anything starts, naming the flag
// (or the config file's key) of the first that is out of range.
func (c serveConfig) validate() error {
	for _, lim := range []struct {
		flag     string
		v, least int
	}{
		{"shards", c.Shards, 1}, {"replicas", c.Replicas, 0}, {"threads", c.Threads, 0},
		{"max-queue", c.MaxQueue, 1}, {"max-batch-tokens", c.MaxBatchTokens, 1},
		{"max-seqs", c.MaxSeqs, 1}, {"kv-blocks", c.KVBlocks, 0}, {"kept-responses", c.KeptResponses, 0},
		{"max-in-flight-per-key", c.MaxInFlightPerKey, 0},
	} {
		if lim.v < lim.least {
			return fmt.Errorf("serve: --%s %d: want %d or more", lim.flag, lim.v, lim.least)
		}
	}
	if err := checkTP(c); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, id := range c.ServedModelNames {
		switch {
		case strings.TrimSpace(id) == "" || strings.ContainsAny(id, " \t\n"):
			return fmt.Errorf("serve: --served-model-name %q: want a name without spaces", id)
		case seen[id]:
			return fmt.Errorf("serve: --served-model-name %q: named twice", id)
		}
		seen[id] = true
	}
	if c.GenerationConfig != "auto" && c.GenerationConfig != "none" {
		return fmt.Errorf("serve: --generation-config %q: want auto or none", c.GenerationConfig)
	}
	if _, err := kvCacheType(c.KVCache, c.Device); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if c.StepTimeout <= 0 {
		return fmt.Errorf("serve: --step-timeout %v: want > 0", c.StepTimeout)
	}
	if c.OrphanGrace != 0 && c.OrphanGrace < minOrphanGrace {
		return fmt.Errorf("serve: --orphan-grace %v: want 0 (never) or at least %v, so that a scheduler being replaced does not count as gone", c.OrphanGrace, minOrphanGrace)
	}
	if c.MicroBatches < 0 || c.MicroBatches > scheduler.MaxMicroBatches {
		return fmt.Errorf("serve: --micro-batches %d: want 0 to %d", c.MicroBatches, scheduler.MaxMicroBatches)
	}
	if !(c.TraceSampleRatio >= 0 && c.TraceSampleRatio <= 1) {
		return fmt.Errorf("serve: --trace-sample %v: want 0 to 1", c.TraceSampleRatio)
	}
	if c.Placement != "" {
		if _, err := parsePlacements(c.Placement); err != nil {
			return fmt.Errorf("serve: --placement: %w", err)
		}
	}
	if c.Group != "" {
		if c.Placement == "" {
			return fmt.Errorf("serve: --group %s needs --placement", c.Group)
		}
		if bus.Token(c.Group) != c.Group {
			return fmt.Errorf("serve: --group %q: want letters, digits, '-' or '_'", c.Group)
		}
		if c.Group == c.Node {
			return fmt.Errorf("serve: --group %s: the node's own name; a group's replicas (%s-r0, ...) would share the names of the node's own", c.Group, c.Group)
		}
	}
	return checkExposure(c)
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
	thinks := false
	if b := n.bundle; b.TokenizerConfig != nil || b.ChatTemplate != nil {
		conf := b.TokenizerConfig
		if conf == nil {
			conf = []byte("{}")
		}
		cc, err := chat.ParseConfigTemplate(conf, b.ChatTemplate)
		if err != nil {
			return fmt.Errorf("serve: chat template: %w", err)
		}
		if cc.HasTemplate() {
			tmpl, thinks = chatTemplate{cc}, cc.Thinks()
		}
	}
	gcfg := gateway.DefaultConfig()
	ids := cfg.ServedModelNames
	if len(ids) == 0 {
		ids = []string{n.bundle.Name}
	}
	for _, id := range ids {
		gcfg.Models = append(gcfg.Models, gateway.ModelInfo{ID: id, ContextLength: n.bundle.Config.MaxPositions, VocabSize: n.bundle.Config.Vocab, Created: start.Unix(), OwnedBy: "troupe", Reasoning: thinks})
	}
	if d := n.bundle.Sampling; cfg.GenerationConfig == "auto" && d.Any() {
		gcfg.Models[0].Defaults = gateway.Sampling{Temperature: d.Temperature, TopP: d.TopP, MinP: d.MinP, RepetitionPenalty: d.RepetitionPenalty, TopK: d.TopK}
		fmt.Fprintf(log, "sampling defaults from generation_config.json (--generation-config none leaves them):%s\n", describeSampling(d))
	}
	gcfg.APIKeys, gcfg.MaxInFlightPerKey = cfg.APIKeys, cfg.MaxInFlightPerKey
	gcfg.Build = n.version.labels()
	gcfg.MaxStoredResponses = 0
	if n.responses != nil {
		gcfg.Responses = n.responses
	}
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
		Version:      n.version.semver(),
		Description:  "OpenAI-compatible HTTP and websocket gateway",
		Metadata:     map[string]string{"node": cfg.Node, "listen": ln.Addr().String(), "model": n.bundle.Name},
		StatsHandler: func(*micro.Endpoint) any { return n.backend.Stats() },
	})
	if err != nil {
		return fmt.Errorf("serve: gateway service: %w", err)
	}
	defer gsvc.Stop()
	// Every service of this node answers before the gateway takes requests.
	if err := bus.Flush(ctx, n.nc); err != nil {
		return fmt.Errorf("serve: gateway service: %w", err)
	}
	as := ""
	if len(cfg.ServedModelNames) > 0 {
		as = " as " + strings.Join(cfg.ServedModelNames, ", ")
	}
	fmt.Fprintf(log, "serving %s%s on http://%s (ready in %s): OpenAI API at /v1, demo page at /\n", n.bundle.Name, as, ln.Addr(), time.Since(start).Round(time.Millisecond))
	// Asked to stop, the node's replicas finish the requests they run (those
	// of other nodes' gateways too) while the gateway finishes its own, in
	// the same time.
	drained := make(chan struct{})
	stopDrain := context.AfterFunc(ctx, func() {
		defer close(drained)
		n.drain(gcfg.ShutdownTimeout)
	})
	err = gw.Serve(ctx, ln)
	if stopDrain() {
		n.drain(gcfg.ShutdownTimeout) // the listener failed
	} else {
		<-drained
	}
	if errors.Is(err, context.Canceled) || ctx.Err() != nil {
		return nil
	}
	return err
}

// chatTemplate adapts the chat package to the gateway's interface.
type chatTemplate struct{ c *chat.Config }

func (t chatTemplate) Render(msgs []gateway.Message, o gateway.RenderOptions) (string, error) {
	cm := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		cm[i] = chat.Message{Role: m.Role, Content: m.Content, ReasoningContent: m.Reasoning, Name: m.Name, ToolCallID: m.ToolCallID}
		for _, c := range m.ToolCalls {
			cm[i].ToolCalls = append(cm[i].ToolCalls, chat.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
		}
	}
	var ct []chat.Tool
	for _, tl := range o.Tools {
		ct = append(ct, chat.Tool{Name: tl.Name, Description: tl.Description, Parameters: tl.Parameters})
	}
	return t.c.Render(cm, chat.Options{Tools: ct, AddGenerationPrompt: o.AddGenerationPrompt, Vars: o.Vars})
}

// describeSampling names the defaults d sets.
func describeSampling(d models.Sampling) string {
	var b strings.Builder
	for _, f := range []struct {
		name string
		v    *float64
	}{{"temperature", d.Temperature}, {"top_p", d.TopP}, {"min_p", d.MinP}, {"repetition_penalty", d.RepetitionPenalty}} {
		if f.v != nil {
			fmt.Fprintf(&b, " %s %g", f.name, *f.v)
		}
	}
	if d.TopK != nil {
		fmt.Fprintf(&b, " top_k %d", *d.TopK)
	}
	return b.String()
}
