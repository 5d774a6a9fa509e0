package models

import (
	"fmt"

	"github.com/troupe/troupe/gpu"
)

// Recorded steps. On a gpu.Grapher device the operations of a step after
// the index upload (embedding, layers, final norm, LM head and argmax) are
// recorded once per shape and replayed: the per-token indexes live in fixed
// buffers (index) that upload rewrites before each replay, so a recorded
// step serves every token, position and context length.

// graphMaxTokens is the most tokens a recorded step carries: decode
// batches, where issuing operations one by one costs more than running them.
const graphMaxTokens = 64

// maxGraphs bounds the recorded steps a model keeps; shapes beyond it run
// operation by operation.
const maxGraphs = 128

// graphKey names a recorded step: the shape of the step and the cache
// whose buffers it uses.
type graphKey struct {
	cache  *Cache
	n, r   int
	argmax bool
	from   tokenSource
}

// tokenSource says where a step's embedding reads its token ids.
type tokenSource bool

const (
	fromIndex    tokenSource = false // the uploaded indexes
	fromPrevious tokenSource = true  // the previous step's device-side argmax (chained greedy steps)
)

// step issues one step's operations, replaying (and first recording) a
// graph where the device and the shape allow.
func (m *Model) step(cache *Cache, n, r int, argmax bool, from tokenSource) error {
	m.s.chosen, m.s.drew = 0, false
	if argmax {
		m.s.chosen = r
	}
	record := func() error { return m.ops(cache, n, r, argmax, from) }
	gr, ok := m.dev.(gpu.Grapher)
	if !ok || m.opts.Eager || m.graphErr != nil || n > graphMaxTokens {
		return record()
	}
	key := graphKey{cache: cache, n: n, r: r, argmax: argmax, from: from}
	g := m.graphs[key]
	if g == nil {
		if len(m.graphs) >= maxGraphs {
			return record()
		}
		var err error
		if g, err = gr.Capture(record); err != nil {
			// Keep serving, operation by operation; GraphError tells why.
			m.graphErr = fmt.Errorf("recording a step of %d tokens: %w", n, err)
			return record()
		}
		if m.graphs == nil {
			m.graphs = make(map[graphKey]gpu.Graph)
		}
		m.graphs[key] = g
	}
	if err := g.Launch(); err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	return nil
}

// dropGraphs closes the recorded steps that use cache (every one when
// cache is nil), before the buffers they use change or go away.
func (m *Model) dropGraphs(cache *Cache) {
	for k, g := range m.graphs {
		if cache == nil || k.cache == cache {
			_ = g.Close()
			delete(m.graphs, k)
		}
	}
}

// Sections of the index buffers.
const (
	secIDs = iota
	secPos
	secSeq
	secSlots
	secRows
	secTable
	nSections
)

// index holds a step's indexes on the device: token ids, positions,
// sequence of each token, KV slots, logits rows (each stride elements) and
// the block tables (MaxSeqs rows of maxBlocks). On a gpu.Slicer device they
// are views of one allocation, uploaded with one Write per step from the
// packed host image.
type index struct {
	all                               gpu.Buffer // the packed allocation; nil when separate
	ids, pos, seq, slots, rows, table gpu.Buffer
	stride, maxBlocks                 int
	host                              []int32
	// runs counts the step's runs of consecutive tokens of one sequence
	// (gpu.AttnArgs.Runs).
	runs int
}

func (ix *index) bufs() []gpu.Buffer {
	return []gpu.Buffer{ix.ids, ix.pos, ix.seq, ix.slots, ix.rows, ix.table}
}

// section returns the first n host elements of section sec.
func (ix *index) section(sec, n int) []int32 {
	off := sec * ix.stride
	return ix.host[off : off+n]
}

// write uploads n tokens' indexes, r logits rows and need table entries.
func (ix *index) write(d gpu.Device, n, r, need int) error {
	if ix.all != nil {
		return d.Write(ix.all, 0, gpu.I32Bytes(ix.host[:secTable*ix.stride+need]))
	}
	for sec, b := range ix.bufs() {
		k := n
		switch sec {
		case secRows:
			k = r
		case secTable:
			k = need
		}
		if k == 0 {
			continue
		}
		if err := d.Write(b, 0, gpu.I32Bytes(ix.section(sec, k))); err != nil {
			return err
		}
	}
	return nil
}

