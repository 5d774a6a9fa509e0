package xgmi

import (
	"fmt"
	"io"
	"strings"
)

// Topology is what a probe found: the devices that could be ranks and how
// each ordered pair reaches the other's memory.
type Topology struct {
	// Fabric names the kind of fabric probed: "host" or "cuda".
	Fabric string
	// Devices names each rank's device, in rank order.
	Devices []string
	// Links holds one entry per ordered pair (a, b), a != b, a-major.
	Links []Link
	// Note says why the topology is empty, or anything else a reader of
	// the probe needs; "" when there is nothing to add.
	Note string
}

// Link returns how a reaches b.
func (t Topology) Link(a, b int) Link {
	if a == b {
		return Link{A: a, B: b, Kind: LinkSelf}
	}
	for _, l := range t.Links {
		if l.A == a && l.B == b {
			return l
		}
	}
	return Link{A: a, B: b, Kind: LinkNone}
}

// Connected reports whether every rank addresses every other directly,
// which the collectives of a Comm need.
func (t Topology) Connected() bool {
	for a := range t.Devices {
		for b := range t.Devices {
			if !t.Link(a, b).Kind.Direct() {
				return false
			}
		}
	}
	return true
}

// ProbeFabric describes an existing fabric.
func ProbeFabric(name string, f Fabric) Topology {
	t := Topology{Fabric: name}
	n := f.Ranks()
	for r := range n {
		t.Devices = append(t.Devices, fmt.Sprintf("rank %d", r))
	}
	for a := range n {
		for b := range n {
			if a != b {
				t.Links = append(t.Links, f.Link(a, b))
			}
		}
	}
	return t
}

// Peers is what a probe needs from a set of GPUs (CUDA now, HIP later):
// gpu/cuda's devices answer it through a small adapter in the command.
type Peers interface {
	// Count is the number of devices.
	Count() int
	// Name describes device i.
	Name(i int) string
	// CanAccessPeer reports whether device a can address b's memory.
	CanAccessPeer(a, b int) (bool, error)
}

// PeerClassifier is an optional capability of Peers that knows the wire
// of a peer link (NVLink, PCIe, XGMI), e.g. from NVML or the HIP runtime.
type PeerClassifier interface {
	PeerLink(a, b int) (LinkKind, error)
}

// ProbePeers asks p about every ordered pair of its devices: pairs with
// peer access are LinkPeer (or the wire a PeerClassifier names), the others
// LinkNone.
func ProbePeers(fabric string, p Peers) (Topology, error) {
	t := Topology{Fabric: fabric}
	n := p.Count()
	for i := range n {
		t.Devices = append(t.Devices, p.Name(i))
	}
	cl, _ := p.(PeerClassifier)
	for a := range n {
		for b := range n {
			if a == b {
				continue
			}
			ok, err := p.CanAccessPeer(a, b)
			if err != nil {
				return t, fmt.Errorf("xgmi: probe %s %d -> %d: %w", fabric, a, b, err)
			}
			kind := LinkNone
			if ok {
				kind = LinkPeer
				if cl != nil {
					if kind, err = cl.PeerLink(a, b); err != nil {
						return t, fmt.Errorf("xgmi: probe %s link %d -> %d: %w", fabric, a, b, err)
					}
				}
			}
			t.Links = append(t.Links, Link{A: a, B: b, Kind: kind})
		}
	}
	return t, nil
}

// Write prints t as a matrix of link kinds, rows reaching columns.
func (t Topology) Write(w io.Writer) error {
	var sb strings.Builder
	switch {
	case len(t.Devices) == 0 && t.Note != "":
		fmt.Fprintf(&sb, "fabric %s: %s", t.Fabric, t.Note)
	case t.Note != "":
		fmt.Fprintf(&sb, "fabric %s: %d ranks (%s)", t.Fabric, len(t.Devices), t.Note)
	default:
		fmt.Fprintf(&sb, "fabric %s: %d ranks", t.Fabric, len(t.Devices))
	}
	sb.WriteString("\n")
	for i, d := range t.Devices {
		fmt.Fprintf(&sb, "  %d: %s\n", i, d)
	}
	if len(t.Devices) > 0 {
		sb.WriteString("      ")
		for b := range t.Devices {
			fmt.Fprintf(&sb, " %7d", b)
		}
		sb.WriteString("\n")
		for a := range t.Devices {
			fmt.Fprintf(&sb, "  %3d ", a)
			for b := range t.Devices {
				fmt.Fprintf(&sb, " %7s", t.Link(a, b).Kind)
			}
			sb.WriteString("\n")
		}
		if t.Connected() {
			sb.WriteString("  every rank reaches every other directly\n")
		} else {
			sb.WriteString("  some pairs have no direct path (none): their copies go through host memory\n")
		}
	}
	_, err := io.WriteString(w, sb.String())
	return err
}
