package scheduler

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
)

// ErrNoBlocks means the KV cache has no free or evictable block left.
var ErrNoBlocks = errors.New("kv cache full")

// KVStats describe the block pool.
type KVStats struct {
	Blocks    int `msgpack:"blocks"`     // total
	BlockSize int `msgpack:"block_size"` // tokens per block
	Used      int `msgpack:"used"`       // held by live sequences
	Cached    int `msgpack:"cached"`     // free but holding a reusable prefix
	Free      int `msgpack:"free"`       // empty
	Hits      int `msgpack:"hits"`       // prompt blocks served from the prefix cache
}

// KV hands out the blocks of a paged KV cache to sequences and reuses the
// blocks of identical prompt prefixes. Full blocks are identified by a hash
// chain over their tokens salted with the tenant, so one tenant's prefixes
// are never served to another. Blocks no sequence holds but that keep a
// prefix are evicted least recently used first.
//
// KV is not safe for concurrent use; its owner (the KV-manager actor, or a
// scheduler) serialises calls.
type KV struct {
	size   int
	blocks []block
	free   []int32          // empty blocks
	byHash map[uint64]int32 // full blocks holding a known prefix
	lru    lruList          // cached blocks, least recently used first
	seqs   map[string]*kvSeq
	seed   maphash.Seed
	hits   int
}

type block struct {
	refs       int
	hash       uint64
	hashed     bool
	prev, next int32 // lru links, -1 when not listed
}

type kvSeq struct {
	tenant string
	table  []int32
	hashes []uint64 // chain hash of each full block committed so far
}

// NewKV returns a pool of n blocks of size tokens.
func NewKV(n, size int) (*KV, error) {
	if n <= 0 || size <= 0 {
		return nil, fmt.Errorf("kv: %d blocks of %d tokens", n, size)
	}
	k := &KV{size: size, blocks: make([]block, n), byHash: map[uint64]int32{}, seqs: map[string]*kvSeq{}, seed: maphash.MakeSeed()}
	k.lru.init(k)
	for i := n - 1; i >= 0; i-- {
		k.blocks[i].prev, k.blocks[i].next = -1, -1
		k.free = append(k.free, int32(i))
	}
	return k, nil
}

// BlockSize is the number of tokens per block.
func (k *KV) BlockSize() int { return k.size }

// Stats reports the pool's occupancy.
func (k *KV) Stats() KVStats {
	s := KVStats{Blocks: len(k.blocks), BlockSize: k.size, Free: len(k.free), Cached: k.lru.n, Hits: k.hits}
	s.Used = s.Blocks - s.Free - s.Cached
	return s
}

// Table returns a sequence's block table (owned by KV; valid until the
// sequence next changes).
func (k *KV) Table(id string) []int32 {
	if s := k.seqs[id]; s != nil {
		return s.table
	}
	return nil
}

// Available is the number of blocks that can still be handed out.
func (k *KV) Available() int { return len(k.free) + k.lru.n }

// Start registers a sequence whose first tokens are prompt and reuses the
// cached blocks of its longest known prefix. It returns how many leading
// tokens are already in the cache (a multiple of the block size, and less
// than len(prompt), so at least one token is left to compute). It reserves
// blocks for the whole prompt or none.
func (k *KV) Start(id, tenant string, prompt []int32) (int, error) {
	if _, dup := k.seqs[id]; dup {
		return 0, fmt.Errorf("kv: sequence %q already started", id)
	}
	s := &kvSeq{tenant: tenant}
	var h uint64
	reused := 0
	for (reused+1)*k.size < len(prompt) {
		h = k.chain(tenant, h, prompt[reused*k.size:(reused+1)*k.size])
		b, ok := k.byHash[h]
		if !ok {
			break
		}
		k.ref(b)
		s.table = append(s.table, b)
		s.hashes = append(s.hashes, h)
		reused++
	}
	need := (len(prompt)+k.size-1)/k.size - reused
	if need > k.Available() {
		for _, b := range s.table {
			k.unref(b)
		}
		return 0, fmt.Errorf("%w: prompt needs %d blocks, %d available", ErrNoBlocks, need, k.Available())
	}
	for range need {
		b, _ := k.take()
		s.table = append(s.table, b)
	}
	k.hits += reused
	k.seqs[id] = s
	return reused * k.size, nil
}

