package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/xgmi"
	"go.opentelemetry.io/otel/attribute"
)

// Micro-batches. A step through a pipeline of S stages, run whole, keeps
// each stage busy 1/S of the step. Cut into M micro-batches of whole
// sequences, the step runs as a wavefront: stage s works on micro-batch m
// while stage s+1 works on m-1, and a stage idles (S-1)/(M+S-1) of the
// step instead of (S-1)/S, when the stages run on devices of their own.
// The KV cache is per sequence, so sequences may run in any grouping;
// each stage still sees the micro-batches one after the other, in order.
// The price: a stage reads its weights once per pass, so where a pass
// costs mostly that read (decode at small batches) M micro-batches cost
// nearly M times the work, which only hosts that would idle can absorb.
// Off by default (docs/benchmarks.md, "Micro-batches").

// DefaultMicroBatches is Pipeline.MicroBatches as NewPipeline sets it: off.
const DefaultMicroBatches = 1

// MaxMicroBatches bounds the micro-batches of a step, and so the output
// buffers that a layer-shard keeps on its plane.
const MaxMicroBatches = 64

// AttrMicroBatch is the micro-batch (from 0) of a shard.forward span of a
// step cut into micro-batches.
const AttrMicroBatch = attribute.Key("shard.micro_batch")

// outputName is the plane buffer of shard id's output for ForwardMsg.Micro
// micro: one per micro-batch, so that a micro-batch's activations are not
// overwritten by the next while the following stage reads them.
func outputName(id string, micro int) string {
	if micro == 0 {
		return "shard/" + id
	}
	return "shard/" + id + "/micro/" + strconv.Itoa(micro-1)
}

// microBatch is one micro-batch of a step: whole sequences of the batch,
// their rows in the batch's order with Seq counted from the first of them
// and Logits naming its own rows; rows are the batch's logits rows that
// its logits rows fill, in order.
type microBatch struct {
	b    models.Batch
	rows []int32
}

// microPlan cuts steps into micro-batches, in memory that it reuses from
// step to step and that only the pipeline's stages read.
type microPlan struct {
	parts                          []microBatch
	tokens, pos, seq, logits, rows []int32
	tables                         [][]int32
	flat                           []int32 // the tables' entries
	perSeq, group                  []int32 // each sequence's rows; its micro-batch
	first                          []int32 // each micro-batch's first sequence
	at                             []int32 // each batch row's index in its micro-batch
	count, lcount                  []int   // rows and logits rows of each micro-batch
	start, next, lnext             []int   // where each micro-batch's rows start; where its next row and logits row go
}

// split cuts b for p's stages, or returns nil to run it whole.
func (p *Pipeline) split(b *models.Batch) []microBatch {
	n := p.MicroBatches
	if n == 0 {
		n = len(p.stages)
	}
	if len(p.stages) < 2 || n < 2 {
		return nil
	}
	return p.micro.split(b, min(n, MaxMicroBatches))
}

// split cuts b into at most n micro-batches of consecutive sequences with
// about as many rows each. It returns nil, to run b whole, for fewer than
// two sequences, or a batch whose indexes do not hold together (a sequence
// without rows, an index out of range): the stages report those.
func (mp *microPlan) split(b *models.Batch, n int) []microBatch {
	nseq, nrow := len(b.Tables), len(b.Pos)
	n = min(n, nseq)
	if n < 2 || len(b.Seq) != nrow || (len(b.Tokens) != 0 && len(b.Tokens) != nrow) {
		return nil
	}
	mp.perSeq = grow(mp.perSeq, nseq)
	perSeq := mp.perSeq
	clear(perSeq)
	for _, sq := range b.Seq {
		if sq < 0 || int(sq) >= nseq {
			return nil
		}
		perSeq[sq]++
	}
	for _, r := range b.Logits {
		if r < 0 || int(r) >= nrow {
			return nil
		}
	}
	// Consecutive sequences to each micro-batch: a micro-batch ends before
	// the sequence that would take it further past its share of the rows
	// than it falls short without it, or where the sequences left are just
	// enough for the micro-batches left.
	mp.group, mp.first = grow(mp.group, nseq), grow(mp.first, n)
	g, cum := 0, 0 // cum: the rows of the sequences before s
	mp.first[0] = 0
	for s := range nseq {
		r := int(perSeq[s])
		if r == 0 {
			return nil
		}
		if g < n-1 && s > int(mp.first[g]) {
			share := (g + 1) * nrow // in rows times n
			if nseq-s == n-1-g || (cum+r)*n-share > share-cum*n {
				g++
				mp.first[g] = int32(s)
			}
		}
		mp.group[s] = int32(g)
		cum += r
	}
	mp.count, mp.lcount = growInts(mp.count, n), growInts(mp.lcount, n)
	clear(mp.count)
	clear(mp.lcount)
	for _, sq := range b.Seq {
		mp.count[mp.group[sq]]++
	}
	for _, r := range b.Logits {
		mp.lcount[mp.group[b.Seq[r]]]++
	}
	// Rows, grouped by micro-batch in the batch's order.
	mp.tokens, mp.pos, mp.seq, mp.at = grow(mp.tokens, len(b.Tokens)), grow(mp.pos, nrow), grow(mp.seq, nrow), grow(mp.at, nrow)
	mp.logits, mp.rows = grow(mp.logits, len(b.Logits)), grow(mp.rows, len(b.Logits))
	mp.start, mp.next, mp.lnext = growInts(mp.start, n), growInts(mp.next, n), growInts(mp.lnext, n)
	for g, at, lat := 0, 0, 0; g < n; g++ {
		mp.start[g], mp.next[g], mp.lnext[g] = at, at, lat
		at += mp.count[g]
		lat += mp.lcount[g]
	}
	for i, sq := range b.Seq {
		g := mp.group[sq]
		k := mp.next[g]
		if len(b.Tokens) != 0 {
			mp.tokens[k] = b.Tokens[i]
		}
		mp.pos[k], mp.seq[k] = b.Pos[i], sq-mp.first[g]
		mp.at[i] = int32(k - mp.start[g])
		mp.next[g]++
	}
	for j, r := range b.Logits {
		g := mp.group[b.Seq[r]]
		k := mp.lnext[g]
		mp.logits[k], mp.rows[k] = mp.at[r], int32(j)
		mp.lnext[g]++
	}
	// The tables, copied: a local stage reads them after Forward returns
	// when a step fails.
	mp.flat, mp.tables = copyTables(mp.flat, mp.tables, b.Tables)
	mp.parts = mp.parts[:0]
	for g, at, lat := 0, 0, 0; g < n; g++ {
		end, lend := at+mp.count[g], lat+mp.lcount[g]
		last := nseq
		if g < n-1 {
			last = int(mp.first[g+1])
		}
		part := microBatch{b: models.Batch{
			Pos: mp.pos[at:end:end], Seq: mp.seq[at:end:end],
			Tables: mp.tables[mp.first[g]:last:last], Logits: mp.logits[lat:lend:lend],
		}, rows: mp.rows[lat:lend:lend]}
		if len(b.Tokens) != 0 {
			part.b.Tokens = mp.tokens[at:end:end]
		}
		mp.parts = append(mp.parts, part)
		at, lat = end, lend
	}
	return mp.parts
}

