package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/troupe/troupe/actors"
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
// every rank, resets the group and returns the error; the scheduler then
// re-prefills the step's sequences as after any failed step, and the
// supervisor has restarted a rank that panicked.
type Lockstep struct {
	// StepTimeout bounds one rank's pass; a rank that does not answer in
	// time fails the step.
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

// Forward implements Engine.
func (l *Lockstep) Forward(ctx context.Context, b *models.Batch, logits []float32) error {
	l.step++
	// The ranks share the plan's memory, which the scheduler reuses next
	// step: they get a copy of the pipeline's own.
	l.plan.copyOf(b)
	msg := ForwardMsg{Step: l.step, Tokens: l.plan.tokens, Pos: l.plan.pos, Seq: l.plan.seq, Tables: l.plan.tables, Logits: l.plan.logits}
	var wg sync.WaitGroup
	var once sync.Once
	for i, ref := range l.ranks {
		l.errs[i], l.outs[i] = nil, ForwardReply{}
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, l.StepTimeout)
			defer cancel()
			r, err := actors.Ask(sctx, ref, shardCall, msg)
			if err != nil {
				err = fmt.Errorf("rank %d: %w", i, err)
				// The other ranks may wait for this one in a collective.
				once.Do(func() { l.group.Abort(err) })
			}
			l.errs[i], l.outs[i] = err, r
		})
	}
	wg.Wait()
	if err := errors.Join(l.errs...); err != nil {
		// A rank that timed out may still hold the copy: leave it to it.
		l.plan = plan{}
		if rerr := l.group.Reset(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("lockstep: reset: %w", rerr))
		}
		return fmt.Errorf("lockstep: %w", err)
	}
	if len(b.Logits) == 0 {
		return nil
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
