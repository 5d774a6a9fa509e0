package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/bus"
)

// Messages of the KV-manager's endpoints (bus.KVManager subjects).

// KVStartMsg registers a sequence with its prompt.
type KVStartMsg struct {
	ID     string  `msgpack:"id"`
	Tenant string  `msgpack:"tenant"`
	Prompt []int32 `msgpack:"prompt"`
}

// Schema implements bus.Message.
func (KVStartMsg) Schema() bus.Schema { return bus.Schema{ID: "troupe.kv.start", Version: 1} }

// KVGrowMsg makes room for N tokens.
type KVGrowMsg struct {
	ID string `msgpack:"id"`
	N  int    `msgpack:"n"`
}

// Schema implements bus.Message.
func (KVGrowMsg) Schema() bus.Schema { return bus.Schema{ID: "troupe.kv.grow", Version: 1} }

// KVCommitMsg records full blocks: Tokens are the tokens of blocks
// [From, From+len(Tokens)/block size).
type KVCommitMsg struct {
	ID     string  `msgpack:"id"`
	From   int     `msgpack:"from"`
	Tokens []int32 `msgpack:"tokens"`
}

// Schema implements bus.Message.
func (KVCommitMsg) Schema() bus.Schema { return bus.Schema{ID: "troupe.kv.commit", Version: 1} }

// KVFreeMsg releases a sequence.
type KVFreeMsg struct {
	ID string `msgpack:"id"`
}

// Schema implements bus.Message.
func (KVFreeMsg) Schema() bus.Schema { return bus.Schema{ID: "troupe.kv.free", Version: 1} }

// KVReply answers every KV-manager request: the sequence's block table (if
// any), the prompt tokens found cached (start) and the pool's occupancy.
type KVReply struct {
	Table  []int32 `msgpack:"table"`
	Cached int     `msgpack:"cached"`
	Full   bool    `msgpack:"full"` // the pool had no block to give
	Stats  KVStats `msgpack:"stats"`
}

// Schema implements bus.Message.
func (KVReply) Schema() bus.Schema { return bus.Schema{ID: "troupe.kv.reply", Version: 1} }

// Schema implements bus.Message, for the capacity endpoint.
func (KVStats) Schema() bus.Schema { return bus.Schema{ID: "troupe.kv.stats", Version: 1} }

// KVJob is a request in the KV-manager actor's mailbox: it runs against the
// pool, on the actor's goroutine.
type KVJob func(*KV)

// KVManagerProps describes the KV-manager actor of a replica owning kv.
// Its endpoints answer start, grow, commit, free and capacity.
func KVManagerProps(replica string, kv *KV) actors.Props[KVJob] {
	return actors.Props[KVJob]{
		Kind:        bus.KVManagerKind,
		ID:          replica,
		New:         func() actors.Actor[KVJob] { return kvActor{kv} },
		Mailbox:     256,
		Description: "paged KV blocks with prefix reuse",
		Endpoints: []actors.Endpoint[KVJob]{
			actors.Handle("start", kvStart),
			actors.Handle("grow", kvGrow),
			actors.Handle("commit", kvCommit),
			actors.Handle("free", kvFree),
			actors.Handle(bus.KVCapacity, kvCapacity),
		},
	}
}

// The KV-manager's endpoints, as jobs on its pool: the wraps of its Handle
// endpoints, which KVClient also hands to actors.Ask.

func kvReply(kv *KV, id string, r KVReply) KVReply {
	r.Table = append([]int32(nil), kv.Table(id)...)
	r.Stats = kv.Stats()
	return r
}

func kvStart(c *actors.Call[KVStartMsg, KVReply]) KVJob {
	return func(kv *KV) {
		cached, err := kv.Start(c.Req.ID, c.Req.Tenant, c.Req.Prompt)
		switch {
		case err == nil:
			c.Reply(kvReply(kv, c.Req.ID, KVReply{Cached: cached}))
		case isFull(err):
			c.Reply(kvReply(kv, c.Req.ID, KVReply{Full: true}))
		default:
			c.Fail(bus.Errorf(bus.CodeConflict, "%v", err))
		}
	}
}

func kvGrow(c *actors.Call[KVGrowMsg, KVReply]) KVJob {
	return func(kv *KV) {
		err := kv.Grow(c.Req.ID, c.Req.N)
		if err != nil && !isFull(err) {
			c.Fail(bus.Errorf(bus.CodeNotFound, "%v", err))
			return
		}
		c.Reply(kvReply(kv, c.Req.ID, KVReply{Full: err != nil}))
	}
}

func kvCommit(c *actors.Call[KVCommitMsg, KVReply]) KVJob {
	return func(kv *KV) {
		if c.Req.From < 0 || c.Req.From > 1<<20 {
			c.Fail(bus.Errorf(bus.CodeBadRequest, "commit from block %d", c.Req.From))
			return
		}
		tokens := append(make([]int32, c.Req.From*kv.BlockSize()), c.Req.Tokens...)
		kv.Commit(c.Req.ID, tokens)
		c.Reply(KVReply{Stats: kv.Stats()})
	}
}

