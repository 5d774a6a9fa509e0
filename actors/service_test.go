package actors

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/troupe/troupe/bus"
)

type echoReq struct{ Text string }

func (echoReq) Schema() bus.Schema { return bus.Schema{ID: "test.echo.req", Version: 1} }

type echoResp struct {
	Text string
	Seq  int
}

func (echoResp) Schema() bus.Schema { return bus.Schema{ID: "test.echo.resp", Version: 1} }

// echoMsg is the echo actor's message: a call from the bus.
type echoMsg = *Call[echoReq, echoResp]

type echoActor struct{ seq int }

func (a *echoActor) Receive(ctx context.Context, c echoMsg) error {
	a.seq++
	switch c.Req.Text {
	case "panic":
		_ = c.Fail(bus.Errorf(bus.CodeInternal, "about to panic"))
		panic("echo asked to panic")
	case "fail":
		err := bus.Errorf(bus.CodeConflict, "asked to fail")
		_ = c.Fail(err)
		return err
	}
	return c.Reply(echoResp{Text: c.Req.Text, Seq: a.seq})
}

func echoProps(id string) Props[echoMsg] {
	return Props[echoMsg]{
		Kind: "echo", ID: id, Version: "0.1.0", Description: "echoes",
		New:       func() Actor[echoMsg] { return &echoActor{} },
		Endpoints: []Endpoint[echoMsg]{Handle("echo", func(c echoMsg) echoMsg { return c })},
	}
}

