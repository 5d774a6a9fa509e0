package xgmi

import (
	"context"
	"errors"
	"fmt"
)

// Fabric joins the ranks of one communicator. Every rank owns a window: a
// region of its own memory, the same size on every rank, that its peers
// address directly, plus a few signal words. The collectives of a Comm are
// built from two things only: peers reading (or writing) windows in place,
// and ranks posting and awaiting monotonically increasing sequence numbers
// in signal words.
//
// Fabric is what every backend provides; how a rank reaches a window is a
// capability found by type assertion. HostMemory is the one implemented:
// windows the CPU addresses (the host fabric, where ranks are goroutines of
// one process). A CUDA fabric gives each GPU a window in its own memory,
// mapped into its peers by peer access (or by IPC handles that the owning
// actors exchange when the ranks live in different processes), with the
// signal words in device memory so that kernels, not the host, wait on
// them; AMD's XGMI is the same shape through HIP.
type Fabric interface {
	// Ranks is the number of ranks.
	Ranks() int
	// WindowBytes is the size of each rank's window.
	WindowBytes() int
	// Link says how rank a reaches rank b's window.
	Link(a, b int) Link
	// Close releases the windows; waits in progress fail.
	Close() error
}

// Signal slots: each rank has one sequence word per slot.
const (
	slotReady   = iota // the rank's window holds its input for the step
	slotReduced        // the rank's reduced segment is in its window (two-shot)
	slotDone           // the rank has finished reading its peers' windows
	numSlots
)

// HostMemory is a fabric whose windows and signal words the CPU addresses.
//
// Window(r) is rank r's window as every rank sees it. Post publishes seq in
// rank r's signal slot (a release: writes to r's window before Post are
// visible to a rank whose Wait sees seq); Wait blocks until rank r's slot
// holds seq or more (an acquire), ctx ends, or the fabric is aborted.
// Sequence numbers in a slot only grow. Abort makes every Wait in progress
// and to come fail with an error wrapping ErrAborted and err.
type HostMemory interface {
	Fabric
	Window(rank int) []byte
	Post(rank, slot int, seq uint64)
	Wait(ctx context.Context, rank, slot int, seq uint64) error
	Abort(err error)
}

// ErrAborted is wrapped by the errors of collectives on an aborted fabric:
// a rank failed or gave up mid-collective, so the others cannot complete.
var ErrAborted = errors.New("xgmi: communicator aborted")

// ErrClosed is returned by waits on a closed fabric.
var ErrClosed = errors.New("xgmi: fabric closed")

// LinkKind is how one rank reaches another's memory.
type LinkKind uint8

// Link kinds.
const (
	// LinkNone: no direct path; copies are staged through host memory.
	LinkNone LinkKind = iota
	// LinkSelf: the rank's own memory.
	LinkSelf
	// LinkHost: both ranks address the same host memory (one process).
	LinkHost
	// LinkPeer: GPU peer access, over NVLink or PCIe (the CUDA driver
	// reports only that access works, not over which wire).
	LinkPeer
	// LinkNVLink: GPU peer access over NVLink.
	LinkNVLink
	// LinkPCIe: GPU peer access over PCIe.
	LinkPCIe
	// LinkXGMI: AMD GPU peer access over XGMI (Infinity Fabric).
	LinkXGMI
)

func (k LinkKind) String() string {
	switch k {
	case LinkNone:
		return "none"
	case LinkSelf:
		return "self"
	case LinkHost:
		return "host"
	case LinkPeer:
		return "peer"
	case LinkNVLink:
		return "nvlink"
	case LinkPCIe:
		return "pcie"
	case LinkXGMI:
		return "xgmi"
	}
	return fmt.Sprintf("link(%d)", uint8(k))
}

// Direct reports whether a rank can address the other's memory in place.
func (k LinkKind) Direct() bool { return k != LinkNone }

// Link is the path from rank A to rank B's memory.
type Link struct {
	A, B int
	Kind LinkKind
}
