package scheduler

import (
	"context"
	"slices"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
)

// A layer-shard holding a whole model, or one tensor-parallel rank of it,
// on a GPU (Shard.QueueAhead, and a model that chains steps:
// models.Model.Chains, ChainsDraws) issues a greedy or drawn step and,
// before it waits for the step's choices, queues the step that would
// follow, when the plan says the same sequences decode next
// (models.Batch.Continues; a drawn step's plan also carries the next
// step's draws, NextDraws): the same sequences one position on, each fed
// on the device the token just chosen for it. When the scheduler's next
// step is that one (no sequence stopped or changed its blocks), its
// choices are already on their way and the device has not waited for the
// host between the two steps; the step after it is queued in turn. When
// it is that one less the sequences that ended at their last token (an
// end-of-sequence token, a stop string, a cancel), it answers the others'
// rows too, and the next step goes through the host once. Otherwise the
// queued step is dropped: the only cache rows it wrote lie
// one position past what its sequences hold, and whatever the scheduler
// runs next on those positions overwrites them, after it on the device.
// The ranks of a Lockstep get the same plans, so they decide alike, and
// the collectives of their queued steps pair up. A draw whose penalties
// and bias depend on the tokens follows the step before
// (gpu.SampleRow.Follows): the device keeps and updates its list, and the
// shard works out on the host, once it reads a step's tokens, what the
// queued step's lists were, to match them with the plan's. A step that
// returns some logits rows (models.Batch.Read: sequences that report
// log-probabilities) queues the next reading the same rows, late, into
// the shard's memory; the plan that it answers may ask for those rows or
// fewer, in the same form (raw, or summarized alike: models.Batch.Summaries).

// aheadStep is a step queued before it was asked for.
type aheadStep struct {
	pos, seq []int32
	tables   [][]int32       // each row's blocks up to its position
	rows     []gpu.SampleRow // its draws; nil for a greedy step
	fed      []int32         // the tokens it embeds: the choices of the step before
	ids      []int32         // its choices, once wait returns
	read     []int32         // the logits rows it reads (models.Batch.Read)
	summary  bool            // as summaries (models.Batch.Summaries)
	top      int             // of this many most likely tokens
	logits   []float32       // those rows, once wait returns
	wait     func() error
}

// chained runs step b into ids, greedy (rows nil) or drawn as rows say,
// and the logits rows b.Read names into the shard's output (s.out(0, …)),
// queueing the next step, and says how b was met (trace.AttrShardAhead).
// It runs on the shard's device, under s.mu.
func (s *Shard) chained(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32) (string, error) {
	var wait func() error
	how := "issued"
	W := b.ReadWidth(s.model.Config.Vocab)
	logits := s.out(0, len(b.Read)*W)
	idx, ok := s.ahead.rowsOf(b, rows)
	var at []int
	if ok {
		at, ok = s.ahead.readAt(b, idx)
	}
	if ok {
		a := s.ahead
		s.ahead = nil
		s.aheadUsed++
		how = "answered"
		wait = func() error {
			err := a.wait()
			for i, j := range idx {
				ids[i] = a.ids[j]
			}
			inOrder := len(at) > 0
			for k, j := range at {
				inOrder = inOrder && j == k
			}
			if inOrder {
				// Each row where a holds it: a's memory becomes the
				// output, and the output's the next queued step's.
				s.outs[0], s.spare = a.logits, s.outs[0]
				return err
			}
			for k, j := range at {
				copy(logits[k*W:(k+1)*W], a.logits[j*W:(j+1)*W])
			}
			s.spare = a.logits
			return err
		}
	} else {
		if s.ahead != nil {
			how = "dropped"
		}
		s.dropAhead()
		w, err := s.model.IssueStep(ctx, s.cache, b, rows, false, ids, logits)
		if err != nil {
			return how, err
		}
		wait = w
	}
	s.queueAhead(ctx, b, rows != nil)
	if err := wait(); err != nil {
		s.dropAhead()
		return how, err
	}
	if a := s.ahead; a != nil {
		a.fed = append(a.fed[:0], ids[:len(b.Logits)]...)
		if a.rows != nil {
			// The queued draws' lists, where they follow this step's
			// (updated on the device), are now known.
			r, err := gpu.FollowRows(rows, a.fed, a.rows)
			if err != nil {
				s.dropAhead()
				return how, nil
			}
			a.rows = r
		}
	}
	return how, nil
}

