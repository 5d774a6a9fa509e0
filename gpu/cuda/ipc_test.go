package cuda

import (
	"bytes"
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/troupe/troupe/gpu"
)

func testHandle(seed byte) IPCHandle {
	h := IPCHandle{Offset: 4096, Bytes: 1 << 20, PID: 4242}
	for i := range h.Mem {
		h.Mem[i] = seed + byte(i)
	}
	for i := range h.GPU {
		h.GPU[i] = 0xa0 + byte(i)
	}
	return h
}

// TestIPCHandleWire: a handle survives its encoding, and what is not one
// is refused.
func TestIPCHandleWire(t *testing.T) {
	h := testHandle(7)
	b, err := h.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got IPCHandle
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if got != h {
		t.Fatalf("got %+v, want %+v", got, h)
	}
	bad := map[string][]byte{
		"short":   b[:len(b)-1],
		"long":    append(append([]byte{}, b...), 0),
		"magic":   append([]byte{'x'}, b[1:]...),
		"version": append(append([]byte{}, b[:3]...), append([]byte{9}, b[4:]...)...),
	}
	for name, raw := range bad {
		if err := new(IPCHandle).UnmarshalBinary(raw); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if s := h.GPU.String(); s != "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf" {
		t.Errorf("UUID = %s", s)
	}
}

// TestIPCOpenArgs: the 64-byte handle goes by value, as the platform's C
// calling convention passes it.
func TestIPCOpenArgs(t *testing.T) {
	h := testHandle(1)
	args := ipcOpenArgs(0x1000, &h.Mem, ipcLazyPeerAccess)
	if runtime.GOARCH == "arm64" {
		if len(args) != 3 || args[0] != 0x1000 || args[2] != ipcLazyPeerAccess {
			t.Fatalf("arm64 args %x", args)
		}
		return
	}
	if len(args) != 6+IPCHandleBytes/8 || args[0] != 0x1000 || args[1] != ipcLazyPeerAccess {
		t.Fatalf("args %x", args)
	}
	if runtime.GOARCH != "amd64" {
		return
	}
	var stack []byte
	for _, a := range args[6:] {
		for i := range 8 {
			stack = append(stack, byte(a>>(8*i)))
		}
	}
	if !bytes.Equal(stack, h.Mem[:]) {
		t.Fatalf("stack words %x, want the handle %x", stack, h.Mem)
	}
}

func testRank(rank, ranks int) ipcRank {
	r := ipcRank{Rank: rank, Ranks: ranks, SlotBytes: 1 << 20, SMs: 132, Host: "gpu-host", Win: testHandle(byte(rank)), Pad: testHandle(byte(100 + rank))}
	r.Win.PID, r.Pad.PID = 1000+rank, 1000+rank
	r.Win.GPU[0], r.Pad.GPU[0] = byte(rank), byte(rank)
	return r
}

func TestIPCRankWire(t *testing.T) {
	r := testRank(1, 2)
	got, err := decodeIPCRank(r.encode())
	if err != nil {
		t.Fatal(err)
	}
	if got != r {
		t.Fatalf("got %+v, want %+v", got, r)
	}
	b := r.encode()
	for _, bad := range [][]byte{nil, b[:10], b[:len(b)-1], append([]byte{ipcFailed}, b[1:]...)} {
		if _, err := decodeIPCRank(bad); err == nil {
			t.Errorf("decode of %d bytes: no error", len(bad))
		}
	}
}

func FuzzDecodeIPCRank(f *testing.F) {
	f.Add(testRank(0, 2).encode())
	f.Add([]byte{ipcOK, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeIPCRank(b)
		if err != nil {
			return
		}
		if got := r.encode(); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x, decoded from %x", got, b)
		}
	})
}