func kvFree(c *actors.Call[KVFreeMsg, KVReply]) KVJob {
	return func(kv *KV) {
		kv.Free(c.Req.ID)
		c.Reply(KVReply{Stats: kv.Stats()})
	}
}

func kvCapacity(c *actors.Call[KVStats, KVStats]) KVJob {
	return func(kv *KV) { c.Reply(kv.Stats()) }
}

func isFull(err error) bool { return err != nil && errors.Is(err, ErrNoBlocks) }

type kvActor struct{ kv *KV }

func (a kvActor) Receive(_ context.Context, job KVJob) error {
	job(a.kv)
	return nil
}

// KVClient is a Blocks backed by a KV-manager actor over the bus. It keeps
// each sequence's block table and asks the manager only when a sequence
// crosses a block boundary, so decode steps cost no round trip most of the
// time. It is used by one scheduler goroutine.
type KVClient struct {
	nc      *nats.Conn
	subj    bus.Subjects
	replica string
	ctx     context.Context
	local   *actors.Ref[KVJob]

	mu        sync.Mutex
	stats     KVStats
	tables    map[string][]int32
	committed map[string]int // full blocks committed per sequence
}

// NewKVClient returns a client of replica's KV-manager. ctx bounds every
// request it makes.
func NewKVClient(ctx context.Context, nc *nats.Conn, subj bus.Subjects, replica string) (*KVClient, error) {
	c := &KVClient{nc: nc, subj: subj, replica: replica, ctx: ctx, tables: map[string][]int32{}, committed: map[string]int{}}
	st, err := bus.Request[KVStats, KVStats](ctx, nc, subj.KVManager(replica, bus.KVCapacity), KVStats{})
	if err != nil {
		return nil, fmt.Errorf("kv-manager %s: %w", replica, err)
	}
	c.stats = st
	return c, nil
}

// Local makes c reach the KV-manager through ref, its actor in this
// process, with actors.Ask instead of the bus. Once ref has stopped, c goes
// back to the bus. Call Local before c's first use by the scheduler.
func (c *KVClient) Local(ref *actors.Ref[KVJob]) { c.local = ref }

// kvRequest asks c's KV-manager: through its mailbox when it is local and
// running, else over the bus.
func kvRequest[Req bus.Message](c *KVClient, endpoint string, wrap func(*actors.Call[Req, KVReply]) KVJob, req Req) (KVReply, error) {
	if ref := c.local; ref != nil {
		select {
		case <-ref.Done():
		default:
			return actors.Ask(c.ctx, ref, wrap, req)
		}
	}
	return bus.Request[Req, KVReply](c.ctx, c.nc, c.subj.KVManager(c.replica, endpoint), req)
}

func (c *KVClient) update(id string, r KVReply, keepTable bool) {
	c.mu.Lock()
	c.stats = r.Stats
	c.mu.Unlock()
	if keepTable && len(r.Table) > 0 {
		c.tables[id] = r.Table
	}
}

// Start implements Blocks.
func (c *KVClient) Start(id, tenant string, prompt []int32) (int, error) {
	r, err := kvRequest(c, "start", kvStart, KVStartMsg{ID: id, Tenant: tenant, Prompt: prompt})
	if err != nil {
		return 0, err
	}
	c.update(id, r, !r.Full)
	if r.Full {
		return 0, fmt.Errorf("%w: prompt of %d tokens", ErrNoBlocks, len(prompt))
	}
	c.committed[id] = r.Cached / max(c.stats.BlockSize, 1)
	return r.Cached, nil
}

// Grow implements Blocks.
func (c *KVClient) Grow(id string, n int) error {
	t, ok := c.tables[id]
	if !ok {
		return fmt.Errorf("kv: unknown sequence %q", id)
	}
	if len(t)*c.stats.BlockSize >= n {
		return nil
	}
	r, err := kvRequest(c, "grow", kvGrow, KVGrowMsg{ID: id, N: n})
	if err != nil {
		return err
	}
	c.update(id, r, true)
	if r.Full {
		return ErrNoBlocks
	}
	return nil
}

// Commit implements Blocks; it sends only newly completed blocks.
func (c *KVClient) Commit(id string, tokens []int32) {
	bs := c.stats.BlockSize
	full := len(tokens) / bs
	from := c.committed[id]
	if full <= from {
		return
	}
	r, err := kvRequest(c, "commit", kvCommit, KVCommitMsg{ID: id, From: from, Tokens: tokens[from*bs : full*bs]})
	if err != nil {
		return // prefix reuse is an optimisation: a lost commit costs a recompute later
	}
	c.committed[id] = full
	c.update(id, r, false)
}

// Free implements Blocks.
func (c *KVClient) Free(id string) {
	delete(c.tables, id)
	delete(c.committed, id)
	r, err := kvRequest(c, "free", kvFree, KVFreeMsg{ID: id})
	if err == nil {
		c.update(id, r, false)
	}
}

// Table implements Blocks.
func (c *KVClient) Table(id string) []int32 { return c.tables[id] }

// Stats implements Blocks: the occupancy reported by the latest reply.
func (c *KVClient) Stats() KVStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}
