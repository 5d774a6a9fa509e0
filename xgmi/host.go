package xgmi

import (
	"fmt"
	"sync"
)

// Host is a registry of named host buffers shared by the actors of one
// process.
type Host struct {
	node string
	mu   sync.RWMutex
	bufs map[string][]float32
}

// NewHost returns the host plane of node.
func NewHost(node string) *Host { return &Host{node: node, bufs: map[string][]float32{}} }

// Node names the process the plane belongs to.
func (h *Host) Node() string { return h.node }

// Publish makes data readable under name, replacing what was there.
func (h *Host) Publish(name string, data []float32) {
	h.mu.Lock()
	h.bufs[name] = data
	h.mu.Unlock()
}

// Read returns n floats at offset off of the buffer published under name.
func (h *Host) Read(name string, off, n int) ([]float32, error) {
	h.mu.RLock()
	b, ok := h.bufs[name]
	h.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("xgmi: no buffer %q on %s", name, h.node)
	}
	if off < 0 || n < 0 || off+n > len(b) {
		return nil, fmt.Errorf("xgmi: %d floats at %d outside buffer %q of %d", n, off, name, len(b))
	}
	return b[off : off+n], nil
}

// Remove forgets a buffer.
func (h *Host) Remove(name string) {
	h.mu.Lock()
	delete(h.bufs, name)
	h.mu.Unlock()
}
