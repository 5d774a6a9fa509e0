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
	// Each panic restarted the actor (a fresh seq counter each time). The
	// last reply leaves Receive before the message is counted, so wait for
	// the count, then check it exactly.
	waitFor(t, "8 messages processed", func() bool { return ref.Stats().Processed >= 8 })
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
	ask := func(ctx context.Context, text string) <-chan error {
		errc := make(chan error, 1)
		go func() {
			_, err := Ask(ctx, ref, echoCall, echoReq{Text: text})
			errc <- err
		}()
		return errc
	}
	// One call in Receive (run by its caller: the actor was idle), whose
	// context carries the caller's deadline.
	deadline := time.Now().Add(time.Hour)
	dctx, dcancel := context.WithDeadline(context.Background(), deadline)
	defer dcancel()
	first := ask(dctx, "first")
	cctx := <-entered
	if d, ok := cctx.Deadline(); !ok || !d.Equal(deadline) {
		t.Errorf("call deadline %v %v, want %v", d, ok, deadline)
	}
	// One in the actor's hand, waiting its turn, and one in the mailbox
	// whose caller gives up.
	second := ask(context.Background(), "second")
	// Taken: counted, its send returned (no sender in flight, or the
	// count could be ahead of the channel), and the channel empty.
	waitFor(t, "the actor to take the second call", func() bool {
		mb := ref.p.mb
		return mb.puts.Load() == 1 && mb.inflight.Load() == 0 && ref.Stats().Depth == 0
	})
	gone, cancelGone := context.WithCancel(context.Background())
	queued := ask(gone, "queued")
	waitFor(t, "the mailbox to fill", func() bool { return ref.Stats().Depth == 1 })
	// The next finds the mailbox full.
	if _, err := Ask(context.Background(), ref, echoCall, echoReq{Text: "fourth"}); bus.CodeOf(err) != bus.CodeOverloaded {
		t.Errorf("full mailbox: got %v, want code overloaded", err)
	}
	cancelGone()
	if err := <-queued; bus.CodeOf(err) != bus.CodeCanceled || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller: got %v, want context.Canceled", err)
	}
	close(release)
	for _, c := range []<-chan error{first, second} {
		if err := <-c; err != nil {
			t.Error(err)
		}
	}
	<-entered // second
	<-entered // the abandoned call still ran, its context already done
	if err := ref.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := Ask(context.Background(), ref, echoCall, echoReq{Text: "late"}); bus.CodeOf(err) != bus.CodeUnavailable {
		t.Errorf("stopped actor: got %v, want code unavailable", err)
	}
	if st := ref.Stats(); st.Processed != 3 {
		t.Errorf("stats %+v, want 3 processed", st)
	}
}

// seqActor records the order of its messages.
type seqActor struct{ got *[]int }

func (a seqActor) Receive(_ context.Context, m int) error {
	*a.got = append(*a.got, m)
	return nil
}

// TestSendInlineKeepsOrder: messages run by their sender never overtake
// messages queued before them, by that sender or others, and the actor
// never runs two at once (the race detector watches its unlocked slice).
func TestSendInlineKeepsOrder(t *testing.T) {
	sys := testSystem(t, "n1", nil)
	var got []int
	ref, err := Spawn(context.Background(), sys, Props[int]{
		Kind: "seq", ID: "s", Mailbox: 8,
		New: func() Actor[int] { return seqActor{&got} },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 2000
	done := make(chan struct{})
	go func() { // another sender, queueing all the time
		defer close(done)
		for i := 0; i < n; i++ {
			if err := ref.Send(ctx, -1); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := 0; i < n; i++ {
		var err error
		if i%3 == 0 {
			err = ref.Send(ctx, i)
		} else {
			err = ref.SendInline(ctx, i)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	<-done
	if err := ref.Stop(ctx); err != nil { // drains
		t.Fatal(err)
	}
	next, others := 0, 0
	for _, m := range got {
		if m == -1 {
			others++
			continue
		}
		if m != next {
			t.Fatalf("got message %d when %d was due", m, next)
		}
		next++
	}
	if next != n || others != n {
		t.Errorf("received %d and %d messages, want %d each", next, others, n)
	}
}

// TestInlinePanicEscalates: panics in Receive run by the sender restart
// the actor, and past the limit it stops as failed.
func TestInlinePanicEscalates(t *testing.T) {
	sys := testSystem(t, "n1", nil)
	ref, err := Spawn(context.Background(), sys, echoProps("p"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < DefaultMaxRestarts; i++ {
		if _, err := Ask(ctx, ref, echoCall, echoReq{Text: "panic"}); bus.CodeOf(err) != bus.CodeInternal {
			t.Fatalf("panic %d: got %v, want code internal", i, err)
		}
	}
	if r, err := Ask(ctx, ref, echoCall, echoReq{Text: "ok"}); err != nil || r.Seq != 1 {
		t.Fatalf("after %d restarts: %+v, %v; want a fresh instance's answer", DefaultMaxRestarts, r, err)
	}
	if _, err := Ask(ctx, ref, echoCall, echoReq{Text: "panic"}); bus.CodeOf(err) != bus.CodeInternal {
		t.Fatalf("escalating panic: got %v", err)
	}
	<-ref.Done()
	if st := ref.Stats(); st.Status != StatusFailed || st.Restarts != DefaultMaxRestarts {
		t.Errorf("stats %+v, want failed after %d restarts", st, DefaultMaxRestarts)
	}
	if _, err := Ask(ctx, ref, echoCall, echoReq{Text: "late"}); bus.CodeOf(err) != bus.CodeUnavailable {
		t.Errorf("failed actor: got %v, want code unavailable", err)
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