// queueAhead queues the step after b when the scheduler means to run it
// (models.Batch.Continues, with the next draws after a drawn step) and b
// is a decode step (one token of each of its sequences, each token's
// logits row its own) whose sequences' blocks hold the next position.
func (s *Shard) queueAhead(ctx context.Context, b *models.Batch, drawn bool) {
	n, bs := len(b.Pos), s.cache.BlockSize
	if !b.Continues || n == 0 || len(b.Logits) != n || len(b.Seq) != n || (drawn && len(b.NextDraws) != n) {
		return
	}
	a := &aheadStep{pos: make([]int32, n), seq: slices.Clone(b.Seq), tables: make([][]int32, len(b.Tables)), ids: make([]int32, n),
		read: slices.Clone(b.Read), summary: b.Summaries, top: b.Top}
	if len(a.read) > 0 {
		need := len(a.read) * b.ReadWidth(s.model.Config.Vocab)
		a.logits, s.spare = s.spare, nil
		if cap(a.logits) < need {
			a.logits = make([]float32, need)
		}
		a.logits = a.logits[:need]
	}
	if drawn {
		a.rows = slices.Clone(b.NextDraws)
	}
	for i := range n {
		if b.Logits[i] != int32(i) || b.Seq[i] < 0 || int(b.Seq[i]) >= len(b.Tables) || a.tables[b.Seq[i]] != nil {
			return
		}
		p := int(b.Pos[i]) + 1
		t := b.Tables[b.Seq[i]]
		if p/bs >= len(t) || t[p/bs] < 0 || int(t[p/bs]) >= s.cache.NumBlocks {
			return
		}
		a.pos[i] = int32(p)
		a.tables[b.Seq[i]] = slices.Clone(t[:p/bs+1])
	}
	next := &models.Batch{Tokens: make([]int32, n), Pos: a.pos, Seq: a.seq, Tables: a.tables, Logits: b.Logits, Read: a.read,
		Summaries: a.summary, Top: a.top}
	for i := range a.tables {
		if a.tables[i] == nil {
			a.tables[i] = []int32{} // a row no token reads
		}
	}
	wait, err := s.model.IssueStep(ctx, s.cache, next, a.rows, true, a.ids, a.logits)
	if err != nil {
		// Nothing is queued, or a step whose choices nobody reads: the
		// next step is issued as asked.
		return
	}
	a.wait = wait
	s.ahead = a
}

// rowsOf matches b, drawn as rows say (nil: greedy), with the step a
// computes: for each of b's rows, in order, the row of a that is the same
// sequence at the same position, fed the token it was fed, over the same
// blocks, with the same draw. b may leave out rows of a (sequences that
// ended at their last token): their choices are not read. A step that left
// some out cannot feed the next one on the device (IssueStep needs the
// same rows), so nothing is queued after it.
func (a *aheadStep) rowsOf(b *models.Batch, rows []gpu.SampleRow) ([]int, bool) {
	if a == nil {
		return nil, false
	}
	n := len(b.Pos)
	if n == 0 || n > len(a.pos) || len(b.Tokens) != n || len(b.Seq) != n || len(b.Logits) != n || len(a.fed) != len(a.pos) ||
		(rows == nil) != (a.rows == nil) || (rows != nil && len(rows) != n) {
		return nil, false
	}
	idx := make([]int, n)
	j := 0
	for i := range n {
		if b.Logits[i] != int32(i) || b.Seq[i] < 0 || int(b.Seq[i]) >= len(b.Tables) {
			return nil, false
		}
		t := b.Tables[b.Seq[i]]
		// The rows keep their order; each sequence's block at its
		// position is its own, so the first row that matches is its row.
		for ; j < len(a.pos); j++ {
			u := a.tables[a.seq[j]]
			if b.Pos[i] == a.pos[j] && b.Tokens[i] == a.fed[j] && len(t) >= len(u) && slices.Equal(t[:len(u)], u) &&
				(rows == nil || rows[i].Equal(a.rows[j])) {
				break
			}
		}
		if j == len(a.pos) {
			return nil, false
		}
		idx[i] = j
		j++
	}
	return idx, true
}

// readAt says, for each row of b.Read (rows of a step whose rows are a's
// rows idx), which of the rows a read holds it, or false where a did not
// read one, or read its rows in another form (raw or summarized, and of
// how many tokens).
func (a *aheadStep) readAt(b *models.Batch, idx []int) ([]int, bool) {
	if len(b.Read) > 0 && (b.Summaries != a.summary || b.Summaries && b.Top != a.top) {
		return nil, false
	}
	at := make([]int, len(b.Read))
	for k, r := range b.Read {
		if r < 0 || int(r) >= len(idx) {
			return nil, false
		}
		j := slices.Index(a.read, int32(idx[r]))
		if j < 0 {
			return nil, false
		}
		at[k] = j
	}
	return at, true
}

// dropAhead waits for the queued step's read, if any, and forgets it.
func (s *Shard) dropAhead() {
	if a := s.ahead; a != nil {
		s.ahead = nil
		s.aheadDropped++
		_ = a.wait() // a device error stays for the next step to report
	}
}
