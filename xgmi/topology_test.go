package xgmi

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestProbeHostFabric(t *testing.T) {
	f, err := NewHostFabric(HostFabricConfig{Ranks: 3, WindowBytes: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	top := ProbeFabric("host", f)
	if len(top.Devices) != 3 || len(top.Links) != 6 {
		t.Fatalf("got %d devices and %d links, want 3 and 6", len(top.Devices), len(top.Links))
	}
	for _, l := range top.Links {
		if l.Kind != LinkHost {
			t.Errorf("link %d -> %d: got %s, want host", l.A, l.B, l.Kind)
		}
	}
	if got := top.Link(1, 1).Kind; got != LinkSelf {
		t.Errorf("link 1 -> 1: got %s, want self", got)
	}
	if !top.Connected() {
		t.Error("host fabric: not connected")
	}
	var sb strings.Builder
	if err := top.Write(&sb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"fabric host: 3 ranks", "self", "host", "every rank reaches every other directly"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("printed topology lacks %q:\n%s", want, sb.String())
		}
	}
}

// fakePeers is a machine of GPUs where access[a][b] says whether a reaches b.
type fakePeers struct {
	access [][]bool
	fail   [2]int // a pair whose query fails; {-1, -1} for none
}

func (p fakePeers) Count() int        { return len(p.access) }
func (p fakePeers) Name(i int) string { return fmt.Sprintf("gpu %d", i) }
func (p fakePeers) CanAccessPeer(a, b int) (bool, error) {
	if a == p.fail[0] && b == p.fail[1] {
		return false, errors.New("driver error")
	}
	return p.access[a][b], nil
}

// nvlinked also names the wire: NVLink within pairs {0,1} and {2,3}, PCIe
// across.
type nvlinked struct{ fakePeers }

func (nvlinked) PeerLink(a, b int) (LinkKind, error) {
	if a/2 == b/2 {
		return LinkNVLink, nil
	}
	return LinkPCIe, nil
}

func TestProbePeers(t *testing.T) {
	all := [][]bool{{true, true, true, true}, {true, true, true, true}, {true, true, true, true}, {true, true, true, true}}
	split := [][]bool{{true, true, false}, {true, true, false}, {false, false, true}}
	cases := []struct {
		name      string
		peers     Peers
		links     map[[2]int]LinkKind
		connected bool
	}{
		{"all peers", fakePeers{access: all, fail: [2]int{-1, -1}}, map[[2]int]LinkKind{{0, 3}: LinkPeer, {3, 0}: LinkPeer}, true},
		{"two islands", fakePeers{access: split, fail: [2]int{-1, -1}}, map[[2]int]LinkKind{{0, 1}: LinkPeer, {0, 2}: LinkNone, {2, 1}: LinkNone}, false},
		{"classified", nvlinked{fakePeers{access: all, fail: [2]int{-1, -1}}}, map[[2]int]LinkKind{{0, 1}: LinkNVLink, {1, 2}: LinkPCIe, {3, 2}: LinkNVLink}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			top, err := ProbePeers("cuda", tc.peers)
			if err != nil {
				t.Fatal(err)
			}
			for pair, want := range tc.links {
				if got := top.Link(pair[0], pair[1]).Kind; got != want {
					t.Errorf("link %d -> %d: got %s, want %s", pair[0], pair[1], got, want)
				}
			}
			if got := top.Connected(); got != tc.connected {
				t.Errorf("connected: got %v, want %v", got, tc.connected)
			}
		})
	}
	if _, err := ProbePeers("cuda", fakePeers{access: all, fail: [2]int{2, 1}}); err == nil || !strings.Contains(err.Error(), "2 -> 1") {
		t.Errorf("failing query: got %v, want an error naming 2 -> 1", err)
	}
}

func TestWriteNoDevices(t *testing.T) {
	var sb strings.Builder
	if err := (Topology{Fabric: "cuda", Note: "no GPUs: no driver"}).Write(&sb); err != nil {
		t.Fatal(err)
	}
	if got, want := sb.String(), "fabric cuda: no GPUs: no driver\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestLinkKindNames(t *testing.T) {
	seen := map[string]bool{}
	for k := LinkNone; k <= LinkXGMI; k++ {
		s := k.String()
		if seen[s] || strings.HasPrefix(s, "link(") {
			t.Errorf("kind %d: name %q is missing or repeated", k, s)
		}
		seen[s] = true
	}
	if LinkNone.Direct() || !LinkPeer.Direct() {
		t.Error("Direct: none must be indirect, peer direct")
	}
}
