package cuda

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/troupe/troupe/gpu"
)

// ExchangeFunc gives every rank of a group the bytes every rank passes
// in, in rank order (this rank's own at its index). Every rank calls it
// the same number of times, in the same order; it fails when a rank does
// not take part before ctx ends.
type ExchangeFunc func(ctx context.Context, mine []byte) ([][]byte, error)

// NewIPCGroup makes d rank rank of a group of ranks ranks whose other
// ranks are GPUs of other processes of this host, each running
// NewIPCGroup with its own rank and the same ranks and cfg. It allocates
// this rank's window and pad, gives their IPC handles to the peers
// through exchange, maps the peers' (so kernels on d address them
// directly) and confirms, through exchange again, that every rank mapped
// every other. exchange is called exactly twice, also when this rank
// fails, so that every rank returns the same failure instead of waiting
// for the missing rank; a rank that does not arrive at all makes exchange,
// and so NewIPCGroup, fail at ctx's end.
//
// The group's collectives run only for rank rank from this process.
// Close releases this process's memory: the peers must be done with it.
func NewIPCGroup(ctx context.Context, d *Device, rank, ranks int, cfg GroupConfig, exchange ExchangeFunc) (*Group, error) {
	switch {
	case d == nil:
		return nil, fmt.Errorf("cuda: ipc group: device is nil")
	case exchange == nil:
		return nil, fmt.Errorf("cuda: ipc group: no exchange")
	case ranks < 2 || ranks > coMaxRanks:
		return nil, fmt.Errorf("cuda: ipc group: %d ranks, want 2 to %d", ranks, coMaxRanks)
	case rank < 0 || rank >= ranks:
		return nil, fmt.Errorf("cuda: ipc group: rank %d outside %d ranks", rank, ranks)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("cuda: ipc group: %w", err)
	}
	g := &Group{ranks: ranks, slotBytes: cfg.SlotBytes, blocks: min(coMaxBlocks, max(d.info.SMs, 1)),
		timeout: cfg.Timeout, ipc: true, local: make([]*groupRank, ranks)}
	fail := func(err error) (*Group, error) {
		g.Close()
		return nil, fmt.Errorf("cuda: ipc group: rank %d of %d: %w", rank, ranks, err)
	}
	host, _ := os.Hostname()
	me := ipcRank{Rank: rank, Ranks: ranks, SlotBytes: cfg.SlotBytes, SMs: d.info.SMs, Host: host}
	win, pad, err := g.allocRank(d)
	if err == nil {
		me.Win, err = d.ExportIPC(win)
	}
	if err == nil {
		me.Pad, err = d.ExportIPC(pad)
	}
	peers, err := exchangeStep(ctx, exchange, rank, ranks, me.encode(), err, decodeIPCRank)
	if err != nil {
		return fail(fmt.Errorf("publish the window: %w", err))
	}
	if err := g.checkPeers(d, me, peers); err != nil {
		// Every rank finds the same inconsistency, or its mirror image:
		// none goes on to map memory.
		return fail(err)
	}
	wins := make([]*Buffer, ranks)
	pads := make([]*Buffer, ranks)
	wins[rank], pads[rank] = win, pad
	for q, p := range peers {
		if q == rank {
			continue
		}
		if wins[q], err = d.ImportIPC(p.Win, gpu.I32); err == nil {
			g.mapped = append(g.mapped, wins[q])
			pads[q], err = d.ImportIPC(p.Pad, gpu.I32)
		}
		if err != nil {
			err = fmt.Errorf("map the window of %s: %w%s", p, err, p.hostHint(host))
			break
		}
		g.mapped = append(g.mapped, pads[q])
	}
	if _, err := exchangeStep(ctx, exchange, rank, ranks, []byte{ipcOK}, err, func([]byte) (struct{}, error) { return struct{}{}, nil }); err != nil {
		return fail(err)
	}
	for q := range ranks {
		if q != rank {
			g.blocks = min(g.blocks, max(peers[q].SMs, 1))
		}
	}
	g.local[rank] = &groupRank{dev: d, args: g.commArgs(rank, wins, pads)}
	return g, nil
}

