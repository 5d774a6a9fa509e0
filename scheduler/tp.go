package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/xgmi"
)

// Group is what Lockstep needs of a tensor-parallel group's collectives:
// Abort makes every collective in progress or to come fail instead of
// waiting for a rank that will not arrive, and Reset, called once every
// rank has returned from an aborted step, gives the ranks fresh
// collectives for the next one.
type Group interface {
	Abort(err error)
	Reset() error
}

// Lockstep is the Engine of a tensor-parallel replica: its ranks are
// layer-shard actors of this process, each owning its rank's slice of
// every layer on its own device. Every step goes to every rank at once;
// the collectives inside the pass keep them in lock-step, and rank 0's
// logits are the step's (every rank computes the same ones).
//
// A rank that fails or panics fails the step for all: Lockstep aborts the
// group's collectives so that no rank is left waiting in one, waits for
// every rank, resets the group and returns the error. The scheduler fails
// the step's requests as after any failed step (their KV blocks go back),
// the supervisor restarts a rank that panicked, and the next requests
// prefill afresh on every rank.
type Lockstep struct {
	// StepTimeout bounds a step: past it the group is aborted, which
	// fails the step on every rank that waits in a collective.
	StepTimeout time.Duration

	ranks []*actors.Ref[ShardCall]
	group Group
	plane *xgmi.Host
	vocab int
	step  uint64
	plan  plan
	errs  []error
	outs  []ForwardReply
}

// NewLockstep drives ranks (rank i at index i) whose collectives are
// group's.
func NewLockstep(ranks []*actors.Ref[ShardCall], group Group, plane *xgmi.Host, vocab int) (*Lockstep, error) {
	if len(ranks) == 0 || group == nil {
		return nil, fmt.Errorf("lockstep: %d ranks and group %v", len(ranks), group)
	}
	return &Lockstep{StepTimeout: 30 * time.Second, ranks: ranks, group: group, plane: plane, vocab: vocab,
		errs: make([]error, len(ranks)), outs: make([]ForwardReply, len(ranks))}, nil
}

// Forward implements Engine. The ranks' passes run without a deadline of
// their own: when StepTimeout passes or ctx ends, the group is aborted,
// which ends every wait in a collective, and Forward waits for every rank
// to return before it resets the group. So no pass of a failed step is
// left to run on the reset group, where it would take the place of the
// next step's.
func (l *Lockstep) Forward(ctx context.Context, b *models.Batch, logits []float32) error {
	if err := l.run(ctx, b, false, nil, nil); err != nil || len(b.Logits) == 0 {
		return err
	}
	return l.rows(ctx, len(b.Logits)*l.vocab, logits)
}

// rows copies rank 0's output, n values, into logits.
func (l *Lockstep) rows(ctx context.Context, n int, logits []float32) error {
	if err := readOutput(ctx, l.plane, nil, l.StepTimeout, l.outs[0].Output, n, logits); err != nil {
		return fmt.Errorf("lockstep logits: %w", err)
	}
	return nil
}

// ForwardChoose implements ChooseEngine: every rank chooses or draws as
// in ForwardArgmax and ForwardSample and reads the rows b.Read names (so
// that ranks that queue ahead match their plans alike); rank 0's tokens
// and rows are the step's.
func (l *Lockstep) ForwardChoose(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32, logits []float32) error {
	if err := b.CheckReadInto(logits, l.vocab); err != nil {
		return fmt.Errorf("lockstep: %w", err)
	}
	if rows != nil && len(rows) != len(b.Logits) {
		return fmt.Errorf("lockstep: %d draws for %d rows", len(rows), len(b.Logits))
	}
	if err := l.run(ctx, b, rows == nil, rows, b.Read); err != nil {
		return err
	}
	if err := l.chosen(b, ids); err != nil || len(b.Read) == 0 {
		return err
	}
	return l.rows(ctx, len(b.Read)*b.ReadWidth(l.vocab), logits)
}

// ForwardArgmax implements ArgmaxEngine: every rank chooses the tokens
// from the whole logits rows it holds, and rank 0's choice is the step's.
func (l *Lockstep) ForwardArgmax(ctx context.Context, b *models.Batch, ids []int32) error {
	if err := l.run(ctx, b, true, nil, nil); err != nil {
		return err
	}
	return l.chosen(b, ids)
}

// ForwardSample implements SampleEngine: every rank draws each row's token
// as rows says from the whole logits rows it holds, with the same uniform
// numbers, so all draw alike; rank 0's draws are the step's.
func (l *Lockstep) ForwardSample(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32) error {
	if len(rows) != len(b.Logits) {
		return fmt.Errorf("lockstep: %d draws for %d rows", len(rows), len(b.Logits))
	}
	if err := l.run(ctx, b, false, rows, nil); err != nil {
		return err
	}
	return l.chosen(b, ids)
}

// chosen copies rank 0's tokens of the step into ids.
func (l *Lockstep) chosen(b *models.Batch, ids []int32) error {
	if got := l.outs[0].IDs; len(got) != len(b.Logits) || len(ids) < len(got) {
		return fmt.Errorf("lockstep: rank 0 chose %d tokens for %d rows", len(got), len(b.Logits))
	}
	copy(ids, l.outs[0].IDs)
	return nil
}