func (ix *index) free(d gpu.Device) {
	if ix.all != nil {
		d.Free(ix.all)
	} else {
		for _, b := range ix.bufs() {
			if b != nil {
				d.Free(b)
			}
		}
	}
	*ix = index{}
}

// ensureIndex (re)allocates the index buffers for block tables of
// maxBlocks columns.
func (m *Model) ensureIndex(maxBlocks int) error {
	ix := &m.s.idx
	if ix.table != nil && ix.maxBlocks == maxBlocks {
		return nil
	}
	m.dropGraphs(nil)
	ix.free(m.dev)
	stride := (m.opts.MaxTokens + 3) &^ 3 // 16-byte aligned sections
	total := secTable*stride + m.opts.MaxSeqs*maxBlocks
	lens := [nSections]int{stride, stride, stride, stride, stride, m.opts.MaxSeqs * maxBlocks}
	views := make([]gpu.Buffer, nSections)
	if sl, ok := m.dev.(gpu.Slicer); ok {
		all, err := m.dev.Alloc(gpu.I32, total)
		if err != nil {
			return fmt.Errorf("forward: indexes: %w", err)
		}
		for sec := range nSections {
			if views[sec], err = sl.Slice(all, sec*stride, lens[sec]); err != nil {
				m.dev.Free(all)
				return fmt.Errorf("forward: indexes: %w", err)
			}
		}
		ix.all = all
	} else {
		for sec := range nSections {
			b, err := m.dev.Alloc(gpu.I32, lens[sec])
			if err != nil {
				for _, v := range views[:sec] {
					m.dev.Free(v)
				}
				return fmt.Errorf("forward: indexes: %w", err)
			}
			views[sec] = b
		}
	}
	ix.ids, ix.pos, ix.seq, ix.slots, ix.rows, ix.table = views[0], views[1], views[2], views[3], views[4], views[5]
	ix.stride, ix.maxBlocks = stride, maxBlocks
	ix.host = make([]int32, total)
	return nil
}

// allocPacked allocates the outputs of packed products for steps of up to
// qkvFuseTokens tokens, when a layer has packed weights. The views start
// at each part's first row and run to the buffer's end: a step of one
// token reads them as dense rows, a longer step with the packed row
// stride (gpu.QKVArgs.Stride, gpu.GatedMLPer).
func (m *Model) allocPacked() error {
	c := &m.Config
	sl, ok := m.dev.(gpu.Slicer)
	if !ok || len(m.layers) == 0 {
		return nil
	}
	qw, kw, F := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.Intermediate
	var hasQKV, hasGU bool
	for i := range m.layers {
		hasQKV = hasQKV || m.layers[i].qkv != nil
		hasGU = hasGU || m.layers[i].gateUp != nil
	}
	s := &m.s
	view := func(b gpu.Buffer, off, n int) gpu.Buffer {
		v, err := sl.Slice(b, off, n)
		if err != nil {
			panic(allocError{err})
		}
		return v
	}
	s.packedRows = min(qkvFuseTokens, m.opts.MaxTokens)
	if hasQKV && qw%4 == 0 && kw%4 == 0 {
		all := s.packedRows * (qw + 2*kw)
		s.qkv1 = m.alloc(gpu.F32, all)
		s.q1, s.k1, s.v1 = view(s.qkv1, 0, all), view(s.qkv1, qw, all-qw), view(s.qkv1, qw+kw, all-qw-kw)
	}
	if hasGU && F%4 == 0 {
		all := s.packedRows * 2 * F
		s.gu1 = m.alloc(gpu.F32, all)
		s.g1, s.u1 = view(s.gu1, 0, all), view(s.gu1, F, all-F)
	}
	return nil
}

// GraphError is nil while steps are recorded and replayed (or the device
// cannot record them); otherwise it says why recording failed, after which
// the model issues operations one by one.
func (m *Model) GraphError() error { return m.graphErr }

// Graphs is the number of recorded steps the model holds.
func (m *Model) Graphs() int { return len(m.graphs) }