// exchangeStep publishes mine, or local's text when local is not nil, and
// decodes every rank's answer: it fails with local's error, else with the
// first failure another rank reported, else with a malformed answer.
func exchangeStep[T any](ctx context.Context, exchange ExchangeFunc, rank, ranks int, mine []byte, local error, decode func([]byte) (T, error)) ([]T, error) {
	if local != nil {
		mine = append([]byte{ipcFailed}, local.Error()...)
	}
	all, err := exchange(ctx, mine)
	if err != nil {
		return nil, errors.Join(local, fmt.Errorf("exchange: %w", err))
	}
	if local != nil {
		return nil, local
	}
	if len(all) != ranks {
		return nil, fmt.Errorf("exchange: %d answers for %d ranks", len(all), ranks)
	}
	if !bytes.Equal(all[rank], mine) {
		return nil, fmt.Errorf("exchange: the answer of rank %d is not what this rank sent", rank)
	}
	out := make([]T, ranks)
	for q, b := range all {
		if len(b) > 0 && b[0] == ipcFailed {
			return nil, fmt.Errorf("rank %d failed: %s", q, b[1:])
		}
		if out[q], err = decode(b); err != nil {
			return nil, fmt.Errorf("rank %d: %w", q, err)
		}
	}
	return out, nil
}

// checkPeers checks that every rank describes the same group and that
// the peers are other processes with GPUs of their own.
func (g *Group) checkPeers(d *Device, me ipcRank, peers []ipcRank) error {
	pid := os.Getpid()
	for q, p := range peers {
		switch {
		case p.Rank != q:
			return fmt.Errorf("the exchange put %s at rank %d", p, q)
		case p.Ranks != me.Ranks:
			return fmt.Errorf("%s has %d ranks, this rank %d", p, p.Ranks, me.Ranks)
		case p.SlotBytes != me.SlotBytes:
			return fmt.Errorf("%s has %d-byte slots, this rank %d", p, p.SlotBytes, me.SlotBytes)
		case q == me.Rank:
			continue
		case p.Win.PID == pid:
			return fmt.Errorf("%s is in this process: join the GPUs of one process with NewGroup", p)
		case p.Win.GPU == d.info.UUID:
			return fmt.Errorf("%s and rank %d use the same GPU: every rank needs a GPU of its own", p, me.Rank)
		}
	}
	return nil
}

// ipcRank is what a rank of an IPC group tells its peers.
type ipcRank struct {
	Rank, Ranks int
	SlotBytes   int
	SMs         int
	Host        string
	Win, Pad    IPCHandle
}

// The first byte of what a rank publishes: a description (or, in the
// second step, success), or a failure followed by its text.
const (
	ipcOK     = 0
	ipcFailed = 1
)

func (r ipcRank) String() string {
	return fmt.Sprintf("rank %d (process %d on %q, %s)", r.Rank, r.Win.PID, r.Host, r.Win.GPU)
}

func (r ipcRank) hostHint(host string) string {
	if r.Host == host {
		return ""
	}
	return fmt.Sprintf(" (this process runs on %q: CUDA IPC needs every rank on one host)", host)
}

func (r ipcRank) encode() []byte {
	b := []byte{ipcOK}
	b = binary.LittleEndian.AppendUint32(b, uint32(r.Rank))
	b = binary.LittleEndian.AppendUint32(b, uint32(r.Ranks))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.SlotBytes))
	b = binary.LittleEndian.AppendUint32(b, uint32(r.SMs))
	host := r.Host[:min(len(r.Host), 255)]
	b = append(b, byte(len(host)))
	b = append(b, host...)
	w, _ := r.Win.MarshalBinary()
	p, _ := r.Pad.MarshalBinary()
	return append(append(b, w...), p...)
}

func decodeIPCRank(b []byte) (ipcRank, error) {
	var r ipcRank
	const fixed = 1 + 4 + 4 + 8 + 4 + 1
	if len(b) < fixed || b[0] != ipcOK {
		return r, fmt.Errorf("malformed group description (%d bytes)", len(b))
	}
	r.Rank = int(binary.LittleEndian.Uint32(b[1:]))
	r.Ranks = int(binary.LittleEndian.Uint32(b[5:]))
	slot := binary.LittleEndian.Uint64(b[9:])
	r.SMs = int(binary.LittleEndian.Uint32(b[17:]))
	n := int(b[21])
	b = b[fixed:]
	if len(b) != n+2*ipcWireBytes {
		return r, fmt.Errorf("malformed group description (%d bytes after the header, want %d)", len(b), n+2*ipcWireBytes)
	}
	if slot > 1<<40 || r.Rank > coMaxRanks || r.Ranks > coMaxRanks {
		return r, fmt.Errorf("group description out of range (rank %d of %d, %d-byte slots)", r.Rank, r.Ranks, slot)
	}
	r.SlotBytes = int(slot)
	r.Host = string(b[:n])
	if err := r.Win.UnmarshalBinary(b[n : n+ipcWireBytes]); err != nil {
		return r, err
	}
	if err := r.Pad.UnmarshalBinary(b[n+ipcWireBytes:]); err != nil {
		return r, err
	}
	return r, nil
}
