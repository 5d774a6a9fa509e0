package actors

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/troupe/troupe/bus"
)

func echoCall(c echoMsg) echoMsg { return c }

// TestAskAnswersLikeTheBus: Ask reaches the same Receive as the endpoint,
// and replies, failures and panics come back with the bus path's codes.
func TestAskAnswersLikeTheBus(t *testing.T) {
	_, nc := testBus(t, "n1")
	sys := testSystem(t, "n1", nc)
	ref, err := Spawn(context.Background(), sys, echoProps("e1"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	subj := sys.Subjects().ActorEndpoint("echo", "e1", "echo")
	for _, tc := range []struct {
		text string
		code bus.Code
	}{{"hi", ""}, {"fail", bus.CodeConflict}, {"panic", bus.CodeInternal}, {"after", ""}} {
		t.Run(tc.text, func(t *testing.T) {
			local, lerr := Ask(ctx, ref, echoCall, echoReq{Text: tc.text})
			remote, rerr := bus.Request[echoReq, echoResp](ctx, nc, subj, echoReq{Text: tc.text})
			if got, want := bus.CodeOf(lerr), bus.CodeOf(rerr); got != want || got != tc.code {
				t.Fatalf("codes: Ask %q (%v), bus %q (%v), want %q", got, lerr, want, rerr, tc.code)
			}
			if lerr != nil {
				if got, want := lerr.Error(), rerr.Error(); got != want {
					t.Errorf("Ask error %q, bus error %q", got, want)
				}
				return
			}
			// The bus request was received right after Ask's.
			if local.Text != tc.text || remote.Seq != local.Seq+1 {
				t.Errorf("Ask %+v then bus %+v, want the same text and consecutive seqs", local, remote)
			}
		})
	}
	// Each panic restarted the actor (a fresh seq counter each time).
	if st := ref.Stats(); st.Restarts != 2 || st.Processed != 8 {
		t.Errorf("stats %+v, want 2 restarts and 8 processed", st)
	}
}

// blocker holds each call until release is closed, after telling entered.
type blocker struct {
	entered chan<- context.Context
	release <-chan struct{}
}

func (b blocker) Receive(_ context.Context, c echoMsg) error {
	b.entered <- c.Context()
	select {
	case <-b.release:
	case <-c.Context().Done():
	}
	return c.Reply(echoResp{Text: c.Req.Text})
}

func TestAskBackpressureDeadlineAndStop(t *testing.T) {
	sys := testSystem(t, "n1", nil)
	entered := make(chan context.Context, 4)
	release := make(chan struct{})
	ref, err := Spawn(context.Background(), sys, Props[echoMsg]{
		Kind: "block", ID: "b", Mailbox: 1,
		New: func() Actor[echoMsg] { return blocker{entered, release} },
	})
	if err != nil {
		t.Fatal(err)
	}
	// One call in Receive, whose context carries the caller's deadline.
	deadline := time.Now().Add(time.Hour)
	dctx, dcancel := context.WithDeadline(context.Background(), deadline)
	defer dcancel()
	first := make(chan error, 1)
	go func() {
		_, err := Ask(dctx, ref, echoCall, echoReq{Text: "first"})
		first <- err
	}()
	cctx := <-entered
	if d, ok := cctx.Deadline(); !ok || !d.Equal(deadline) {
		t.Errorf("call deadline %v %v, want %v", d, ok, deadline)
	}
	// One queued behind it; its caller gives up: deadline.
	gone, cancelGone := context.WithCancel(context.Background())
	queued := make(chan error, 1)
	go func() {
		_, err := Ask(gone, ref, echoCall, echoReq{Text: "queued"})
		queued <- err
	}()
	waitFor(t, "the mailbox to fill", func() bool { return ref.Stats().Depth == 1 })
	// The next finds the mailbox full.
	if _, err := Ask(context.Background(), ref, echoCall, echoReq{Text: "third"}); bus.CodeOf(err) != bus.CodeOverloaded {
		t.Errorf("full mailbox: got %v, want code overloaded", err)
	}
	cancelGone()
	if err := <-queued; bus.CodeOf(err) != bus.CodeCanceled || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller: got %v, want context.Canceled", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Errorf("first: %v", err)
	}
	<-entered // the abandoned call still ran, its context already done
	if err := ref.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := Ask(context.Background(), ref, echoCall, echoReq{Text: "late"}); bus.CodeOf(err) != bus.CodeUnavailable {
		t.Errorf("stopped actor: got %v, want code unavailable", err)
	}
}

// BenchmarkAskThroughActor is BenchmarkRequestThroughActor's round trip
// without the bus: mailbox, Receive, answer on a channel.
func BenchmarkAskThroughActor(b *testing.B) {
	sys := testSystem(b, "n1", nil)
	ref, err := Spawn(context.Background(), sys, echoProps("b1"))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Ask(ctx, ref, echoCall, echoReq{Text: "t"}); err != nil {
			b.Fatal(err)
		}
	}
}