// run sends the step to every rank (greedy with argmax, drawn as rows
// says when rows is not nil, returning the logits rows read names) and
// waits for all of them. Every rank gets the same plan, Continues and next
// draws included, so ranks that queue the next step ahead
// (Shard.QueueAhead) all queue it, or all drop it.
func (l *Lockstep) run(ctx context.Context, b *models.Batch, argmax bool, rows []gpu.SampleRow, read []int32) error {
	l.step++
	// The ranks share the plan's memory, which the scheduler reuses next
	// step: they get a copy of the engine's own.
	l.plan.copyOf(b, rows, read)
	msg := ForwardMsg{Step: l.step, Tokens: l.plan.tokens, Pos: l.plan.pos, Seq: l.plan.seq, Tables: l.plan.tables, Logits: l.plan.logits,
		Argmax: argmax, Continues: b.Continues, Read: l.plan.read}
	if len(read) > 0 {
		msg.Summaries, msg.Top = b.Summaries, b.Top
	}
	if rows != nil {
		msg.Sample = l.plan.rows
		if len(l.plan.next) == len(rows) {
			msg.NextSample = l.plan.next
		}
	}
	if err := l.call(ctx, msg); err != nil {
		return fmt.Errorf("lockstep: %w", err)
	}
	return nil
}

// call sends msg to every rank and waits for all of them; their replies
// are left in l.outs. A rank that fails, a step past StepTimeout or the
// end of ctx aborts the group, and once every rank has returned the group
// is reset.
func (l *Lockstep) call(ctx context.Context, msg ForwardMsg) error {
	var abortOnce sync.Once
	var why error // the first abort's reason; read after the watchdogs stop
	abort := func(err error) { abortOnce.Do(func() { why = err; l.group.Abort(err) }) }
	step := msg.Step
	timer := time.AfterFunc(l.StepTimeout, func() {
		abort(fmt.Errorf("step %d: a rank did not finish within %v", step, l.StepTimeout))
	})
	stopCtx := context.AfterFunc(ctx, func() { abort(fmt.Errorf("step %d: %w", step, context.Cause(ctx))) })
	var wg sync.WaitGroup
	for i, ref := range l.ranks {
		l.errs[i], l.outs[i] = nil, ForwardReply{}
		wg.Go(func() {
			r, err := actors.Ask(context.WithoutCancel(ctx), ref, shardCall, msg)
			if err != nil {
				err = fmt.Errorf("rank %d: %w", i, err)
				// The other ranks may wait for this one in a collective.
				abort(err)
			}
			l.errs[i], l.outs[i] = err, r
		})
	}
	wg.Wait()
	err := errors.Join(l.errs...)
	// A watchdog that fired aborted the group, even if every rank was done.
	timerFired, ctxFired := !timer.Stop(), !stopCtx()
	if timerFired || ctxFired {
		// Wait for the watchdog's abort to finish before reading why.
		abortOnce.Do(func() {})
		err = errors.Join(why, err)
	}
	if err != nil {
		if rerr := l.group.Reset(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("reset: %w", rerr))
		}
		return err
	}
	return nil
}

// TPStage is a pipeline stage run by tensor-parallel ranks of this
// process: an actor of kind shard, like a layer-shard, that answers each
// forward call (from a Pipeline here, or over the bus from another node)
// by running it on every rank in lock-step, as Lockstep runs a step, and
// replying with rank 0's reply. A Pipeline takes it for any stage, micro-
// batches included: each rank publishes every micro-batch's output.
type TPStage struct {
	ID    string
	l     *Lockstep
	about string
}

// NewTPStage is the stage id run by ranks (rank i at index i), whose
// collectives are group's; a call that takes longer than timeout aborts
// the group. about describes it (INFO).
func NewTPStage(id string, ranks []*actors.Ref[ShardCall], group Group, plane *xgmi.Host, timeout time.Duration, about string) (*TPStage, error) {
	l, err := NewLockstep(ranks, group, plane, 0)
	if err != nil {
		return nil, fmt.Errorf("stage %s: %w", id, err)
	}
	l.StepTimeout = timeout
	return &TPStage{ID: id, l: l, about: about}, nil
}

// Props describes the stage's actor: its "forward" endpoint, as a
// layer-shard's; a panic fails the call in flight and restarts it.
func (s *TPStage) Props() actors.Props[ShardCall] {
	return stageProps(s.ID, s.about, func() actors.Actor[ShardCall] { return tpStageActor{s} })
}

type tpStageActor struct{ s *TPStage }

func (a tpStageActor) Receive(_ context.Context, c ShardCall) error {
	defer failOnPanic(c, "stage", a.s.ID)
	// A failed step fails the call; the group is reset for the next, so
	// the actor goes on.
	if err := a.s.l.call(c.Context(), c.Req); err != nil {
		c.Fail(fmt.Errorf("stage %s: %w", a.s.ID, err))
		return nil
	}
	return c.Reply(a.s.l.outs[0])
}