func TestActorEndpointsAndMicroVerbs(t *testing.T) {
	_, nc := testBus(t, "n1")
	sys := testSystem(t, "n1", nc)
	ref, err := Spawn(context.Background(), sys, echoProps("e1"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	subj := sys.Subjects().ActorEndpoint("echo", "e1", "echo")
	if subj != ref.Subject()+".echo" {
		t.Fatalf("endpoint subject %q is not under the actor subject %q", subj, ref.Subject())
	}
	for i := 1; i <= 3; i++ {
		resp, err := bus.Request[echoReq, echoResp](ctx, nc, subj, echoReq{Text: "hi"})
		if err != nil {
			t.Fatalf("Request: %v", err)
		}
		if resp.Text != "hi" || resp.Seq != i {
			t.Errorf("reply %d = %+v, want hi/%d", i, resp, i)
		}
	}
	_, err = bus.Request[echoReq, echoResp](ctx, nc, subj, echoReq{Text: "fail"})
	if bus.CodeOf(err) != bus.CodeConflict {
		t.Errorf("failing call = %v, want conflict", err)
	}
	_, err = bus.Request[echoResp, echoResp](ctx, nc, subj, echoResp{})
	if bus.CodeOf(err) != bus.CodeBadRequest {
		t.Errorf("wrong request type = %v, want bad_request", err)
	}

	t.Run("PING", func(t *testing.T) {
		var ping micro.Ping
		request(t, nc, "$SRV.PING.echo", &ping)
		if ping.Name != "echo" || ping.Version != "0.1.0" || ping.Metadata["id"] != "e1" || ping.Metadata["node"] != "n1" {
			t.Errorf("PING = %+v, want echo 0.1.0 for e1 on n1", ping)
		}
	})
	t.Run("the System's version", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Node, cfg.Version = "n2", "2.3.4"
		sys2, err := NewSystem(cfg, nc)
		if err != nil {
			t.Fatal(err)
		}
		defer sys2.Shutdown(context.Background())
		p := echoProps("e2")
		p.Kind, p.Version = "echo2", ""
		if _, err := Spawn(context.Background(), sys2, p); err != nil {
			t.Fatal(err)
		}
		var ping micro.Ping
		request(t, nc, "$SRV.PING.echo2", &ping)
		if ping.Version != "2.3.4" {
			t.Errorf("PING of an actor that names no version = %+v, want the System's 2.3.4", ping)
		}
	})
	t.Run("INFO", func(t *testing.T) {
		var info micro.Info
		request(t, nc, "$SRV.INFO.echo", &info)
		subjects := map[string]bool{}
		for _, e := range info.Endpoints {
			subjects[e.Subject] = true
		}
		if !subjects[subj] || !subjects[ref.Subject()+"."+StatsEndpoint] {
			t.Errorf("INFO endpoints = %+v, want %s and the stats endpoint", info.Endpoints, subj)
		}
	})
	// The actor counts a call after its reply is sent.
	waitFor(t, "the actor to count the calls", func() bool { st := ref.Stats(); return st.Processed == 4 && st.Errors == 1 })
	t.Run("STATS", func(t *testing.T) {
		// micro updates its endpoint counters after the reply is sent: poll.
		var got Stats
		var echo *micro.EndpointStats
		waitFor(t, "STATS to count the failed requests", func() bool {
			var stats micro.Stats
			request(t, nc, "$SRV.STATS.echo", &stats)
			for _, e := range stats.Endpoints {
				if e.Name == "echo" {
					echo = e
				}
			}
			return echo != nil && echo.NumErrors >= 1
		})
		if err := json.Unmarshal(echo.Data, &got); err != nil {
			t.Fatalf("endpoint data: %v", err)
		}
		if got.Processed != 4 || got.Errors != 1 || got.Capacity != DefaultMailbox || got.Status != StatusRunning {
			t.Errorf("STATS data = %+v, want 4 processed, 1 error, capacity %d, running", got, DefaultMailbox)
		}
	})
	t.Run("stats endpoint", func(t *testing.T) {
		var s Stats
		rep, err := nc.Request(ref.Subject()+"."+StatsEndpoint, nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := bus.Decode(rep.Data, &s); err != nil {
			t.Fatal(err)
		}
		if s.ID != "e1" || s.Processed != 4 {
			t.Errorf("stats = %+v, want e1 with 4 processed", s)
		}
	})
	t.Run("panic restarts and the next call is answered", func(t *testing.T) {
		_, err := bus.Request[echoReq, echoResp](ctx, nc, subj, echoReq{Text: "panic"})
		if bus.CodeOf(err) != bus.CodeInternal {
			t.Errorf("panicking call = %v, want internal", err)
		}
		resp, err := bus.Request[echoReq, echoResp](ctx, nc, subj, echoReq{Text: "after"})
		if err != nil || resp.Seq != 1 {
			t.Errorf("call after restart = %+v, %v, want a fresh actor (seq 1)", resp, err)
		}
	})

	if err := ref.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = bus.Request[echoReq, echoResp](ctx, nc, subj, echoReq{Text: "gone"})
	if bus.CodeOf(err) != bus.CodeUnavailable {
		t.Errorf("call to a stopped actor = %v, want unavailable", err)
	}
}

func TestEndpointOverloaded(t *testing.T) {
	_, nc := testBus(t, "n1")
	sys := testSystem(t, "n1", nc)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	p := Props[echoMsg]{
		Kind: "slow", ID: "s1", Mailbox: 1,
		New:       func() Actor[echoMsg] { return blockingEcho{entered: entered, release: release} },
		Endpoints: []Endpoint[echoMsg]{Handle("echo", func(c echoMsg) echoMsg { return c })},
	}
	if _, err := Spawn(context.Background(), sys, p); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	subj := sys.Subjects().ActorEndpoint("slow", "s1", "echo")
	errs := make(chan error, 2)
	go func() { _, err := bus.Request[echoReq, echoResp](ctx, nc, subj, echoReq{}); errs <- err }()
	<-entered // the first call is in Receive
	go func() { _, err := bus.Request[echoReq, echoResp](ctx, nc, subj, echoReq{}); errs <- err }()
	waitFor(t, "second call queued", func() bool {
		pr, _ := sys.Lookup("slow", "s1")
		return pr.Stats().Depth == 1
	})
	_, err := bus.Request[echoReq, echoResp](ctx, nc, subj, echoReq{})
	if bus.CodeOf(err) != bus.CodeOverloaded {
		t.Errorf("call to a full mailbox = %v, want overloaded", err)
	}
	close(release)
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Errorf("queued call %d = %v", i, err)
		}
	}
}

type blockingEcho struct {
	entered chan struct{}
	release chan struct{}
}

func (b blockingEcho) Receive(ctx context.Context, c echoMsg) error {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	<-b.release
	return c.Reply(echoResp{})
}

func request(t *testing.T, nc *nats.Conn, subject string, v any) {
	t.Helper()
	rep, err := nc.Request(subject, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
	if err := json.Unmarshal(rep.Data, v); err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
}
