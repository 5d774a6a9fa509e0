package tokenizer

import (
	"strings"
	"sync"
)

// merge is the result of merging an adjacent pair of tokens.
type merge struct {
	rank int32
	id   int32
}

func pairKey(left, right int32) uint64 { return uint64(uint32(left))<<32 | uint64(uint32(right)) }

// symbol is one node of the doubly linked list a word is merged in.
type symbol struct {
	id         int32
	prev, next int32
}

// candidate is a possible merge of the symbol at pos with its successor,
// valid while both still carry the ids it was computed for.
type candidate struct {
	key   uint64 // rank<<32 | pos: lower merges first, leftmost among equals
	left  int32
	right int32
}

// bpeScratch is per-call working memory, pooled per Tokenizer.
type bpeScratch struct {
	syms []symbol
	heap []candidate
}

// bpe merges the symbols of one pre-tokenized piece (raw bytes) and appends
// the resulting ids to out.
func (t *Tokenizer) bpe(out []int32, piece string) []int32 {
	if t.ignoreMerges {
		if id, ok := t.vocab[t.byteLevelString(piece)]; ok {
			return append(out, id)
		}
	}
	sc := t.scratch.Get().(*bpeScratch)
	defer t.scratch.Put(sc)
	syms := sc.syms[:0]
	for i := 0; i < len(piece); i++ {
		id := t.byteIDs[piece[i]]
		if id < 0 {
			// A byte missing from the vocabulary is dropped, as Hugging
			// Face does for a BPE model without an unknown token.
			continue
		}
		n := int32(len(syms))
		syms = append(syms, symbol{id: id, prev: n - 1, next: n + 1})
	}
	if len(syms) == 0 {
		sc.syms = syms
		return out
	}
	syms[len(syms)-1].next = -1
	h := sc.heap[:0]
	for i := 0; i+1 < len(syms); i++ {
		h = t.pushPair(h, syms, int32(i))
	}
	for len(h) > 0 {
		var c candidate
		c, h = heapPop(h)
		pos := int32(c.key & 0xffffffff)
		s := &syms[pos]
		if s.id != c.left || s.next < 0 || syms[s.next].id != c.right {
			continue // stale: a neighbour was merged since
		}
		m := t.merges[pairKey(c.left, c.right)]
		dead := s.next
		s.id = m.id
		s.next = syms[dead].next
		if s.next >= 0 {
			syms[s.next].prev = pos
		}
		syms[dead].id = -1
		if s.prev >= 0 {
			h = t.pushPair(h, syms, s.prev)
		}
		h = t.pushPair(h, syms, pos)
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		out = append(out, syms[i].id)
	}
	sc.syms, sc.heap = syms, h
	return out
}

// pushPair adds the merge of the symbol at pos with its successor, if any.
func (t *Tokenizer) pushPair(h []candidate, syms []symbol, pos int32) []candidate {
	next := syms[pos].next
	if next < 0 {
		return h
	}
	m, ok := t.merges[pairKey(syms[pos].id, syms[next].id)]
	if !ok {
		return h
	}
	return heapPush(h, candidate{key: uint64(m.rank)<<32 | uint64(pos), left: syms[pos].id, right: syms[next].id})
}

func heapPush(h []candidate, c candidate) []candidate {
	h = append(h, c)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if h[p].key <= h[i].key {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	return h
}

func heapPop(h []candidate) (candidate, []candidate) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		m := l
		if r := l + 1; r < len(h) && h[r].key < h[l].key {
			m = r
		}
		if h[i].key <= h[m].key {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top, h
}

func (t *Tokenizer) byteLevelString(piece string) string {
	var b strings.Builder
	b.Grow(len(piece) * 2)
	for i := 0; i < len(piece); i++ {
		b.WriteRune(t.alphabet[piece[i]])
	}
	return b.String()
}

// wordCache remembers the ids of recently seen pieces. It is sharded to
// keep lock contention low and bounded: a full shard is emptied.
type wordCache struct {
	shards [cacheShards]cacheShard
}

const (
	cacheShards      = 16
	cacheShardSize   = 4096
	cacheMaxPieceLen = 64
)

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]int32 // guarded by mu
}

func newWordCache() *wordCache {
	return &wordCache{}
}

func (c *wordCache) shard(key string) *cacheShard {
	// Cheap and good enough to spread pieces: no second full hash.
	h := uint(len(key))*31 + uint(key[0]) + uint(key[len(key)-1])*7
	return &c.shards[h%cacheShards]
}

func (c *wordCache) get(key string) ([]int32, bool) {
	sh := c.shard(key)
	sh.mu.RLock()
	ids, ok := sh.m[key]
	sh.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(key string, ids []int32) {
	sh := c.shard(key)
	sh.mu.Lock()
	if sh.m == nil || len(sh.m) >= cacheShardSize {
		sh.m = make(map[string][]int32, 256)
	}
	sh.m[strings.Clone(key)] = ids
	sh.mu.Unlock()
}

// encodePiece appends the ids of one pre-tokenized piece, through the cache.
func (t *Tokenizer) encodePiece(out []int32, piece string) []int32 {
	if len(piece) == 1 && t.byteIDs[piece[0]] >= 0 {
		return append(out, t.byteIDs[piece[0]])
	}
	if len(piece) > cacheMaxPieceLen {
		return t.bpe(out, piece)
	}
	if ids, ok := t.cache.get(piece); ok {
		return append(out, ids...)
	}
	start := len(out)
	out = t.bpe(out, piece)
	t.cache.put(piece, append([]int32(nil), out[start:]...))
	return out
}
