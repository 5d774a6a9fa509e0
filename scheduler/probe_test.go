package scheduler

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/troupe/troupe/bus"
)

// fakeScheduler answers submits on its own connection, as a scheduler on
// another node would, with a micro service that answers PING, and sends a
// request's frames only when told to.
type fakeScheduler struct {
	nc   *nats.Conn
	svc  micro.Service
	subj bus.Subjects
}

func startFake(t *testing.T, node *bus.Node, subj bus.Subjects) *fakeScheduler {
	t.Helper()
	nc, err := node.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	svc, err := micro.AddService(nc, micro.Config{Name: "scheduler", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	sub, err := bus.Serve(context.Background(), nc, subj.Submit("m"), "sched", func(context.Context, SubmitMsg) (SubmitReply, error) {
		return SubmitReply{Service: svc.Info().ID}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := bus.Flush(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
	return &fakeScheduler{nc: nc, svc: svc, subj: subj}
}

func (f *fakeScheduler) frame(t *testing.T, id string, seq int, final bool) {
	t.Helper()
	if err := bus.Publish(context.Background(), f.nc, f.subj.Tokens(id), FrameMsg{Seq: seq, Text: "x", Final: final, Reason: "length"}); err != nil {
		t.Fatal(err)
	}
}

// TestClientProbesSilentScheduler: a request on the bus whose frames stop
// asks its scheduler whether it lives. A scheduler that answers keeps the
// request waiting, however long its frames take; one that is gone ends
// the request with CodeUnavailable instead of leaving it hanging.
func TestClientProbesSilentScheduler(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node, err := bus.Start(ctx, bus.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer node.Shutdown(context.Background())
	nc, err := node.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	subj, _ := bus.NewSubjects("test")
	c := NewClient(nc, subj, "m")
	c.probe = 50 * time.Millisecond

	// Alive but slow: frames four probes apart.
	f := startFake(t, node, subj)
	type result struct {
		frames int
		err    error
	}
	done := make(chan result, 1)
	var frames int
	go func() {
		_, err := c.Generate(ctx, SubmitMsg{ID: "slow"}, func(FrameMsg) error { frames++; return nil })
		done <- result{frames, err}
	}()
	time.Sleep(200 * time.Millisecond)
	f.frame(t, "slow", 1, false)
	time.Sleep(200 * time.Millisecond)
	f.frame(t, "slow", 2, true)
	if r := <-done; r.err != nil || r.frames != 2 {
		t.Errorf("slow scheduler: %d frames, %v; want 2 frames, no error", r.frames, r.err)
	}

	// Gone: the micro service stops (its process died) after one frame.
	go func() {
		_, err := c.Generate(ctx, SubmitMsg{ID: "lost"}, func(FrameMsg) error { return nil })
		done <- result{0, err}
	}()
	time.Sleep(100 * time.Millisecond)
	f.frame(t, "lost", 1, false)
	f.svc.Stop()
	select {
	case r := <-done:
		if bus.CodeOf(r.err) != bus.CodeUnavailable {
			t.Errorf("request of a scheduler gone: %v, want %s", r.err, bus.CodeUnavailable)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request of a scheduler gone still waits")
	}
}
