package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gateway"
	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/generate"
	"github.com/troupe/troupe/models/tokenizer"
	"github.com/troupe/troupe/scheduler"
	"github.com/troupe/troupe/trace"
	"github.com/troupe/troupe/xgmi"
)

// node is one troupe process: its bus server and the actors it runs.
type node struct {
	bus      *bus.Node
	nc       *nats.Conn
	subj     bus.Subjects
	actors   *actors.System
	registry *actors.Registry
	bundle   *models.Bundle
	tok      *tokenizer.Tokenizer
	dev      gpu.Device
	backend  *backend

	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closers []func()
}

func busConfig(cfg serveConfig) bus.Config {
	bc := bus.DefaultConfig()
	bc.Name = cfg.Node
	bc.Listen = cfg.Cluster.ClientListen
	c := cfg.Cluster
	bc.ClientAuth = bus.Auth{User: c.User, Password: c.Password}
	bc.ClientTLS = bus.TLSFiles{Cert: c.TLSCert, Key: c.TLSKey, CA: c.TLSCA, Verify: c.TLSCA != ""}
	if c.RouteListen != "" {
		bc.Cluster = bus.Cluster{Name: c.Name, Listen: c.RouteListen, Routes: c.Join, Auth: bus.Auth{User: c.User, Password: c.Password},
			TLS: bus.TLSFiles{Cert: c.TLSCert, Key: c.TLSKey, CA: c.TLSCA, Verify: c.TLSCA != ""}}
	}
	bc.JetStream.StoreDir = c.StoreDir
	return bc
}

// startNode starts the bus, loads the model and starts every replica's
// layer-shard actors and scheduler.
func startNode(ctx context.Context, cfg serveConfig, tp *trace.Provider, log io.Writer) (_ *node, err error) {
	n := &node{}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if n.bus, err = bus.Start(ctx, busConfig(cfg)); err != nil {
		return nil, fmt.Errorf("serve: bus: %w", err)
	}
	n.closers = append(n.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n.bus.Shutdown(sctx)
	})
	if n.nc, err = n.bus.Conn(ctx); err != nil {
		return nil, fmt.Errorf("serve: bus: %w", err)
	}
	n.closers = append(n.closers, n.nc.Close)
	if n.subj, err = bus.NewSubjects(cfg.Cluster.Name); err != nil {
		return nil, err
	}
	if n.actors, err = actors.NewSystem(actors.Config{Cluster: cfg.Cluster.Name, Node: cfg.Node}, n.nc); err != nil {
		return nil, err
	}
	n.closers = append(n.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.actors.Shutdown(sctx)
	})
	js, err := jetstream.New(n.nc)
	if err != nil {
		return nil, fmt.Errorf("serve: jetstream: %w", err)
	}
	rc := actors.DefaultRegistryConfig()
	rc.Bucket = n.subj.RegistryBucket()
	if n.registry, err = actors.OpenRegistry(ctx, js, rc); err != nil {
		return nil, fmt.Errorf("serve: registry: %w", err)
	}
	sp, err := actors.StartSpawner(ctx, n.actors, n.registry, actors.DefaultSpawnerConfig())
	if err != nil {
		return nil, fmt.Errorf("serve: spawner: %w", err)
	}
	n.closers = append(n.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sp.Close(sctx)
	})
	if n.bundle, err = openBundle(cfg.Model); err != nil {
		return nil, err
	}
	n.closers = append(n.closers, func() { n.bundle.Close() })
	if n.bundle.Tokenizer == nil {
		return nil, fmt.Errorf("serve: %s has no tokenizer.json", n.bundle.Name)
	}
	if n.tok, err = tokenizer.Parse(n.bundle.Tokenizer); err != nil {
		return nil, fmt.Errorf("serve: tokenizer.json: %w", err)
	}
	if n.dev, err = openDevice(ctx, cfg.Device, cfg.Threads); err != nil {
		return nil, err
	}
	n.closers = append(n.closers, func() { n.dev.Close() })
	mc := n.bundle.Config
	fmt.Fprintf(log, "loading %s (%s) on %s: %d replica(s) of %d stage(s)\n", n.bundle.Name, mc.Describe(), n.dev.Name(), cfg.Replicas, cfg.Shards)
	if cfg.Shards > mc.Layers {
		return nil, fmt.Errorf("serve: %d stages for %d layers", cfg.Shards, mc.Layers)
	}
	blocks := cfg.KVBlocks
	if blocks <= 0 {
		blocks = min(cfg.MaxSeqs, 64) * ((mc.MaxPositions + 15) / 16)
	}
	cacheDT := gpu.F32
	if cfg.Device == "cuda" {
		cacheDT = gpu.BF16
	}
	plane := xgmi.NewHost(cfg.Node)
	runCtx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	var scheds []*scheduler.Scheduler
	for r := 0; r < cfg.Replicas; r++ {
		var stages []string
		for s := 0; s < cfg.Shards; s++ {
			first, last := s*mc.Layers/cfg.Shards, (s+1)*mc.Layers/cfg.Shards
			m, err := models.Load(mc, n.bundle.Checkpoint, n.dev, models.Options{FirstLayer: first, LastLayer: last, MaxTokens: cfg.MaxBatchTokens, MaxSeqs: cfg.MaxSeqs, CacheDType: cacheDT})
			if err != nil {
				return nil, err
			}
			n.closers = append(n.closers, func() { m.Close() })
			cache, err := m.NewCache(blocks, 16)
			if err != nil {
				return nil, err
			}
			n.closers = append(n.closers, cache.Close)
			sh := scheduler.NewShard(fmt.Sprintf("r%d-s%d", r, s), s, m, cache, plane, tp.TracerProvider())
			ref, err := actors.Spawn(ctx, n.actors, sh.Props())
			if err != nil {
				return nil, fmt.Errorf("serve: spawn %s: %w", sh.ID, err)
			}
			n.closers = append(n.closers, func() {
				sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				ref.Stop(sctx)
			})
			stages = append(stages, n.subj.ActorEndpoint(scheduler.ShardKind, sh.ID, "forward"))
		}
		kv, err := scheduler.NewKV(blocks, 16)
		if err != nil {
			return nil, err
		}
		sc := scheduler.Config{MaxQueue: cfg.MaxQueue, MaxBatchTokens: cfg.MaxBatchTokens, MaxSeqs: cfg.MaxSeqs, Context: mc.MaxPositions, Vocab: mc.Vocab, EOS: mc.EOS}
		s, err := scheduler.New(sc, scheduler.NewPipeline(n.nc, stages, plane, mc.Vocab), kv, tp.TracerProvider())
		if err != nil {
			return nil, err
		}
		svc, err := scheduler.Serve(runCtx, n.nc, n.subj, n.bundle.Name, s, func() generate.Detokenizer { return n.tok.NewDecoder(true) })
		if err != nil {
			return nil, err
		}
		n.closers = append(n.closers, svc.Close)
		scheds = append(scheds, s)
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			s.Run(runCtx)
		}()
	}
	n.backend = &backend{client: scheduler.NewClient(n.nc, n.subj, n.bundle.Name), scheds: scheds, maxQueue: cfg.MaxQueue}
	return n, nil
}

