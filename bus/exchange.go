package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// ExchangeJoin is one rank's part of one round of an Exchange.
type ExchangeJoin struct {
	Round uint64 // 1 for a rank's first AllGather, then 2, ...
	Rank  int
	Ranks int
	Data  []byte
}

// Schema implements Message.
func (ExchangeJoin) Schema() Schema { return Schema{ID: "troupe.exchange.join", Version: 1} }

// ExchangeAll is every rank's part of one round, in rank order.
type ExchangeAll struct {
	Round uint64
	Parts [][]byte
}

// Schema implements Message.
func (ExchangeAll) Schema() Schema { return Schema{ID: "troupe.exchange.all", Version: 1} }

// closeFlush bounds how long Close waits for the server to take rank 0's
// unsubscription.
const closeFlush = 5 * time.Second

// ExchangeConfig configures one rank of an Exchange.
type ExchangeConfig struct {
	// Subject is the exchange's subject, Subjects.Exchange(group): one per
	// group, the same for every rank.
	Subject string
	// Rank is this rank, 0 to Ranks-1. Rank 0 answers the others.
	Rank  int
	Ranks int
	// Timeout bounds an AllGather whose ctx has no deadline. 0 means 30 s.
	Timeout time.Duration
}

// Validate reports a configuration that cannot work.
func (c ExchangeConfig) Validate() error {
	switch {
	case c.Subject == "":
		return errors.New("bus: exchange: empty subject")
	case c.Ranks < 1 || c.Ranks > 1024:
		return fmt.Errorf("bus: exchange: %d ranks, want 1 to 1024", c.Ranks)
	case c.Rank < 0 || c.Rank >= c.Ranks:
		return fmt.Errorf("bus: exchange: rank %d outside %d ranks", c.Rank, c.Ranks)
	case c.Timeout < 0:
		return fmt.Errorf("bus: exchange: negative timeout %v", c.Timeout)
	}
	return nil
}

// Exchange is one rank's end of an all-gather of small byte strings among
// the ranks of a group, over the bus: the device actors whose GPUs form a
// fabric across processes give each other their memory handles through
// it (it implements xgmi.Exchange).
//
// Rank 0 answers the subject: every other rank sends its part of a round
// as a request (ExchangeJoin), which rank 0 holds until every rank's part
// of the round has arrived, and then answers every held request with all
// the parts (ExchangeAll). A rank that starts before rank 0 subscribes
// sends again until ctx ends. A round that does not fill by rank 0's
// deadline fails on rank 0, which answers the ranks that came with an
// error naming the ranks that did not; a rank whose request outlives its
// ctx fails saying rank 0 did not answer.
//
// Rounds are counted per rank: every rank calls AllGather the same number
// of times, one call at a time. Exchange starts no goroutines: rank 0's
// subscription runs on the nats.go goroutine of the subscription, which
// Close ends. The caller owns nc.
type Exchange struct {
	nc  *nats.Conn
	cfg ExchangeConfig
	sub *nats.Subscription // rank 0 only

	callMu sync.Mutex // one AllGather at a time
	round  uint64     // AllGathers begun; guarded by mu on rank 0

	// Rank 0's rounds in progress; mu guards them, round and closed.
	mu     sync.Mutex
	rounds map[uint64]*exchangeRound
	closed bool
}

type exchangeRound struct {
	parts [][]byte
	held  []*nats.Msg // each rank's request, to answer; nil for rank 0
	in    int
	full  chan struct{} // closed when every rank's part is in
}

// NewExchange returns this rank's end of the exchange cfg.Subject. Rank 0
// subscribes at once, so that ranks that start before it is asked to
// AllGather are held rather than sent again.
func NewExchange(ctx context.Context, nc *nats.Conn, cfg ExchangeConfig) (*Exchange, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	e := &Exchange{nc: nc, cfg: cfg, rounds: map[uint64]*exchangeRound{}}
	if cfg.Rank != 0 || cfg.Ranks == 1 {
		return e, nil
	}
	sub, err := nc.Subscribe(cfg.Subject, e.join)
	if err != nil {
		return nil, fmt.Errorf("bus: exchange %s: %w", cfg.Subject, err)
	}
	e.sub = sub
	if err := Flush(ctx, nc); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("bus: exchange %s: %w", cfg.Subject, err)
	}
	return e, nil
}