func grow(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n, 2*n)
	}
	return s[:n]
}

func growInts(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n, 2*n)
	}
	return s[:n]
}

// forwardMicro runs a step cut into parts as a wavefront: a goroutine per
// stage sends it the micro-batches in order, each as soon as the previous
// stage's output for it is published, and this one reads the last stage's
// logits as they come, into the batch's rows.
func (p *Pipeline) forwardMicro(ctx context.Context, b *models.Batch, parts []microBatch, logits []float32) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	step, nstage := p.step, len(p.stages)
	// outs[s] carries stage s's outputs in micro-batch order; it holds
	// them all, so that no stage waits on the next.
	outs := make([]chan bus.TensorRef, nstage)
	for s := range outs {
		outs[s] = make(chan bus.TensorRef, len(parts))
	}
	errs := make(chan error, nstage)
	var wg sync.WaitGroup
	for s := range nstage {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m, part := range parts {
				msg := ForwardMsg{Step: step, Micro: m + 1, Pos: part.b.Pos, Seq: part.b.Seq, Tables: part.b.Tables, Logits: part.b.Logits}
				if s == 0 {
					msg.Tokens = part.b.Tokens
				} else {
					select {
					case msg.Input = <-outs[s-1]:
					case <-ctx.Done():
						return
					}
				}
				r, err := p.call(ctx, s, msg)
				if err != nil {
					if ctx.Err() == nil { // not the end of a step failed elsewhere
						errs <- fmt.Errorf("pipeline stage %d, micro-batch %d: %w", s, m, err)
						cancel()
					}
					return
				}
				outs[s] <- r.Output
			}
		}()
	}
	err := p.gather(ctx, outs[nstage-1], parts, len(b.Logits), logits)
	cancel()
	wg.Wait()
	close(errs)
	if first, ok := <-errs; ok {
		err = first // the cause, rather than the cancellation it caused
	}
	if err != nil {
		// A local stage may still read the micro-batches: leave them to it.
		p.micro = microPlan{}
		return err
	}
	return nil
}

// gather reads the last stage's output of each micro-batch, as it comes,
// into the rows of logits that the micro-batch's logits rows stand for.
func (p *Pipeline) gather(ctx context.Context, outs <-chan bus.TensorRef, parts []microBatch, nlogits int, logits []float32) error {
	if len(logits) < nlogits*p.vocab {
		return fmt.Errorf("pipeline logits: room for %d floats, want %d", len(logits), nlogits*p.vocab)
	}
	for m, part := range parts {
		var out bus.TensorRef
		select {
		case out = <-outs:
		case <-ctx.Done():
			return fmt.Errorf("pipeline, micro-batch %d: %w", m, ctx.Err())
		}
		if len(part.rows) == 0 {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, p.StepTimeout)
		got, err := readRef(rctx, p.plane, p.Remote, out)
		cancel()
		if err != nil {
			if errors.Is(err, xgmi.ErrUnreachable) {
				err = bus.Errorf(bus.CodeUnavailable, "%w", err)
			}
			return fmt.Errorf("pipeline logits, micro-batch %d: %w", m, err)
		}
		if want := len(part.rows) * p.vocab; len(got) != want {
			return fmt.Errorf("pipeline logits, micro-batch %d: %d floats, want %d", m, len(got), want)
		}
		for k, row := range part.rows {
			copy(logits[int(row)*p.vocab:int(row+1)*p.vocab], got[k*p.vocab:(k+1)*p.vocab])
		}
	}
	return nil
}

// call sends msg to stage i: through its mailbox when it runs in this
// process and has not stopped, else over the bus; StepTimeout bounds it.
func (p *Pipeline) call(ctx context.Context, i int, msg ForwardMsg) (ForwardReply, error) {
	ctx, cancel := context.WithTimeout(ctx, p.StepTimeout)
	defer cancel()
	if ref := p.local[i]; ref != nil && !stopped(ref) {
		return actors.Ask(ctx, ref, shardCall, msg)
	}
	return bus.Request[ForwardMsg, ForwardReply](ctx, p.nc, p.stages[i], msg)
}