// Grow makes room for a sequence to hold n tokens.
func (k *KV) Grow(id string, n int) error {
	s := k.seqs[id]
	if s == nil {
		return fmt.Errorf("kv: unknown sequence %q", id)
	}
	for len(s.table)*k.size < n {
		b, ok := k.take()
		if !ok {
			return ErrNoBlocks
		}
		s.table = append(s.table, b)
	}
	return nil
}

// Commit records that the first len(tokens) tokens of a sequence are in the
// cache, making its full blocks reusable by later prompts.
func (k *KV) Commit(id string, tokens []int32) {
	s := k.seqs[id]
	if s == nil {
		return
	}
	for i := len(s.hashes); (i+1)*k.size <= len(tokens) && i < len(s.table); i++ {
		var prev uint64
		if i > 0 {
			prev = s.hashes[i-1]
		}
		h := k.chain(s.tenant, prev, tokens[i*k.size:(i+1)*k.size])
		s.hashes = append(s.hashes, h)
		b := &k.blocks[s.table[i]]
		if _, known := k.byHash[h]; !known && !b.hashed {
			b.hash, b.hashed = h, true
			k.byHash[h] = s.table[i]
		}
	}
}

// Free releases a sequence's blocks; blocks holding a prefix stay cached.
func (k *KV) Free(id string) {
	s := k.seqs[id]
	if s == nil {
		return
	}
	for _, b := range s.table {
		k.unref(b)
	}
	delete(k.seqs, id)
}

func (k *KV) chain(tenant string, prev uint64, tokens []int32) uint64 {
	var h maphash.Hash
	h.SetSeed(k.seed)
	h.WriteString(tenant)
	h.WriteByte(0)
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], prev)
	h.Write(buf[:])
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(buf[:4], uint32(t))
		h.Write(buf[:4])
	}
	return h.Sum64()
}

// take returns an empty block, evicting the least recently used cached one
// when none is free.
func (k *KV) take() (int32, bool) {
	if n := len(k.free); n > 0 {
		b := k.free[n-1]
		k.free = k.free[:n-1]
		k.blocks[b].refs = 1
		return b, true
	}
	b := k.lru.head()
	if b < 0 {
		return -1, false
	}
	k.lru.remove(b)
	blk := &k.blocks[b]
	delete(k.byHash, blk.hash)
	blk.hashed, blk.refs = false, 1
	return b, true
}

func (k *KV) ref(b int32) {
	blk := &k.blocks[b]
	if blk.refs == 0 {
		k.lru.remove(b)
	}
	blk.refs++
}

func (k *KV) unref(b int32) {
	blk := &k.blocks[b]
	blk.refs--
	if blk.refs > 0 {
		return
	}
	if blk.hashed {
		k.lru.pushBack(b)
	} else {
		k.free = append(k.free, b)
	}
}

// lruList is an intrusive doubly linked list over the blocks.
type lruList struct {
	k          *KV
	first, end int32
	n          int
}

func (l *lruList) init(k *KV)  { l.k, l.first, l.end = k, -1, -1 }
func (l *lruList) head() int32 { return l.first }

func (l *lruList) pushBack(b int32) {
	blk := &l.k.blocks[b]
	blk.prev, blk.next = l.end, -1
	if l.end >= 0 {
		l.k.blocks[l.end].next = b
	} else {
		l.first = b
	}
	l.end = b
	l.n++
}

func (l *lruList) remove(b int32) {
	blk := &l.k.blocks[b]
	if blk.prev >= 0 {
		l.k.blocks[blk.prev].next = blk.next
	} else {
		l.first = blk.next
	}
	if blk.next >= 0 {
		l.k.blocks[blk.next].prev = blk.prev
	} else {
		l.end = blk.prev
	}
	blk.prev, blk.next = -1, -1
	l.n--
}
