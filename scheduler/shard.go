package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	ttrace "github.com/troupe/troupe/trace"
	"github.com/troupe/troupe/xgmi"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Shard is a layer-shard: layers [First, Last) of one replica on a device,
// with their slice of the KV cache. It runs one step at a time.
type Shard struct {
	ID          string
	Index       int // stage number in the pipeline
	First, Last int
	model       *models.Model
	cache       *models.Cache
	plane       *xgmi.Host
	tracer      trace.Tracer
	traced      bool       // false without a tracer provider: no spans
	none        trace.Span // a span that records nothing

	// Fault, when set, runs before each forward pass in the actor: a seam
	// for injecting failures in tests.
	Fault func()
	// Device, when set, is the actor owning the shard's device: forward
	// passes run there, in turn with the other shards on the device.
	Device *actors.Ref[DeviceJob]
	// Remote, when set, reads inputs that another node published; without
	// it only tensors of this process's plane are readable.
	Remote RemoteReader
	// Rank and Ranks place a tensor-parallel rank in its group (Ranks > 1):
	// its spans carry shard.rank and its INFO says "rank r of n".
	Rank, Ranks int
	// QueueAhead, for a device that runs a step while the host waits for
	// another (a GPU), has greedy and drawn decode steps queue their
	// successor before their choices are read (ahead.go). Set before the
	// shard runs.
	QueueAhead bool

	mu    sync.Mutex  // one step at a time
	outs  [][]float32 // published outputs, by ForwardMsg.Micro
	ahead *aheadStep  // the step queued past the last asked for (ahead.go)
	spare []float32   // logits rows' memory for the next step queued ahead
	// Steps answered by a step queued ahead, and those queued for
	// nothing (the next step asked for was another).
	aheadUsed, aheadDropped int
}

// NewShard wraps a loaded model stage and its cache.
func NewShard(id string, index int, m *models.Model, cache *models.Cache, plane *xgmi.Host, tp trace.TracerProvider) *Shard {
	_, isNoop := tp.(noop.TracerProvider)
	traced := tp != nil && !isNoop
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	first, last := m.Layers()
	return &Shard{ID: id, Index: index, First: first, Last: last, model: m, cache: cache, plane: plane,
		tracer: tp.Tracer("github.com/troupe/troupe/scheduler"), traced: traced, none: trace.SpanFromContext(context.Background())}
}