// Rank is this rank.
func (e *Exchange) Rank() int { return e.cfg.Rank }

// Ranks is the number of ranks.
func (e *Exchange) Ranks() int { return e.cfg.Ranks }

// Close stops rank 0 answering; requests it holds get CodeUnavailable.
// AllGathers in progress fail. It returns once the server has dropped
// rank 0's subscription (or after closeFlush).
func (e *Exchange) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	rounds := e.rounds
	e.rounds = map[uint64]*exchangeRound{}
	e.mu.Unlock()
	var err error
	if e.sub != nil {
		err = e.sub.Unsubscribe()
		if err == nil {
			// Until the server has the unsubscription, it would deliver
			// requests meant for a later rank 0 (a group formed again on
			// this subject) here, where they are dropped, instead of
			// answering that no one listens, which makes a rank ask again.
			err = e.nc.FlushTimeout(closeFlush)
		}
	}
	for _, rd := range rounds {
		rd.fail(Errorf(CodeUnavailable, "exchange %s: rank 0 closed", e.cfg.Subject))
	}
	if err != nil {
		return fmt.Errorf("bus: exchange %s: close: %w", e.cfg.Subject, err)
	}
	return nil
}

// AllGather implements xgmi.Exchange: it gives mine (at most a few hundred
// KiB: the parts of all ranks travel in one message) to every rank and
// returns every rank's part, in rank order.
func (e *Exchange) AllGather(ctx context.Context, mine []byte) ([][]byte, error) {
	e.callMu.Lock()
	defer e.callMu.Unlock()
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("bus: exchange %s: closed", e.cfg.Subject)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.cfg.Timeout)
		defer cancel()
	}
	if mine == nil {
		mine = []byte{}
	}
	if e.cfg.Ranks == 1 {
		e.round++
		return [][]byte{slices.Clone(mine)}, nil
	}
	if e.cfg.Rank == 0 {
		return e.gather(ctx, mine)
	}
	return e.send(ctx, mine)
}

