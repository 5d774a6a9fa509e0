package scheduler

import (
	"context"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/xgmi"
)

// FuzzShardForward sends a shard that queues steps ahead plans built from
// the input, most of them malformed (positions, blocks, sequences, logits
// rows or rows to read out of range or out of order; argmax, drawn or
// logits steps; plans that continue): every plan is answered or refused
// with an error, never a panic, and an answer has a token a logits row
// and the rows it was asked to read.
func FuzzShardForward(f *testing.F) {
	if !demo.Embedded() {
		f.Skip("built without the demo model (nodemo)")
	}
	b, dev := demoOnCPU(f)
	m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{MaxTokens: 64, MaxSeqs: 4})
	if err != nil {
		f.Fatal(err)
	}
	defer m.Close()
	cache, err := m.NewCache(8, 16)
	if err != nil {
		f.Fatal(err)
	}
	defer cache.Close()
	s := NewShard("fuzz", 0, m, cache, xgmi.NewHost("n"), nil)
	s.QueueAhead = true
	defer s.dropAhead()
	V := b.Config.Vocab
	// Two sequences of one token each at positions 3 and 5: greedy, both
	// rows read, continuing; drawn, the second row read; a logits step;
	// and rows to read out of order.
	f.Add([]byte{2, 7, 3, 0, 9, 5, 1, 2, 0, 1, 2, 3, 2, 0, 1, 2, 0, 1, 0, 1})
	f.Add([]byte{2, 7, 3, 0, 9, 5, 1, 2, 0, 1, 2, 3, 2, 0, 1, 1, 1, 1, 40, 100, 0, 200, 1})
	f.Add([]byte{2, 7, 3, 0, 9, 5, 1, 2, 0, 1, 2, 3, 2, 0, 1, 0, 2, 0})
	f.Add([]byte{1, 255, 200, 3, 1, 0, 3, 2, 1, 3, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		i := 0
		next := func() int {
			if i >= len(data) {
				return 0
			}
			i++
			return int(data[i-1])
		}
		var msg ForwardMsg
		n := next() % 5
		for range n {
			msg.Tokens = append(msg.Tokens, int32(next()*V/200))
			msg.Pos = append(msg.Pos, int32(next()%70))
			msg.Seq = append(msg.Seq, int32(next()%3))
		}
		for range next() % 3 {
			msg.Tables = append(msg.Tables, []int32{int32(next() % 10), int32(next() % 10)})
		}
		for range next() % 4 {
			msg.Logits = append(msg.Logits, int32(next()%5))
		}
		for range next() % 4 {
			msg.Read = append(msg.Read, int32(next()%4))
		}
		if t := next(); t%2 == 1 {
			// Summaries of up to 24 tokens: the last few too many.
			msg.Summaries, msg.Top = true, t/2%25
		}
		switch next() % 3 {
		case 0:
			msg.Argmax = true
		case 1:
			for range msg.Logits {
				msg.Sample = append(msg.Sample, gpu.SampleRow{Temperature: 0.9, TopK: int32(next()), U: float64(next()) / 256})
			}
		}
		msg.Continues = next()%2 == 1
		reply, err := s.Forward(context.Background(), msg)
		if err != nil {
			return
		}
		if msg.Argmax || len(msg.Sample) > 0 {
			if len(reply.IDs) != len(msg.Logits) {
				t.Fatalf("plan %+v: %d tokens for %d rows", msg, len(reply.IDs), len(msg.Logits))
			}
			w := V
			if msg.Summaries {
				w = gpu.SummaryWidth(msg.Top)
			}
			if len(msg.Read) > 0 && reply.Output.Bytes != uint64(4*len(msg.Read)*w) {
				t.Fatalf("plan %+v: %d bytes of rows for %d rows read", msg, reply.Output.Bytes, len(msg.Read))
			}
		}
	})
}