// Forward runs one step: the batch's tokens (first stage) or the previous
// stage's activations through this shard's layers; the output is published
// on the data plane.
func (s *Shard) Forward(ctx context.Context, m ForwardMsg) (ForwardReply, error) {
	span := s.none
	if s.traced {
		ctx, span = s.tracer.Start(ctx, SpanShard)
		defer span.End()
	}
	if span.IsRecording() {
		span.SetAttributes(attribute.String("shard.id", s.ID), ttrace.AttrShardIndex.Int(s.Index),
			ttrace.AttrLayerStart.Int(s.First), ttrace.AttrLayerEnd.Int(s.Last),
			AttrTokens.Int(len(m.Pos)))
		if m.Micro > 0 {
			span.SetAttributes(AttrMicroBatch.Int(m.Micro - 1))
		}
		if s.Ranks > 1 {
			span.SetAttributes(ttrace.AttrShardRank.Int(s.Rank))
		}
	}
	if m.Micro < 0 || m.Micro > MaxMicroBatches {
		return ForwardReply{}, bus.Errorf(bus.CodeBadRequest, "shard %s: micro-batch %d outside [0, %d]", s.ID, m.Micro, MaxMicroBatches)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg := s.model.Config
	b := &models.Batch{Tokens: m.Tokens, Pos: m.Pos, Seq: m.Seq, Tables: m.Tables, Logits: m.Logits, Continues: m.Continues, NextDraws: m.NextSample, Read: m.Read,
		Summaries: m.Summaries, Top: m.Top}
	if !s.model.IsFirst() {
		in, err := readRef(ctx, s.plane, s.Remote, m.Input)
		if err != nil {
			// A producer that cannot be reached is a dead stage, not a bad plan.
			code := bus.CodeBadRequest
			if errors.Is(err, xgmi.ErrUnreachable) {
				code = bus.CodeUnavailable
			}
			return ForwardReply{}, bus.Errorf(code, "shard %s: %w", s.ID, err)
		}
		b.Hidden = in
	}
	if (m.Argmax || len(m.Sample) > 0) && s.model.IsLast() {
		if m.Argmax && len(m.Sample) > 0 {
			return ForwardReply{}, bus.Errorf(bus.CodeBadRequest, "shard %s: a step both argmax and sampled", s.ID)
		}
		if err := b.CheckRead(); err != nil {
			return ForwardReply{}, bus.Errorf(bus.CodeBadRequest, "shard %s: %w", s.ID, err)
		}
		ids := make([]int32, len(m.Logits))
		var draws []gpu.SampleRow
		if !m.Argmax {
			draws = m.Sample
		}
		err := s.onDevice(ctx, func() error {
			if s.QueueAhead && m.Micro == 0 && len(m.Logits) > 0 && (m.Argmax && s.model.Chains() || len(m.Sample) > 0 && s.model.ChainsDraws(m.Sample)) {
				how, err := s.chained(ctx, b, draws, ids)
				if span.IsRecording() {
					span.SetAttributes(ttrace.AttrShardAhead.String(how))
				}
				return err
			}
			s.dropAhead()
			return s.model.ForwardChoose(ctx, s.cache, b, draws, ids, s.out(m.Micro, len(m.Read)*b.ReadWidth(cfg.Vocab)))
		})
		if err != nil {
			return ForwardReply{}, bus.Errorf(bus.CodeBadRequest, "shard %s: %w", s.ID, err)
		}
		reply := ForwardReply{IDs: ids}
		if len(m.Read) > 0 {
			// The rows' memory may have changed hands (chained).
			w := b.ReadWidth(cfg.Vocab)
			reply.Output = s.publish(m.Micro, s.out(m.Micro, len(m.Read)*w), len(m.Read), w)
		}
		return reply, nil
	}
	var n int
	if s.model.IsLast() {
		n = len(m.Logits) * cfg.Vocab
	} else {
		n = len(m.Pos) * cfg.Hidden
	}
	out := s.out(m.Micro, n)
	err := s.onDevice(ctx, func() error {
		s.dropAhead()
		return s.model.Forward(ctx, s.cache, b, out)
	})
	if err != nil {
		return ForwardReply{}, bus.Errorf(bus.CodeBadRequest, "shard %s: %w", s.ID, err)
	}
	if s.model.IsLast() {
		return ForwardReply{Output: s.publish(m.Micro, out, len(m.Logits), cfg.Vocab)}, nil
	}
	return ForwardReply{Output: s.publish(m.Micro, out, len(m.Pos), cfg.Hidden)}, nil
}

// out is micro-batch m's output buffer of n floats. Each micro-batch of a
// step publishes its own: the next stage may still read micro-batch m
// while this one computes m+1.
func (s *Shard) out(m, n int) []float32 {
	for len(s.outs) <= m {
		s.outs = append(s.outs, nil)
	}
	if cap(s.outs[m]) < n {
		s.outs[m] = make([]float32, n)
	}
	return s.outs[m][:n]
}

// publish puts micro-batch m's output, rows of width logits (the last
// stage) or activations, on the shard's plane and names it.
func (s *Shard) publish(m int, out []float32, rows, width int) bus.TensorRef {
	name := outputName(s.ID, m)
	s.plane.Publish(name, out)
	return bus.TensorRef{Location: bus.LocationHost, Node: s.plane.Node(), Buffer: name, Bytes: uint64(4 * len(out)), DType: bus.F32,
		Shape: []int64{int64(rows), int64(width)}}
}

// RemoteReader fetches a host buffer that another node published on its
// plane (*xgmi.StreamClient implements it). Failures to reach the node wrap
// xgmi.ErrUnreachable.
type RemoteReader interface {
	Fetch(ctx context.Context, node, name string, off, n int) ([]float32, error)
}

// readRef resolves a host tensor reference: in place on this process's
// plane, or through remote when another node published it.
func readRef(ctx context.Context, plane *xgmi.Host, remote RemoteReader, ref bus.TensorRef) ([]float32, error) {
	if err := ref.Validate(); err != nil {
		return nil, err
	}
	if ref.Location != bus.LocationHost || ref.DType != bus.F32 {
		return nil, fmt.Errorf("tensor %s on %s: only f32 host tensors are readable here", ref.Buffer, ref.Location)
	}
	if ref.Offset%4 != 0 || ref.Bytes%4 != 0 || ref.Offset/4 > 1<<31 || ref.Bytes/4 > 1<<31 {
		return nil, fmt.Errorf("tensor %s: %d bytes at %d are not whole f32 elements in range", ref.Buffer, ref.Bytes, ref.Offset)
	}
	if ref.Node != plane.Node() {
		if remote == nil {
			return nil, fmt.Errorf("tensor %s lives on node %s, not reachable from %s", ref.Buffer, ref.Node, plane.Node())
		}
		return remote.Fetch(ctx, ref.Node, ref.Buffer, int(ref.Offset/4), int(ref.Bytes/4))
	}
	return plane.Read(ref.Buffer, int(ref.Offset/4), int(ref.Bytes/4))
}

// Pipeline is the Engine of a replica whose stages are layer-shard actors
// reached over the bus.
type Pipeline struct {
	// StepTimeout bounds one stage's forward pass, so that a stage that
	// died fails the step instead of hanging it.
	StepTimeout time.Duration
	// Remote reads the last stage's logits when it runs on another node.
	Remote RemoteReader
	// MicroBatches is the most micro-batches a step of two or more
	// sequences is cut into, to run through the stages as a wavefront
	// (microbatch.go); 0 means one per stage, 1 turns it off.
	MicroBatches int

	nc      *nats.Conn
	stages  []string // forward subjects, in layer order
	local   []*actors.Ref[ShardCall]
	plane   *xgmi.Host
	vocab   int
	step    uint64
	plan    plan // the step's plan as local stages see it
	micro   microPlan
	scratch []float32 // logits of a micro-batched greedy step
	draw    gpu.SampleScratch
}

// NewPipeline drives the stages listening on the given forward subjects.
func NewPipeline(nc *nats.Conn, stages []string, plane *xgmi.Host, vocab int) *Pipeline {
	return &Pipeline{StepTimeout: 30 * time.Second, MicroBatches: DefaultMicroBatches, nc: nc, stages: stages, local: make([]*actors.Ref[ShardCall], len(stages)), plane: plane, vocab: vocab}
}

// Local makes stage i reach ref, its layer-shard actor in this process,
// with actors.Ask instead of the bus: the plan is a Go value, nothing is
// encoded, and the reply comes back on a channel; an idle actor runs the
// pass on the caller's goroutine. The actor handles the call exactly as
// one from its forward endpoint: the Fault seam, supervision and the trace
// context apply, and StepTimeout bounds the wait for a busy actor and
// reaches the pass through its context. Once ref has stopped, the stage
// goes back to its subject, where a successor may answer. Call Local
// before the first Forward.
func (p *Pipeline) Local(i int, ref *actors.Ref[ShardCall]) error {
	if i < 0 || i >= len(p.stages) {
		return fmt.Errorf("pipeline: stage %d of %d", i, len(p.stages))
	}
	p.local[i] = ref
	return nil
}

// Forward implements Engine: the plan goes to each stage in turn, each
// stage reading the previous one's output from the data plane; or, cut
// into micro-batches (MicroBatches), through the stages as a wavefront.
func (p *Pipeline) Forward(ctx context.Context, b *models.Batch, logits []float32) error {
	p.step++
	if parts := p.split(b); parts != nil {
		return p.forwardMicro(ctx, b, parts, logits)
	}
	out, err := p.stagesForward(ctx, b, false, nil, nil)
	if err != nil || len(b.Logits) == 0 {
		return err
	}
	return p.readRows(ctx, out.Output, len(b.Logits)*p.vocab, logits)
}

// ForwardArgmax implements ArgmaxEngine: the last stage returns each row's
// most likely token instead of its logits. A step cut into micro-batches
// takes the logits and chooses here.
func (p *Pipeline) ForwardArgmax(ctx context.Context, b *models.Batch, ids []int32) error {
	return p.forwardIDs(ctx, b, nil, ids, nil)
}

// ForwardChoose implements ChooseEngine: the last stage chooses or draws
// each row's token and returns the logits rows b.Read names.
func (p *Pipeline) ForwardChoose(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32, logits []float32) error {
	if rows != nil && len(rows) != len(b.Logits) {
		return fmt.Errorf("pipeline: %d draws for %d logits rows", len(rows), len(b.Logits))
	}
	if err := b.CheckReadInto(logits, p.vocab); err != nil {
		return fmt.Errorf("pipeline: %w", err)
	}
	return p.forwardIDs(ctx, b, rows, ids, logits)
}

// ForwardSample implements SampleEngine: the last stage draws each row's
// token instead of returning the logits. A step cut into micro-batches
// takes the logits and draws here, as the devices do (gpu.SampleHost).
func (p *Pipeline) ForwardSample(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32) error {
	if len(rows) != len(b.Logits) {
		return fmt.Errorf("pipeline: %d draws for %d logits rows", len(rows), len(b.Logits))
	}
	return p.forwardIDs(ctx, b, rows, ids, nil)
}

// forwardIDs runs a step whose last stage returns a token a row: drawn as
// rows says, or with rows nil the most likely; and, with logits, the
// logits rows b.Read names.
func (p *Pipeline) forwardIDs(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32, logits []float32) error {
	if len(ids) < len(b.Logits) {
		return fmt.Errorf("pipeline: %d ids for %d logits rows", len(ids), len(b.Logits))
	}
	p.step++
	if parts := p.split(b); parts != nil {
		p.scratch = slices.Grow(p.scratch[:0], len(b.Logits)*p.vocab)[:len(b.Logits)*p.vocab]
		if err := p.forwardMicro(ctx, b, parts, p.scratch); err != nil {
			return err
		}
		chooseOnHost(ids, p.scratch, p.vocab, rows, &p.draw, b, logits)
		return nil
	}
	read := b.Read
	if logits == nil {
		read = nil
	}
	out, err := p.stagesForward(ctx, b, rows == nil, rows, read)
	if err != nil {
		return err
	}
	if len(out.IDs) != len(b.Logits) {
		return fmt.Errorf("pipeline: the last stage returned %d tokens for %d rows", len(out.IDs), len(b.Logits))
	}
	copy(ids, out.IDs)
	if len(read) == 0 {
		return nil
	}
	return p.readRows(ctx, out.Output, len(read)*b.ReadWidth(p.vocab), logits)
}

// chooseOnHost chooses each row's token from all, a step's logits rows
// of vocab values each, as an engine that chooses does: greedy with rows
// nil, else drawn as rows say, in sc's memory; with logits, it returns
// there the rows b.Read names as they were before a draw rewrote them, or
// their summaries (b.Summaries).
func chooseOnHost(ids []int32, all []float32, vocab int, rows []gpu.SampleRow, sc *gpu.SampleScratch, b *models.Batch, logits []float32) {
	read := b.Read
	if logits == nil {
		read = nil
	}
	raw := logits
	if b.Summaries && len(read) > 0 {
		raw = nil
		if rows != nil {
			raw = make([]float32, len(read)*vocab)
		}
	}
	if raw != nil {
		for k, r := range read {
			copy(raw[k*vocab:(k+1)*vocab], all[int(r)*vocab:])
		}
	}
	if rows == nil {
		models.ArgmaxRows(ids, all, vocab)
	} else {
		models.SampleRows(ids, all, vocab, rows, sc)
	}
	if !b.Summaries {
		return
	}
	w := gpu.SummaryWidth(b.Top)
	for k, r := range read {
		row := all[int(r)*vocab : (int(r)+1)*vocab]
		if raw != nil {
			row = raw[k*vocab : (k+1)*vocab]
		}
		gpu.Summarize(logits[k*w:(k+1)*w], row, ids[r], b.Top)
	}
}

// stagesForward sends the step's plan through the stages in turn and
// returns the last one's reply; with argmax the last stage chooses tokens,
// with rows it draws them, and it returns the logits rows read names.
func (p *Pipeline) stagesForward(ctx context.Context, b *models.Batch, argmax bool, rows []gpu.SampleRow, read []int32) (ForwardReply, error) {
	msg := ForwardMsg{Step: p.step, Tokens: b.Tokens, Pos: b.Pos, Seq: b.Seq, Tables: b.Tables, Logits: b.Logits, Continues: b.Continues}
	next := b.NextDraws
	var r ForwardReply
	copied := false
	for i, subj := range p.stages {
		if i > 0 {
			msg.Tokens, msg.Input = nil, r.Output
		}
		msg.Argmax = argmax && i == len(p.stages)-1
		ref := p.local[i]
		if ref != nil && stopped(ref) {
			ref = nil
		}
		if ref != nil && !copied {
			// A local stage shares the plan's memory, which the scheduler
			// reuses next step: it gets a copy that only it holds.
			p.plan.copyOf(b, rows, read)
			rows, next, read = p.plan.rows, p.plan.next, p.plan.read
			msg.Tokens, msg.Pos, msg.Seq, msg.Tables, msg.Logits = p.plan.tokens, p.plan.pos, p.plan.seq, p.plan.tables, p.plan.logits
			if i > 0 {
				msg.Tokens = nil
			}
			copied = true
		}
		msg.Sample, msg.NextSample, msg.Read, msg.Summaries, msg.Top = nil, nil, nil, false, 0
		if i == len(p.stages)-1 {
			msg.Sample, msg.Read = rows, read
			if len(read) > 0 {
				msg.Summaries, msg.Top = b.Summaries, b.Top
			}
			if len(rows) > 0 && len(next) == len(rows) {
				msg.NextSample = next
			}
		}
		sctx, cancel := context.WithTimeout(ctx, p.StepTimeout)
		var err error
		if ref != nil {
			r, err = actors.Ask(sctx, ref, shardCall, msg)
		} else {
			r, err = bus.Request[ForwardMsg, ForwardReply](sctx, p.nc, subj, msg)
		}
		cancel()
		if err != nil {
			if copied {
				// The stage may still read the copy: leave it to the stage.
				p.plan = plan{}
			}
			return ForwardReply{}, fmt.Errorf("pipeline stage %d: %w", i, err)
		}
	}
	return r, nil
}

// readRows copies the last stage's rows read, out, n values, into logits.
func (p *Pipeline) readRows(ctx context.Context, out bus.TensorRef, n int, logits []float32) error {
	if err := readOutput(ctx, p.plane, p.Remote, p.StepTimeout, out, n, logits); err != nil {
		return fmt.Errorf("pipeline logits: %w", err)
	}
	return nil
}

// readOutput copies a shard's output, ref, n values, into dst: through
// remote, within timeout, where it lives on another node (unreachable, a
// bus.CodeUnavailable error).
func readOutput(ctx context.Context, plane *xgmi.Host, remote RemoteReader, timeout time.Duration, ref bus.TensorRef, n int, dst []float32) error {
	if ref.Node != plane.Node() {
		// Only a fetch from another node can take time.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	out, err := readRef(ctx, plane, remote, ref)
	if err != nil {
		if errors.Is(err, xgmi.ErrUnreachable) {
			err = bus.Errorf(bus.CodeUnavailable, "%w", err)
		}
		return err
	}
	if len(out) != n {
		return fmt.Errorf("%d floats, want %d", len(out), n)
	}
	gpu.CopyRows(dst, out)
	return nil
}

// plan is a step's batch indexes, copied into memory of the pipeline's.
type plan struct {
	tokens, pos, seq, logits, read []int32
	tables                         [][]int32
	flat                           []int32 // the tables' entries
	rows, next                     []gpu.SampleRow
}

// copyOf copies b's plan into p's own memory, with the step's draws rows
// (nil for a greedy step), the next step's (b.NextDraws) and the logits
// rows to read.
func (p *plan) copyOf(b *models.Batch, rows []gpu.SampleRow, read []int32) {
	p.rows = append(p.rows[:0], rows...)
	p.read = append(p.read[:0], read...)
	p.next = append(p.next[:0], b.NextDraws...)
	p.tokens = append(p.tokens[:0], b.Tokens...)
	p.pos = append(p.pos[:0], b.Pos...)
	p.seq = append(p.seq[:0], b.Seq...)
	p.logits = append(p.logits[:0], b.Logits...)
	p.flat, p.tables = copyTables(p.flat, p.tables, b.Tables)
}

// copyTables copies src's block tables into one flat array, reusing flat
// and tables' memory, and returns both; each copied table is capped at its
// length.
func copyTables(flat []int32, tables, src [][]int32) ([]int32, [][]int32) {
	n := 0
	for _, t := range src {
		n += len(t)
	}
	if cap(flat) < n {
		flat = make([]int32, 0, 2*n)
	}
	flat, tables = flat[:0], tables[:0]
	for _, t := range src {
		start := len(flat)
		flat = append(flat, t...)
		tables = append(tables, flat[start:len(flat):len(flat)])
	}
	return flat, tables
}

func stopped(ref *actors.Ref[ShardCall]) bool {
	select {
	case <-ref.Done():
		return true
	default:
		return false
	}
}

// ShardCall is a forward request in a layer-shard actor's mailbox.
type ShardCall = *actors.Call[ForwardMsg, ForwardReply]

// shardCall is the forward endpoint's wrap: the call is the message.
func shardCall(c ShardCall) ShardCall { return c }

// ShardKind is the actor kind of layer-shards.
const ShardKind = "shard"

// Props describes the layer-shard actor serving s: its "forward" endpoint
// feeds a bounded mailbox, and a panic restarts it (the loaded weights and
// cache survive, owned by s) under the runtime's intensity limit.
func (s *Shard) Props() actors.Props[ShardCall] {
	return stageProps(s.ID, s.describe(), func() actors.Actor[ShardCall] { return shardActor{s} })
}

// failOnPanic, deferred by a stage's actor (kind what, id), fails call c
// on a panic, then panics on to the supervisor, which restarts the actor.
func failOnPanic(c ShardCall, what, id string) {
	if r := recover(); r != nil {
		c.Fail(bus.Errorf(bus.CodeInternal, "%s %s panicked: %v", what, id, r))
		panic(r)
	}
}

// stageProps describes an actor that answers a pipeline stage's forward
// calls (a layer-shard, or a TPStage): kind shard, id, a "forward"
// endpoint feeding a bounded mailbox, and about for INFO.
func stageProps(id, about string, actor func() actors.Actor[ShardCall]) actors.Props[ShardCall] {
	return actors.Props[ShardCall]{
		Kind:        ShardKind,
		ID:          id,
		New:         actor,
		Mailbox:     16,
		Description: about,
		Endpoints:   []actors.Endpoint[ShardCall]{actors.Handle("forward", shardCall)},
	}
}

func (s *Shard) describe() string {
	if s.Ranks > 1 {
		return fmt.Sprintf("layers %d-%d, rank %d of %d", s.First, s.Last, s.Rank, s.Ranks)
	}
	return fmt.Sprintf("layers %d-%d", s.First, s.Last)
}

type shardActor struct{ s *Shard }

// Stop implements actors.Stopper: a greedy step queued ahead is waited for.
func (a shardActor) Stop(context.Context) {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	a.s.dropAhead()
}

func (a shardActor) Receive(_ context.Context, c ShardCall) error {
	defer failOnPanic(c, "shard", a.s.ID)
	if f := a.s.Fault; f != nil {
		f()
	}
	resp, err := a.s.Forward(c.Context(), c.Req)
	if err != nil {
		c.Fail(err)
		return err
	}
	return c.Reply(resp)
}