// send is AllGather on ranks other than 0.
func (e *Exchange) send(ctx context.Context, mine []byte) ([][]byte, error) {
	e.round++
	req := ExchangeJoin{Round: e.round, Rank: e.cfg.Rank, Ranks: e.cfg.Ranks, Data: mine}
	wrap := func(err error) error {
		return fmt.Errorf("bus: exchange %s: rank %d, round %d: %w", e.cfg.Subject, e.cfg.Rank, e.round, err)
	}
	backoff := time.Millisecond
	for {
		all, err := Request[ExchangeJoin, ExchangeAll](ctx, e.nc, e.cfg.Subject, req)
		if err == nil {
			if all.Round != e.round || len(all.Parts) != e.cfg.Ranks {
				return nil, wrap(fmt.Errorf("rank 0 answered round %d with %d parts", all.Round, len(all.Parts)))
			}
			return all.Parts, nil
		}
		if !errors.Is(err, nats.ErrNoResponders) {
			if ctx.Err() != nil {
				return nil, wrap(fmt.Errorf("rank 0 did not answer (%w)", err))
			}
			return nil, wrap(err)
		}
		// Rank 0 is not subscribed yet (or not any more): ask again.
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, wrap(fmt.Errorf("rank 0 is not there (no responders on the subject): %w", ctx.Err()))
		case <-t.C:
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// gather is AllGather on rank 0.
func (e *Exchange) gather(ctx context.Context, mine []byte) ([][]byte, error) {
	e.mu.Lock()
	e.round++
	round := e.round
	rd := e.roundLocked(round)
	rd.parts[0] = slices.Clone(mine)
	rd.arrived()
	e.mu.Unlock()

	var err error
	select {
	case <-rd.full:
	case <-ctx.Done():
		err = ctx.Err()
	}
	e.mu.Lock()
	if err != nil {
		select {
		case <-rd.full: // it filled as ctx ended
			err = nil
		default:
		}
	}
	if e.rounds[round] != rd { // Close took it
		e.mu.Unlock()
		return nil, fmt.Errorf("bus: exchange %s: round %d: closed", e.cfg.Subject, round)
	}
	delete(e.rounds, round)
	e.mu.Unlock()
	if err != nil {
		var missing []int
		for q, p := range rd.parts {
			if p == nil {
				missing = append(missing, q)
			}
		}
		gave := fmt.Errorf("exchange %s: round %d: ranks %v did not arrive before rank 0's deadline", e.cfg.Subject, round, missing)
		rd.fail(&Error{Code: CodeDeadline, Description: gave.Error()})
		return nil, fmt.Errorf("bus: %w: %w", gave, err)
	}
	all := ExchangeAll{Round: round, Parts: rd.parts}
	data, err := Encode(all)
	if err == nil {
		err = CheckPayload(e.nc, data)
	}
	if err != nil {
		rd.fail(Errorf(CodeBadRequest, "exchange %s: round %d: %w", e.cfg.Subject, round, err))
		return nil, fmt.Errorf("bus: exchange %s: round %d: %w", e.cfg.Subject, round, err)
	}
	var errs []error
	for q, m := range rd.held {
		if m == nil {
			continue
		}
		if err := m.Respond(data); err != nil {
			errs = append(errs, fmt.Errorf("answer rank %d: %w", q, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bus: exchange %s: round %d: %w", e.cfg.Subject, round, err)
	}
	out := make([][]byte, len(rd.parts))
	for q, p := range rd.parts {
		out[q] = slices.Clone(p)
	}
	return out, nil
}

// roundLocked returns rank 0's state of round, making it if need be.
func (e *Exchange) roundLocked(round uint64) *exchangeRound {
	rd := e.rounds[round]
	if rd == nil {
		rd = &exchangeRound{parts: make([][]byte, e.cfg.Ranks), held: make([]*nats.Msg, e.cfg.Ranks), full: make(chan struct{})}
		e.rounds[round] = rd
	}
	return rd
}

func (rd *exchangeRound) arrived() {
	if rd.in++; rd.in == len(rd.parts) {
		close(rd.full)
	}
}

// fail answers every held request with err.
func (rd *exchangeRound) fail(err error) {
	for _, m := range rd.held {
		if m != nil {
			_ = RespondError(m, err)
		}
	}
}

// join is rank 0's handler of the other ranks' requests.
func (e *Exchange) join(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	var req ExchangeJoin
	if err := Decode(m.Data, &req); err != nil {
		_ = RespondError(m, Errorf(CodeBadRequest, "%w", err))
		return
	}
	reject := func(code Code, format string, args ...any) {
		_ = RespondError(m, Errorf(code, "exchange %s: rank %d, round %d: "+format, append([]any{e.cfg.Subject, req.Rank, req.Round}, args...)...))
	}
	switch {
	case req.Ranks != e.cfg.Ranks:
		reject(CodeBadRequest, "the rank counts %d ranks, rank 0 %d", req.Ranks, e.cfg.Ranks)
		return
	case req.Rank < 1 || req.Rank >= e.cfg.Ranks:
		reject(CodeBadRequest, "rank outside 1 to %d", e.cfg.Ranks-1)
		return
	case req.Data == nil:
		req.Data = []byte{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.closed:
		reject(CodeUnavailable, "rank 0 closed")
		return
	case req.Round == 0 || req.Round > e.round+1:
		reject(CodeConflict, "rank 0 is at round %d", e.round)
		return
	case req.Round <= e.round && e.rounds[req.Round] == nil:
		reject(CodeConflict, "the round is over on rank 0 (it is at round %d)", e.round)
		return
	}
	rd := e.roundLocked(req.Round)
	if rd.parts[req.Rank] != nil {
		reject(CodeConflict, "the rank joined the round twice (do two processes claim it?)")
		return
	}
	rd.parts[req.Rank] = req.Data
	rd.held[req.Rank] = m
	rd.arrived()
}