// Close stops the actors and releases everything, in reverse order.
func (n *node) Close() {
	if n.cancel != nil {
		n.cancel()
	}
	n.wg.Wait()
	for i := len(n.closers) - 1; i >= 0; i-- {
		n.closers[i]()
	}
	n.closers = nil
}

// backend adapts the scheduler client to the gateway.
type backend struct {
	client   *scheduler.Client
	scheds   []*scheduler.Scheduler
	maxQueue int
}

func (b *backend) Generate(ctx context.Context, req gateway.GenerateRequest, emit func(gateway.Token) error) (gateway.Finish, error) {
	m := scheduler.SubmitMsg{
		ID: req.RequestID, Tenant: req.Tenant, Prompt: req.Prompt, MaxTokens: req.MaxTokens,
		Temperature: req.Temperature, TopP: req.TopP, TopK: req.TopK, MinP: req.MinP, RepetitionPenalty: req.RepetitionPenalty,
		Stop: req.Stop, IgnoreEOS: req.IgnoreEOS, TopLogprobs: req.TopLogprobs,
	}
	if req.Seed != nil {
		m.HasSeed, m.Seed = true, *req.Seed
	}
	var started time.Time
	final, err := b.client.Generate(ctx, m, func(f scheduler.FrameMsg) error {
		now := time.Now()
		queued, sinceStart, _ := f.Timings()
		if started.IsZero() {
			started = now.Add(-sinceStart)
		}
		t := gateway.Token{ID: f.ID, Text: f.Text, Logprob: f.Logprob, TraceID: f.TraceID, QueuedAt: started.Add(-queued), StartedAt: started, EmittedAt: now}
		for i, id := range f.TopIDs {
			t.TopLogprobs = append(t.TopLogprobs, gateway.TokenLogprob{ID: id, Logprob: f.TopLPs[i]})
		}
		return emit(t)
	})
	fin := gateway.Finish{Reason: final.Reason, PromptTokens: final.PromptTokens, CompletionTokens: final.CompletionTokens}
	var be *bus.Error
	switch {
	case errors.As(err, &be) && be.Code == bus.CodeOverloaded:
		return fin, &gateway.OverloadedError{RetryAfter: scheduler.RetryAfter, Reason: be.Description}
	case errors.As(err, &be) && be.Code == bus.CodeBadRequest:
		return fin, fmt.Errorf("%w: %s", gateway.ErrInvalidRequest, be.Description)
	case err != nil:
		if ctx.Err() != nil {
			fin.Reason = gateway.FinishCancelled
		}
		return fin, err
	}
	if final.Reason == "error" {
		return fin, errors.New(final.Err)
	}
	return fin, nil
}

func (b *backend) Ready() (bool, string) {
	for _, s := range b.scheds {
		if s.Stats().Waiting < b.maxQueue {
			return true, ""
		}
	}
	return false, "every scheduler's queue is full"
}

// Stats implements gateway.StatsSource.
func (b *backend) Stats() gateway.Stats {
	var st gateway.Stats
	var used, total int
	for _, s := range b.scheds {
		x := s.Stats()
		st.QueueDepth += x.Waiting
		st.Running += x.Running
		used += x.KV.Used
		total += x.KV.Blocks
	}
	if total > 0 {
		st.KVUsage = float64(used) / float64(total)
	}
	return st
}
