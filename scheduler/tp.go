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

// Lockstep is the Engine of a tensor-parallel replica: one or more
// pipeline stages in layer order, each a group of ranks that are
// layer-shard actors of this process, rank i of a stage owning its slice
// of every layer of the stage on its own device. A step goes to every
// rank of the first stage at once, then to every rank of the next, which
// read the activations rank 0 of the stage before published; the
// collectives inside each pass keep a stage's ranks in lock-step, and
// rank 0's output is the stage's (every rank computes the same one).
//
// A rank that fails or panics fails the step for all: Lockstep aborts its
// stage's collectives so that no rank is left waiting in one, waits for
// every rank of the stage, resets the stage's group and returns the error.
// The scheduler fails the step's requests as after any failed step (their
// KV blocks go back), the supervisor restarts a rank that panicked, and
// the next requests prefill afresh on every rank.
type Lockstep struct {
	// StepTimeout bounds each stage's pass: past it the stage's group is
	// aborted, which fails the step on every rank that waits in a
	// collective.
	StepTimeout time.Duration

	stages []LockstepStage
	plane  *xgmi.Host
	vocab  int
	step   uint64
	plan   plan
	errs   []error
	outs   []ForwardReply // the last stage's replies, rank by rank
}

// LockstepStage is a stage of a tensor-parallel replica: its ranks (rank
// i at index i) and their collectives' group.
type LockstepStage struct {
	Ranks []*actors.Ref[ShardCall]
	Group Group
}

// NewLockstep drives stages, in layer order.
func NewLockstep(stages []LockstepStage, plane *xgmi.Host, vocab int) (*Lockstep, error) {
	if len(stages) == 0 {
		return nil, fmt.Errorf("lockstep: no stages")
	}
	most := 0
	for i, st := range stages {
		if len(st.Ranks) == 0 || st.Group == nil {
			return nil, fmt.Errorf("lockstep: stage %d: %d ranks and group %v", i, len(st.Ranks), st.Group)
		}
		most = max(most, len(st.Ranks))
	}
	return &Lockstep{StepTimeout: 30 * time.Second, stages: stages, plane: plane, vocab: vocab,
		errs: make([]error, most), outs: make([]ForwardReply, most)}, nil
}

// Forward implements Engine. The ranks' passes run without a deadline of
// their own: when StepTimeout passes or ctx ends, the group is aborted,
// which ends every wait in a collective, and Forward waits for every rank
// to return before it resets the group. So no pass of a failed step is
// left to run on the reset group, where it would take the place of the
// next step's.
func (l *Lockstep) Forward(ctx context.Context, b *models.Batch, logits []float32) error {
	if err := l.run(ctx, b, false, nil); err != nil || len(b.Logits) == 0 {
		return err
	}
	rows, err := readRef(ctx, l.plane, nil, l.outs[0].Output)
	if err != nil {
		return fmt.Errorf("lockstep logits: %w", err)
	}
	if want := len(b.Logits) * l.vocab; len(rows) != want {
		return fmt.Errorf("lockstep logits: %d floats, want %d", len(rows), want)
	}
	copy(logits, rows)
	return nil
}

// ForwardArgmax implements ArgmaxEngine: every rank chooses the tokens
// from the whole logits rows it holds, and rank 0's choice is the step's.
func (l *Lockstep) ForwardArgmax(ctx context.Context, b *models.Batch, ids []int32) error {
	if err := l.run(ctx, b, true, nil); err != nil {
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
	if err := l.run(ctx, b, false, rows); err != nil {
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

// run sends the step through the stages in turn (greedy with argmax,
// drawn as rows says when rows is not nil); each stage goes to every one
// of its ranks, and the next stage starts once all of them are done.
// Every rank gets the same plan, Continues and next draws included, so
// ranks that queue the next step ahead (Shard.QueueAhead) all queue it,
// or all drop it.
func (l *Lockstep) run(ctx context.Context, b *models.Batch, argmax bool, rows []gpu.SampleRow) error {
	l.step++
	// The ranks share the plan's memory, which the scheduler reuses next
	// step: they get a copy of the engine's own.
	l.plan.copyOf(b, rows)
	msg := ForwardMsg{Step: l.step, Tokens: l.plan.tokens, Pos: l.plan.pos, Seq: l.plan.seq, Tables: l.plan.tables, Logits: l.plan.logits,
		Continues: b.Continues}
	for i := range l.stages {
		last := i == len(l.stages)-1
		if i > 0 {
			msg.Tokens, msg.Input = nil, l.outs[0].Output
		}
		msg.Argmax = argmax && last
		if rows != nil && last {
			msg.Sample = l.plan.rows
			if len(l.plan.next) == len(rows) {
				msg.NextSample = l.plan.next
			}
		}
		if err := l.stage(ctx, i, msg); err != nil {
			if len(l.stages) > 1 {
				err = fmt.Errorf("stage %d: %w", i, err)
			}
			return fmt.Errorf("lockstep: %w", err)
		}
	}
	return nil
}

// stage runs msg on every rank of stage i and waits for all of them; their
// replies are left in l.outs.
func (l *Lockstep) stage(ctx context.Context, i int, msg ForwardMsg) error {
	st := l.stages[i]
	var abortOnce sync.Once
	var why error // the first abort's reason; read after the watchdogs stop
	abort := func(err error) { abortOnce.Do(func() { why = err; st.Group.Abort(err) }) }
	step := l.step
	timer := time.AfterFunc(l.StepTimeout, func() {
		abort(fmt.Errorf("step %d: a rank did not finish within %v", step, l.StepTimeout))
	})
	stopCtx := context.AfterFunc(ctx, func() { abort(fmt.Errorf("step %d: %w", step, context.Cause(ctx))) })
	var wg sync.WaitGroup
	for r, ref := range st.Ranks {
		l.errs[r], l.outs[r] = nil, ForwardReply{}
		wg.Go(func() {
			rep, err := actors.Ask(context.WithoutCancel(ctx), ref, shardCall, msg)
			if err != nil {
				err = fmt.Errorf("rank %d: %w", r, err)
				// The other ranks may wait for this one in a collective.
				abort(err)
			}
			l.errs[r], l.outs[r] = err, rep
		})
	}
	wg.Wait()
	err := errors.Join(l.errs[:len(st.Ranks)]...)
	// A watchdog that fired aborted the group, even if every rank was done.
	timerFired, ctxFired := !timer.Stop(), !stopCtx()
	if timerFired || ctxFired {
		// Wait for the watchdog's abort to finish before reading why.
		abortOnce.Do(func() {})
		err = errors.Join(why, err)
	}
	if err != nil {
		if rerr := st.Group.Reset(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("reset: %w", rerr))
		}
		return err
	}
	return nil
}
