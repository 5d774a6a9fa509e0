package cuda

import (
	"errors"
	"fmt"

	"github.com/troupe/troupe/gpu"
)

// Graph is a recorded sequence of operations (a CUDA graph), replayed by
// Launch with one driver call.
type Graph struct {
	d      *Device
	graph  uintptr
	exec   uintptr
	nodes  int
	closed bool
}

var _ gpu.Graph = (*Graph)(nil)

// Capture implements gpu.Grapher: it records the operations record issues
// on the device's stream (stream capture) and instantiates them. While
// recording, Write, Read and Sync are refused, Embed does not wait, and
// buffers freed are released after recording ends. Buffers the graph uses
// must stay allocated while it lives.
func (d *Device) Capture(record func() error) (gpu.Graph, error) {
	if err := d.enter("capture"); err != nil {
		return nil, err
	}
	if d.capture {
		d.leave()
		return nil, fmt.Errorf("cuda: capture: already recording")
	}
	err := d.do(func() error {
		if err := d.takeErr(); err != nil {
			return err
		}
		return d.drv.cuStreamBeginCapture_v2.call(d.stream, captureModeRelaxed)
	})
	if err != nil {
		d.leave()
		return nil, fmt.Errorf("cuda: capture: begin: %w", err)
	}
	d.capture = true
	d.leave()

	rerr := record()

	d.mu.Lock()
	defer d.mu.Unlock()
	rerr = errors.Join(rerr, d.flushSum()) // the recording's last product is summed in it
	d.capture = false
	d.rounded = roundedX{} // recorded work has not run: scratch holds no rounded x
	g := &Graph{d: d}
	err = d.do(func() error {
		endErr := d.drv.cuStreamEndCapture.call(d.stream, ptr(&g.graph))
		if err := d.takeErr(); err != nil {
			return err
		}
		if endErr != nil {
			return endErr
		}
		var n uintptr
		if err := d.drv.cuGraphGetNodes.call(g.graph, 0, ptr(&n)); err != nil {
			return err
		}
		g.nodes = int(n)
		return d.drv.cuGraphInstantiateWithFlags.call(ptr(&g.exec), g.graph, 0)
	})
	for _, b := range d.deferred {
		d.freeNow(b)
	}
	d.deferred = nil
	if rerr != nil || err != nil {
		_ = d.do(g.destroy)
		if rerr != nil {
			return nil, errors.Join(fmt.Errorf("cuda: capture: %w", rerr), err)
		}
		return nil, fmt.Errorf("cuda: capture: %w", err)
	}
	d.graphs[g] = struct{}{}
	return g, nil
}

// Nodes is the number of operations (kernels, copies, memsets) recorded.
func (g *Graph) Nodes() int { return g.nodes }

// Launch implements gpu.Graph: it queues one replay of the graph.
func (g *Graph) Launch() error {
	d := g.d
	if err := d.enter("graph launch"); err != nil {
		return err
	}
	defer d.leave()
	if g.closed {
		return fmt.Errorf("cuda: graph launch: graph is closed")
	}
	if d.capture {
		return fmt.Errorf("cuda: graph launch: not allowed while recording a graph")
	}
	exec := g.exec
	d.post(func() error {
		if err := d.drv.cuGraphLaunch.call(exec, d.stream); err != nil {
			return fmt.Errorf("cuda: graph launch: %w", err)
		}
		return nil
	})
	return nil
}

// Close implements gpu.Graph.
func (g *Graph) Close() error {
	d := g.d
	if err := d.enter("graph close"); err != nil {
		return nil // the device's Close destroyed it
	}
	defer d.leave()
	if g.closed {
		return nil
	}
	delete(d.graphs, g)
	return d.do(g.destroy)
}

// destroy runs on the device's thread.
func (g *Graph) destroy() error {
	g.closed = true
	var err error
	if g.exec != 0 {
		if err = g.d.syncStream(); err == nil {
			err = g.d.drv.cuGraphExecDestroy.call(g.exec)
		}
		g.exec = 0
	}
	if g.graph != 0 {
		if e := g.d.drv.cuGraphDestroy.call(g.graph); err == nil {
			err = e
		}
		g.graph = 0
	}
	return err
}
