package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestClusterStandby runs a replica group that two hosts may schedule
// (--group) on three hosts (network namespaces): placements h0,h2 and
// h1,h2, and host 2 serving through the bus. One of hosts 0 and 1 takes
// the group; the test SIGKILLs it, and the other takes the group over,
// with the placement through the dead host down and the other's stages
// found running; requests through host 2 give the reference text before
// and after. The leader scaled to two replicas first: the new one runs
// two. A request streaming across the kill ends with an error at once; one
// sent during the takeover waits for it. The killed host, restarted,
// stands by, and takes the group over when the new leader stops, which
// finishes the requests it runs first: none is lost.
func TestClusterStandby(t *testing.T) {
	lab := newNetnsLab(t, 3)
	bin := buildTroupe(t)
	group := []string{"--placement", "h0,h2;h1,h2", "--group", "g"}
	procs := []*proc{
		lab.start(bin, 0, lab.nodeArgs(0, group...)...),
		lab.start(bin, 1, lab.nodeArgs(1, group...)...),
		lab.start(bin, 2, lab.nodeArgs(2, "--replicas", "0")...),
	}
	url := "http://" + lab.ip(2) + ":8080"
	began := time.Now()
	waitReady(t, url)
	// holder is the node that holds group g's key, as host 2's cluster
	// view shows it.
	holder := func() string {
		for _, a := range clusterOf(t, url).Actors {
			if a.Kind == groupKind && a.ID == "g" && a.Alive {
				return a.Node
			}
		}
		return ""
	}
	var leader string
	waitUntil(t, "a host scheduling group g", 90*time.Second, func() bool {
		leader = holder()
		return leader != ""
	})
	t.Logf("%s schedules group g, %v after the start", leader, time.Since(began).Round(time.Millisecond))
	l := int(leader[1] - '0')
	other := 1 - l
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ref := demoRefs(t)[0]
	check := func(when string) {
		t.Helper()
		var got string
		var err error
		// The first requests after a change may find no scheduler yet.
		waitUntil(t, "a completion "+when, 30*time.Second, func() bool {
			got, err = completion(ctx, url, ref.Prompt, len(ref.GreedyIDs), nil)
			return err == nil
		})
		if got != ref.Text {
			t.Errorf("%s: got %q, want %q", when, got, ref.Text)
		}
	}
	check("through host 2")
	waitUntil(t, fmt.Sprintf("the leader h%d scheduling", l), 10*time.Second, func() bool {
		return strings.Contains(procs[l].log(), fmt.Sprintf("node h%d: schedules group g", l))
	})
	if strings.Contains(procs[other].log(), "schedules group g") {
		t.Fatalf("both hosts scheduled group g:\n%s", procs[other].log())
	}

	// The leader runs two replicas of the group; the standby learns it from
	// the group's key and takes both over.
	const two = "2 replicas of 2 stages, placements h0,h2;h1,h2"
	if got := scaleCLI(t, "http://"+lab.ip(l)+":8080", "--replicas", "2"); got != two {
		t.Fatalf("scaling the group: got %q, want %q", got, two)
	}
	waitUntil(t, "the group's key saying two replicas", 30*time.Second, func() bool {
		for _, a := range clusterOf(t, url).Actors {
			if a.Kind == groupKind && a.ID == "g" && a.State == two {
				return true
			}
		}
		return false
	})
	// A standby reads the key every quarter of the registry's TTL (1.25 s):
	// give it two reads of the new shape before the leader dies.
	time.Sleep(3 * time.Second)

	// A request streaming through host 2 when the leader dies ends with an
	// error soon after, rather than waiting for frames that never come.
	_, killed, err := signalMidStream(t, ctx, url, ref.Prompt, 1000, procs[l], syscall.SIGKILL)
	if err == nil || !strings.Contains(err.Error(), "scheduler") {
		t.Errorf("the request across the leader's death: %v, want an error naming the scheduler", err)
	}
	t.Logf("the request across the kill ended %v after it: %v", time.Since(killed).Round(100*time.Millisecond), err)
	<-procs[l].done
	// A request sent while no node schedules the group waits for the
	// standby to take it over.
	sent := time.Now()
	if got, err := completion(ctx, url, ref.Prompt, len(ref.GreedyIDs), nil); err != nil || got != ref.Text {
		t.Errorf("a request sent during the takeover: %q, %v; want %q", got, err, ref.Text)
	}
	t.Logf("a request sent %v after the kill was served after %v", sent.Sub(killed).Round(100*time.Millisecond), time.Since(sent).Round(100*time.Millisecond))
	want := fmt.Sprintf("h%d", other)
	waitUntil(t, "the standby taking the group over", 60*time.Second, func() bool { return holder() == want })
	t.Logf("h%d took group g over %v after the kill", other, time.Since(killed).Round(100*time.Millisecond))
	check("after the takeover")
	log := procs[other].log()
	for _, w := range []string{
		fmt.Sprintf("node %s: takes group g over from h%d: %s", want, l, two),
		fmt.Sprintf("node %s: schedules group g", want),
		fmt.Sprintf("replica g-r0: placement h%d,h2 starts down", l),
		fmt.Sprintf("replica g-r1: placement h%d,h2 starts down", l),
	} {
		if !strings.Contains(log, w) {
			t.Errorf("the new leader's log lacks %q:\n%s", w, log)
		}
	}
	// The surviving placements' stages were the old leader's, found running.
	for r := range 2 {
		if n := strings.Count(procs[2].log(), fmt.Sprintf("shard g-r%d-p%d-s1 runs layers", r, other)); n != 1 {
			t.Errorf("host 2 started replica %d's surviving stage %d times, want once:\n%s", r, n, procs[2].log())
		}
	}
	if got := scaleCLI(t, "http://"+lab.ip(other)+":8080"); got != two {
		t.Errorf("the new leader runs %q, want %q", got, two)
	}

	// The killed host comes back and stands by.
	procs[l] = lab.start(bin, l, lab.nodeArgs(l, group...)...)
	waitReady(t, "http://"+lab.ip(l)+":8080")
	check("with the restarted host standing by")
	if h := holder(); h != want {
		t.Errorf("group g held by %q after the restart, want %s", h, want)
	}
	if strings.Contains(procs[l].log(), "schedules group g") {
		t.Errorf("the restarted host took group g from a live leader:\n%s", procs[l].log())
	}
	// Only the scheduling host changes the group.
	if _, _, err := runCLI(t, "", "scale", "--server", "http://"+lab.ip(l)+":8080", "--replicas", "2"); err == nil || !strings.Contains(err.Error(), "stands by for group g") {
		t.Errorf("scaling through the standby: %v, want it refused", err)
	}

	// The leader stops (SIGTERM): it finishes the request streaming through
	// host 2, then gives the key up, and the restarted host takes the group
	// over while the stopped one leaves the cluster. A request sent during
	// the hand-over waits for it.
	got, termed, err := signalMidStream(t, ctx, url, ref.Prompt, 200, procs[other], syscall.SIGTERM)
	if err != nil || !strings.HasPrefix(got, ref.Text) {
		t.Errorf("the request across the leader's SIGTERM: %q, %v; want it whole, from %q", got, err, ref.Text)
	}
	t.Logf("the request across the SIGTERM ended %v after it", time.Since(termed).Round(100*time.Millisecond))
	sent = time.Now()
	if got, err := completion(ctx, url, ref.Prompt, len(ref.GreedyIDs), nil); err != nil || got != ref.Text {
		t.Errorf("a request sent during the hand-over: %q, %v; want %q", got, err, ref.Text)
	}
	t.Logf("a request sent %v after the SIGTERM was served after %v", sent.Sub(termed).Round(100*time.Millisecond), time.Since(sent).Round(100*time.Millisecond))
	<-procs[other].done
	back := fmt.Sprintf("h%d", l)
	waitUntil(t, "the restarted host taking the group over", 60*time.Second, func() bool { return holder() == back })
	t.Logf("h%d took group g over %v after h%d was asked to stop", l, time.Since(termed).Round(100*time.Millisecond), other)
	check("after the leader stopped")
	time.Sleep(2 * time.Second) // past the stopped node's departure from the registry's peers
	check("a while after the leader stopped")
	if log := procs[other].log(); !strings.Contains(log, fmt.Sprintf("node %s: no longer schedules group g", want)) {
		t.Errorf("the stopped leader's log lacks its step-down:\n%s", log)
	}
}

// signalMidStream streams a completion of max tokens through url and
// sends p sig after its fifth chunk; it returns the text, when the signal
// went and the request's error.
func signalMidStream(t *testing.T, ctx context.Context, url, prompt string, max int, p *proc, sig syscall.Signal) (string, time.Time, error) {
	t.Helper()
	var at time.Time
	got, err := completion(ctx, url, prompt, max, func(n int) {
		if n == 5 {
			p.cmd.Process.Signal(sig)
			at = time.Now()
		}
	})
	if at.IsZero() {
		t.Fatalf("the stream ended before the %v: %v", sig, err)
	}
	return got, at, err
}
