package xgmi

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// HostFabricConfig sizes a host fabric.
type HostFabricConfig struct {
	// Ranks is the number of ranks, 1 or more.
	Ranks int
	// WindowBytes is each rank's window; collectives on larger messages
	// run in steps of a window. A multiple of 64, at least 4 KiB.
	WindowBytes int
	// Spin is how many times a wait polls its signal word (yielding the
	// processor between polls) before it parks; 0 parks at once.
	Spin int
}

// DefaultHostFabricConfig returns a two-rank fabric with 4 MiB windows.
func DefaultHostFabricConfig() HostFabricConfig {
	return HostFabricConfig{Ranks: 2, WindowBytes: 4 << 20, Spin: 256}
}

// Validate reports a configuration that cannot work.
func (c HostFabricConfig) Validate() error {
	if c.Ranks < 1 {
		return fmt.Errorf("xgmi: host fabric: %d ranks, want 1 or more", c.Ranks)
	}
	if c.WindowBytes < 4<<10 || c.WindowBytes%64 != 0 {
		return fmt.Errorf("xgmi: host fabric: window of %d bytes, want a multiple of 64 of at least 4 KiB", c.WindowBytes)
	}
	if c.Spin < 0 {
		return fmt.Errorf("xgmi: host fabric: spin %d is negative", c.Spin)
	}
	return nil
}

// signalWord is one rank's sequence word of one slot, alone on its cache
// line so that ranks polling different words do not share a line.
type signalWord struct {
	seq atomic.Uint64
	_   [56]byte
}

// HostFabric is a Fabric in host memory: the ranks are goroutines (or
// actors) of one process, a window is a slice of the heap, and signal
// words are atomics. It implements HostMemory.
//
// Waits poll, then park on a broadcast channel that every Post after a
// parked waiter replaces, so that ranks that outnumber the processors do
// not burn them.
type HostFabric struct {
	cfg     HostFabricConfig
	windows [][]byte
	words   []signalWord // rank*numSlots + slot
	parked  atomic.Int32 // waiters that may be parked on wake

	// mu guards wake and err.
	mu   sync.Mutex
	wake chan struct{} // closed and replaced to wake parked waiters
	err  error         // set by Abort or Close; every wait then fails
	bad  atomic.Bool   // err != nil, readable without mu
}

var _ HostMemory = (*HostFabric)(nil)

// NewHostFabric allocates the windows of cfg.Ranks ranks.
func NewHostFabric(cfg HostFabricConfig) (*HostFabric, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &HostFabric{
		cfg:     cfg,
		windows: make([][]byte, cfg.Ranks),
		words:   make([]signalWord, cfg.Ranks*numSlots),
		wake:    make(chan struct{}),
	}
	for r := range f.windows {
		// Backed by uint64 so that every element type's view is aligned.
		back := make([]uint64, cfg.WindowBytes/8)
		f.windows[r] = unsafe.Slice((*byte)(unsafe.Pointer(&back[0])), cfg.WindowBytes)
	}
	return f, nil
}

// Ranks implements Fabric.
func (f *HostFabric) Ranks() int { return f.cfg.Ranks }

// WindowBytes implements Fabric.
func (f *HostFabric) WindowBytes() int { return f.cfg.WindowBytes }

// Link implements Fabric: every pair shares host memory.
func (f *HostFabric) Link(a, b int) Link {
	if a == b {
		return Link{A: a, B: b, Kind: LinkSelf}
	}
	return Link{A: a, B: b, Kind: LinkHost}
}

// Window implements HostMemory.
func (f *HostFabric) Window(rank int) []byte { return f.windows[rank] }

// Post implements HostMemory.
func (f *HostFabric) Post(rank, slot int, seq uint64) {
	f.words[rank*numSlots+slot].seq.Store(seq)
	if f.parked.Load() > 0 {
		f.broadcast()
	}
}

func (f *HostFabric) broadcast() {
	f.mu.Lock()
	close(f.wake)
	f.wake = make(chan struct{})
	f.mu.Unlock()
}

// Wait implements HostMemory.
func (f *HostFabric) Wait(ctx context.Context, rank, slot int, seq uint64) error {
	w := &f.words[rank*numSlots+slot].seq
	for i := 0; i < f.cfg.Spin; i++ {
		if w.Load() >= seq {
			return nil
		}
		if f.bad.Load() {
			return f.failure()
		}
		if i%32 == 31 && ctx.Err() != nil {
			return ctx.Err()
		}
		runtime.Gosched()
	}
	for {
		// Announce the park before the last look at the word: a Post
		// after that look sees parked > 0 and wakes us.
		f.parked.Add(1)
		f.mu.Lock()
		wake, err := f.wake, f.err
		f.mu.Unlock()
		if w.Load() >= seq {
			f.parked.Add(-1)
			return nil
		}
		if err != nil {
			f.parked.Add(-1)
			return err
		}
		select {
		case <-wake:
			f.parked.Add(-1)
		case <-ctx.Done():
			f.parked.Add(-1)
			return ctx.Err()
		}
	}
}

func (f *HostFabric) failure() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Abort implements HostMemory. The first abort's error is kept.
func (f *HostFabric) Abort(err error) {
	f.fail(fmt.Errorf("%w: %w", ErrAborted, err))
}

func (f *HostFabric) fail(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
		f.bad.Store(true)
	}
	close(f.wake)
	f.wake = make(chan struct{})
	f.mu.Unlock()
}

// Close implements Fabric: waits in progress and to come fail with
// ErrClosed. The windows stay readable until the last reference goes.
func (f *HostFabric) Close() error {
	f.fail(ErrClosed)
	return nil
}