// TestIPCCheckPeers: the ranks must describe one group of distinct
// processes and GPUs.
func TestIPCCheckPeers(t *testing.T) {
	d := &Device{}
	d.info.UUID[0] = 0 // rank 0's GPU
	g := &Group{}
	good := []ipcRank{testRank(0, 2), testRank(1, 2)}
	if err := g.checkPeers(d, good[0], good); err != nil {
		t.Fatalf("a good group: %v", err)
	}
	for name, c := range map[string]struct {
		edit func(p []ipcRank)
		want string
	}{
		"order":   {func(p []ipcRank) { p[1].Rank = 0 }, "at rank 1"},
		"ranks":   {func(p []ipcRank) { p[1].Ranks = 3 }, "has 3 ranks"},
		"slots":   {func(p []ipcRank) { p[1].SlotBytes = 4096 }, "4096-byte slots"},
		"process": {func(p []ipcRank) { p[1].Win.PID = os.Getpid() }, "is in this process"},
		"gpu":     {func(p []ipcRank) { p[1].Win.GPU = d.info.UUID }, "use the same GPU"},
	} {
		peers := append([]ipcRank{}, good...)
		c.edit(peers)
		if err := g.checkPeers(d, good[0], peers); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

// TestIPCExchangeStep: a rank that fails publishes its failure, and every
// rank returns it instead of going on.
func TestIPCExchangeStep(t *testing.T) {
	ctx := context.Background()
	decode := func(b []byte) (string, error) { return string(b), nil }
	echo := func(others ...[]byte) ExchangeFunc {
		return func(_ context.Context, mine []byte) ([][]byte, error) {
			return append([][]byte{mine}, others...), nil
		}
	}
	got, err := exchangeStep(ctx, echo([]byte("b")), 0, 2, []byte("a"), nil, decode)
	if err != nil || len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("got %q, %v", got, err)
	}
	failed := append([]byte{ipcFailed}, "out of memory"...)
	if _, err := exchangeStep(ctx, echo(failed), 0, 2, []byte("a"), nil, decode); err == nil || err.Error() != "rank 1 failed: out of memory" {
		t.Errorf("peer failure: %v", err)
	}
	var sent []byte
	ex := func(_ context.Context, mine []byte) ([][]byte, error) {
		sent = mine
		return [][]byte{mine, []byte("b")}, nil
	}
	local := errors.New("no memory here")
	if _, err := exchangeStep(ctx, ex, 0, 2, []byte("a"), local, decode); !errors.Is(err, local) {
		t.Errorf("local failure: %v", err)
	}
	if want := append([]byte{ipcFailed}, "no memory here"...); !bytes.Equal(sent, want) {
		t.Errorf("published %q, want the failure", sent)
	}
	if _, err := exchangeStep(ctx, echo(), 0, 2, []byte("a"), nil, decode); err == nil || !strings.Contains(err.Error(), "1 answers for 2 ranks") {
		t.Errorf("short answer: %v", err)
	}
	lie := func(_ context.Context, _ []byte) ([][]byte, error) { return [][]byte{[]byte("z"), []byte("b")}, nil }
	if _, err := exchangeStep(ctx, lie, 0, 2, []byte("a"), nil, decode); err == nil || !strings.Contains(err.Error(), "not what this rank sent") {
		t.Errorf("wrong echo: %v", err)
	}
	gone := errors.New("rank 1 did not arrive")
	noshow := func(context.Context, []byte) ([][]byte, error) { return nil, gone }
	if _, err := exchangeStep(ctx, noshow, 0, 2, []byte("a"), nil, decode); !errors.Is(err, gone) {
		t.Errorf("exchange failure: %v", err)
	}
}

// TestIPCArguments: what cannot work is refused before a GPU is touched.
func TestIPCArguments(t *testing.T) {
	ctx := context.Background()
	d := &Device{}
	ex := func(context.Context, []byte) ([][]byte, error) { return nil, errors.New("unreachable") }
	for _, c := range []struct {
		d           *Device
		rank, ranks int
		cfg         GroupConfig
		ex          ExchangeFunc
		want        string
	}{
		{nil, 0, 2, GroupConfig{}, ex, "device is nil"},
		{d, 0, 2, GroupConfig{}, nil, "no exchange"},
		{d, 0, 1, GroupConfig{}, ex, "1 ranks"},
		{d, 0, 9, GroupConfig{}, ex, "9 ranks"},
		{d, 2, 2, GroupConfig{}, ex, "rank 2 outside"},
		{d, 0, 2, GroupConfig{SlotBytes: 24}, ex, "multiple of 16"},
	} {
		if _, err := NewIPCGroup(ctx, c.d, c.rank, c.ranks, c.cfg, c.ex); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewIPCGroup(rank %d of %d, %+v): %v, want %q", c.rank, c.ranks, c.cfg, err, c.want)
		}
	}
	h := testHandle(0)
	h.PID = os.Getpid()
	if _, err := d.importIPC(h, gpu.I32); err == nil || !strings.Contains(err.Error(), "belongs to this process") {
		t.Errorf("import of this process's memory: %v", err)
	}
	h.PID = 1
	h.Bytes = 6
	if _, err := d.importIPC(h, gpu.I32); err == nil || !strings.Contains(err.Error(), "not a positive number of i32 elements") {
		t.Errorf("import of a ragged span: %v", err)
	}
}
