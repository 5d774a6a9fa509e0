package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// pollResponse gets response id until its status is no longer queued or
// in progress.
func pollResponse(t *testing.T, c openai.Client, id string) *responses.Response {
	t.Helper()
	var got *responses.Response
	waitFor(t, "response "+id+" to end", func() bool {
		var err error
		got, err = c.Responses.Get(t.Context(), id, responses.ResponseGetParams{})
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		return got.Status != responses.ResponseStatusQueued && got.Status != responses.ResponseStatusInProgress
	})
	return got
}

func wantAPIStatus(t *testing.T, what string, err error, status int) {
	t.Helper()
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != status {
		t.Errorf("%s: %v, want a %d", what, err, status)
	}
}

// TestSDKBackground: a background response is answered at once as queued,
// is listed and polled while it waits, cannot be continued before it
// ends, and ends with the output a foreground request gets; cancelling it
// then answers it as it ended. Requests that cannot run in the background
// are refused.
func TestSDKBackground(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].ContextLength = 1024
	b := &echoBackend{gate: make(chan struct{})}
	env := newEnv(t, cfg, b)
	c := sdkClient(env, "k")
	input := responses.ResponseNewParamsInputUnion{OfString: openai.String("hello there")}
	bg, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Input: input, Background: openai.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if bg.Status != responses.ResponseStatusQueued || !bg.Background || len(bg.Output) != 0 || !strings.Contains(bg.RawJSON(), `"store":true`) {
		t.Errorf("background response answered as %s", bg.RawJSON())
	}
	got, err := c.Responses.Get(t.Context(), bg.ID, responses.ResponseGetParams{})
	if err != nil || (got.Status != responses.ResponseStatusQueued && got.Status != responses.ResponseStatusInProgress) {
		t.Errorf("get while waiting: %v, %s", err, got.RawJSON())
	}
	items, err := c.Responses.InputItems.List(t.Context(), bg.ID, responses.InputItemListParams{})
	if err != nil || len(items.Data) != 1 || items.Data[0].AsMessage().Content[0].Text != "hello there" {
		t.Errorf("input items while waiting: %v, %+v", err, items)
	}
	_, err = c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Input: input, PreviousResponseID: openai.String(bg.ID)})
	wantAPIStatus(t, "continuing a response still in progress", err, http.StatusBadRequest)

	close(b.gate)
	done := pollResponse(t, c, bg.ID)
	fg, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Input: input})
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != responses.ResponseStatusCompleted || done.OutputText() != fg.OutputText() || fg.OutputText() == "" ||
		done.Usage.OutputTokens != fg.Usage.OutputTokens || !done.Background || fg.Background {
		t.Errorf("background response ended as\n%s\nwhere the same request in the foreground is\n%s", done.RawJSON(), fg.RawJSON())
	}
	again, err := c.Responses.Cancel(t.Context(), bg.ID)
	if err != nil || again.RawJSON() != done.RawJSON() {
		t.Errorf("cancel after the end: %v\n%s\nwant\n%s", err, again.RawJSON(), done.RawJSON())
	}
	_, err = c.Responses.Cancel(t.Context(), fg.ID)
	wantAPIStatus(t, "cancelling a foreground response", err, http.StatusBadRequest)
	_, err = c.Responses.Cancel(t.Context(), "resp_absent")
	wantAPIStatus(t, "cancelling an unknown response", err, http.StatusNotFound)
	_, err = c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Input: input, Background: openai.Bool(true), Store: openai.Bool(false)})
	wantAPIStatus(t, "background without store", err, http.StatusBadRequest)
	again2 := c.Responses.GetStreaming(t.Context(), bg.ID, responses.ResponseGetParams{})
	for again2.Next() {
	}
	wantAPIStatus(t, "streaming a response made without a stream", again2.Err(), http.StatusBadRequest)
	// A marker's key is not a response.
	_, err = c.Responses.Get(t.Context(), cancelKey(bg.ID), responses.ResponseGetParams{})
	wantAPIStatus(t, "get of a marker's key", err, http.StatusNotFound)
}

// sharedGateways is two gateways sharing a store of 64 kept responses,
// the first generating on ba, the second on nothing, and their clients.
func sharedGateways(t *testing.T, ba *echoBackend) (a, b *testEnv, ca, cb openai.Client, store ResponseStore) {
	t.Helper()
	cfg := testConfig()
	cfg.Models[0].ContextLength = 1024
	store = MemoryResponses(64)
	cfg.Responses = store
	a, b = newEnv(t, cfg, ba), newEnv(t, cfg, nil)
	return a, b, sdkClient(a, "k"), sdkClient(b, "k"), store
}

// TestBackgroundCancel: a running background response is cancelled on the
// gateway running it and through another gateway sharing its store (a
// marker), kept cancelled, its generation stopped; one whose gateway is
// gone is kept cancelled by the canceller after the wait; a delete cancels
// first; a failed generation is kept failed.
func TestBackgroundCancel(t *testing.T) {
	ba := &echoBackend{gate: make(chan struct{}), started: make(chan string, 8)}
	a, b, ca, cb, _ := sharedGateways(t, ba)
	input := responses.ResponseNewParamsInputUnion{OfString: openai.String("count to ten")}
	// start returns a running background response and its generation's
	// request id.
	start := func() (*responses.Response, string) {
		t.Helper()
		r, err := ca.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Input: input, Background: openai.Bool(true)})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case req := <-ba.started:
			return r, req
		case <-time.After(10 * time.Second):
			t.Fatal("the background generation did not start")
		}
		return nil, ""
	}
	for _, via := range []struct {
		name string
		c    openai.Client
	}{{"its gateway", ca}, {"another gateway", cb}} {
		r, req := start()
		got, err := via.c.Responses.Cancel(t.Context(), r.ID)
		if err != nil || got.Status != responses.ResponseStatusCancelled || !got.Background {
			t.Fatalf("cancel through %s: %v, %s", via.name, err, got.RawJSON())
		}
		if !ba.sawCancel(req) {
			t.Errorf("cancel through %s: the generation was not cancelled (%v)", via.name, ba.cancelled)
		}
		if kept, err := ca.Responses.Get(t.Context(), r.ID, responses.ResponseGetParams{}); err != nil || kept.Status != responses.ResponseStatusCancelled {
			t.Errorf("after a cancel through %s: %v, %s", via.name, err, kept.RawJSON())
		}
		if ok, _ := a.srv.responses.cancelRequested(t.Context(), r.ID); ok {
			t.Errorf("cancel through %s: its marker is left", via.name)
		}
		if again, err := cb.Responses.Cancel(t.Context(), r.ID); err != nil || again.Status != responses.ResponseStatusCancelled {
			t.Errorf("second cancel through %s: %v, %s", via.name, err, again.RawJSON())
		}
	}

	// Delete cancels first.
	r, req := start()
	if err := cb.Responses.Delete(t.Context(), r.ID); err != nil {
		t.Fatal(err)
	}
	if !ba.sawCancel(req) {
		t.Error("delete of a running background response did not cancel it")
	}
	_, err := ca.Responses.Get(t.Context(), r.ID, responses.ResponseGetParams{})
	wantAPIStatus(t, "get after a delete", err, http.StatusNotFound)

	// A response whose gateway is gone: kept in progress, nobody running it.
	b.srv.bgWait = 300 * time.Millisecond
	lost := map[string]any{"id": "resp_lost", "object": "response", "status": "in_progress", "background": true, "output": []any{}}
	obj, _ := json.Marshal(lost)
	if err := b.srv.responses.put(t.Context(), "resp_lost", &storedResponse{Conv: []chatMessage{{Role: "user"}, {Role: "assistant"}}, Object: obj}); err != nil {
		t.Fatal(err)
	}
	if got, err := cb.Responses.Cancel(t.Context(), "resp_lost"); err != nil || got.Status != responses.ResponseStatusCancelled {
		t.Errorf("cancel of a response nobody runs: %v, %s", err, got.RawJSON())
	}
	if ok, _ := b.srv.responses.cancelRequested(t.Context(), "resp_lost"); ok {
		t.Error("the lost response's marker is left")
	}

	// A failed generation.
	ba.failAfter.Store(2)
	close(ba.gate)
	f, err := ca.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Input: input, Background: openai.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if got := pollResponse(t, cb, f.ID); got.Status != responses.ResponseStatusFailed || got.Error.Message == "" {
		t.Errorf("failed generation kept as %s", got.RawJSON())
	}
}

// TestBackgroundShutdown: Shutdown waits for a background response as for
// any generation, then cancels it, and it is kept failed; the in-flight
// slot it held is freed.
func TestBackgroundShutdown(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].ContextLength = 1024
	cfg.Responses = MemoryResponses(16)
	cfg.MaxInFlight = 1
	ba := &echoBackend{gate: make(chan struct{}), started: make(chan string, 1)}
	env := newEnv(t, cfg, ba)
	c := sdkClient(env, "k")
	input := responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}
	r, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Input: input, Background: openai.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	<-ba.started
	_, err = c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Input: input})
	wantAPIStatus(t, "a request beside a background response holding the only slot", err, http.StatusTooManyRequests)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := env.srv.Shutdown(ctx); err == nil {
		t.Error("Shutdown did not report the background response it cut")
	}
	kept, err := env.srv.responses.get(t.Context(), r.ID, "")
	if err != nil || kept == nil {
		t.Fatalf("after shutdown: %v, %v", kept, err)
	}
	var o struct {
		Status string `json:"status"`
		Error  struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(kept.Object, &o); err != nil || o.Status != "failed" || o.Error.Code != "server_shutdown" {
		t.Errorf("kept after shutdown as %s (%v)", kept.Object, err)
	}
	if env.srv.lim.inUse() != 0 {
		t.Errorf("%d in-flight slots still held", env.srv.lim.inUse())
	}
}

// streamed reads a stream of response events: their sequence numbers,
// the text of their deltas and the last response an event carried.
func streamed(t *testing.T, st interface {
	Next() bool
	Current() responses.ResponseStreamEventUnion
	Err() error
}, stopAfter int) (seqs []int64, text string, last responses.Response) {
	t.Helper()
	var b strings.Builder
	for st.Next() {
		ev := st.Current()
		seqs = append(seqs, ev.SequenceNumber)
		if ev.Type == "response.output_text.delta" {
			b.WriteString(ev.Delta)
		}
		if ev.Response.ID != "" {
			last = ev.Response
		}
		if len(seqs) == stopAfter {
			break
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return seqs, b.String(), last
}

// TestSDKBackgroundStream: a streamed background response goes on when
// its client leaves; its events are streamed again after a sequence
// number, with no gap, from the gateway running it and from another
// sharing the store (there from chunks of a few events, as a long stream
// is kept, the last events larger than a chunk and split), and the deltas
// make the kept response's text. Deleting it drops its chunks and their
// parts. A cancelled one ends its stream cancelled.
func TestSDKBackgroundStream(t *testing.T) {
	a, _, ca, cb, store := sharedGateways(t, &echoBackend{delay: 15 * time.Millisecond})
	a.srv.bgChunk = 700
	params := responses.ResponseNewParams{Model: testModel, Background: openai.Bool(true),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("a streamed answer that takes a while")}}

	ctx, leave := context.WithCancel(t.Context())
	first, head, created := streamed(t, ca.Responses.NewStreaming(ctx, params), 6)
	leave()
	if len(first) != 6 || created.ID == "" || !created.Background {
		t.Fatalf("first events %v, response %s", first, created.RawJSON())
	}
	for i, n := range first {
		if n != int64(i) {
			t.Fatalf("sequence numbers %v", first)
		}
	}
	id := created.ID
	// From the gateway running it, after the last event read, while it runs.
	rest, tail, end := streamed(t, ca.Responses.GetStreaming(t.Context(), id, responses.ResponseGetParams{StartingAfter: openai.Int(first[len(first)-1])}), 0)
	done := pollResponse(t, cb, id)
	if done.Status != responses.ResponseStatusCompleted || head+tail != done.OutputText() || end.OutputText() != done.OutputText() {
		t.Errorf("streamed %q + %q, final %q; kept %s", head, tail, end.OutputText(), done.RawJSON())
	}
	if len(rest) == 0 || rest[0] != first[len(first)-1]+1 {
		t.Fatalf("resumed at %v after %d", rest, first[len(first)-1])
	}
	for i := 1; i < len(rest); i++ {
		if rest[i] != rest[i-1]+1 {
			t.Fatalf("gap in %v", rest)
		}
	}
	// From another gateway, out of the store, the whole stream again.
	all, text, last := streamed(t, cb.Responses.GetStreaming(t.Context(), id, responses.ResponseGetParams{}), 0)
	if int64(len(all)) != rest[len(rest)-1]+1 || text != done.OutputText() || last.Status != responses.ResponseStatusCompleted {
		t.Errorf("from another gateway: %d events (want %d), %q, %s", len(all), rest[len(rest)-1]+1, text, last.Status)
	}
	rec, err := keptResponses{store}.events(t.Context(), id, "")
	if err != nil || rec == nil || len(rec.Chunks) < 3 || !rec.Ended {
		t.Fatalf("kept events: %+v, %v; want three chunks or more, ended", rec, err)
	}
	// The last events, which carry the whole text, are split.
	var parts []string
	for i, n := range rec.Chunks {
		if c, _ := (keptResponses{store}).eventsAt(t.Context(), chunkKey(id, i), ""); n == 1 && c != nil {
			for j := 1; j < c.Parts; j++ {
				parts = append(parts, partKey(id, i, j))
			}
		}
	}
	if len(parts) == 0 {
		t.Error("no event larger than a chunk was split")
	}
	// From inside the second chunk, out of the store.
	from := int64(rec.Chunks[0] + 1)
	more, moreText, _ := streamed(t, cb.Responses.GetStreaming(t.Context(), id, responses.ResponseGetParams{StartingAfter: openai.Int(from)}), 0)
	if int64(len(more)) != int64(len(all))-from-1 || more[0] != from+1 || !strings.HasSuffix(text, moreText) {
		t.Errorf("after %d from another gateway: %v, %q", from, more, moreText)
	}
	bad := cb.Responses.GetStreaming(t.Context(), id, responses.ResponseGetParams{}, option.WithQuery("starting_after", "-4"))
	for bad.Next() {
	}
	wantAPIStatus(t, "starting_after -4", bad.Err(), http.StatusBadRequest)
	if err := cb.Responses.Delete(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	for i := range rec.Chunks {
		parts = append(parts, chunkKey(id, i))
	}
	for _, k := range parts {
		if _, ok, _ := store.Get(t.Context(), k); ok {
			t.Errorf("%s of a deleted response is still kept", k)
		}
	}

	// Cancelled while streaming: its stream ends with the response cancelled.
	st := ca.Responses.NewStreaming(t.Context(), params)
	var lastType string
	var kept responses.Response
	for n := 0; st.Next(); n++ {
		ev := st.Current()
		lastType = ev.Type
		if ev.Response.ID != "" {
			kept = ev.Response
		}
		if n == 4 {
			if got, err := cb.Responses.Cancel(t.Context(), kept.ID); err != nil || got.Status != responses.ResponseStatusCancelled {
				t.Errorf("cancel: %v, %s", err, got.RawJSON())
			}
		}
	}
	if lastType != "response.cancelled" || kept.Status != responses.ResponseStatusCancelled {
		t.Errorf("a cancelled stream ended with %s, %s", lastType, kept.Status)
	}
}

// lateEnd is a ResponseStore whose writes of a kept stream's last record
// (its events ended) land late, as a slow store's might.
type lateEnd struct {
	ResponseStore
	by time.Duration
}

func (l lateEnd) Put(ctx context.Context, id string, value []byte) error {
	var v storedResponse
	if strings.HasSuffix(id, ".events") && json.Unmarshal(value, &v) == nil && v.Events != nil && v.Events.Ended {
		time.Sleep(l.by)
	}
	return l.ResponseStore.Put(ctx, id, value)
}

// TestBackgroundStreamDelete: a streamed background response deleted
// through another gateway while it runs leaves nothing in the store, even
// where its events' last write lands late: the response reads as ended
// only once its events are kept.
func TestBackgroundStreamDelete(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].ContextLength = 1024
	store := MemoryResponses(64)
	cfg.Responses = lateEnd{store, 400 * time.Millisecond}
	ba := &echoBackend{gate: make(chan struct{}), started: make(chan string, 1)}
	a, b := newEnv(t, cfg, ba), newEnv(t, cfg, nil)
	ca, cb := sdkClient(a, "k"), sdkClient(b, "k")
	params := responses.ResponseNewParams{Model: testModel, Background: openai.Bool(true),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("a streamed answer")}}
	ctx, leave := context.WithCancel(t.Context())
	_, _, created := streamed(t, ca.Responses.NewStreaming(ctx, params), 1)
	leave()
	<-ba.started
	if created.ID == "" {
		t.Fatal("no response in the first event")
	}
	id := created.ID
	if err := cb.Responses.Delete(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	// Once the gateway running it is done with it, nothing of it is kept.
	for deadline := time.Now().Add(10 * time.Second); a.srv.bg.get(id) != nil; {
		if time.Now().After(deadline) {
			t.Fatal("the deleted response still runs")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, k := range []string{id, eventsKey(id), chunkKey(id, 0), cancelKey(id)} {
		if _, ok, _ := store.Get(t.Context(), k); ok {
			t.Errorf("%s is kept after the response was deleted", k)
		}
	}
	_, err := ca.Responses.Get(t.Context(), id, responses.ResponseGetParams{})
	wantAPIStatus(t, "get after a delete", err, http.StatusNotFound)
}

// TestBackgroundHeartbeat: the gateway running a background response
// keeps it again every beat, so another gateway sees it in progress long
// after it began; one no gateway has kept for lostAfter beats is read as
// failed (gateway_lost), and kept so.
func TestBackgroundHeartbeat(t *testing.T) {
	ba := &echoBackend{gate: make(chan struct{}), started: make(chan string, 1)}
	a, b, ca, cb, _ := sharedGateways(t, ba)
	a.srv.bgBeat, b.srv.bgBeat = 40*time.Millisecond, 40*time.Millisecond
	r, err := ca.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Background: openai.Bool(true),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}})
	if err != nil {
		t.Fatal(err)
	}
	<-ba.started
	time.Sleep(lostAfter * 40 * time.Millisecond * 3)
	if got, err := cb.Responses.Get(t.Context(), r.ID, responses.ResponseGetParams{}); err != nil || got.Status != responses.ResponseStatusInProgress {
		t.Errorf("a running response read elsewhere after many beats: %v, %s", err, got.Status)
	}
	close(ba.gate)
	if got := pollResponse(t, cb, r.ID); got.Status != responses.ResponseStatusCompleted {
		t.Errorf("then %s", got.Status)
	}

	// A response whose gateway is gone: its last beat long past.
	obj, _ := json.Marshal(map[string]any{"id": "resp_gone", "object": "response", "status": "in_progress", "background": true, "output": []any{}})
	stale := time.Now().Add(-time.Minute).UnixMilli()
	if err := b.srv.responses.put(t.Context(), "resp_gone", &storedResponse{Conv: []chatMessage{{Role: "user"}, {Role: "assistant"}}, Object: obj, Beat: stale}); err != nil {
		t.Fatal(err)
	}
	got, err := cb.Responses.Get(t.Context(), "resp_gone", responses.ResponseGetParams{})
	if err != nil || got.Status != responses.ResponseStatusFailed || got.Error.Code != "gateway_lost" {
		t.Errorf("a response whose gateway is gone: %v, %s", err, got.RawJSON())
	}
	if kept, _ := a.srv.responses.get(t.Context(), "resp_gone", ""); kept == nil || statusOf(kept.Object).Status != "failed" {
		t.Errorf("not kept failed: %v", kept)
	}
	if got, err := ca.Responses.Cancel(t.Context(), "resp_gone"); err != nil || got.Status != responses.ResponseStatusFailed {
		t.Errorf("cancel of a lost response: %v, %s", err, got.Status)
	}
}

// countingStore counts a ResponseStore's writes by key.
type countingStore struct {
	ResponseStore
	puts map[string]int
}

func (c *countingStore) Put(ctx context.Context, id string, value []byte) error {
	c.puts[id]++
	return c.ResponseStore.Put(ctx, id, value)
}

// TestEventKeeper: a log kept as it grows is written as chunks of at most
// the chunk's bytes (an event larger than that alone, split over values of
// the chunk's bytes, the log's last too), each once, and a record of the
// events after them; nothing is written when nothing changed; the chunks
// and the record give back the log; deleting the response drops them all.
func TestEventKeeper(t *testing.T) {
	store := &countingStore{ResponseStore: MemoryResponses(64), puts: map[string]int{}}
	k := &eventKeeper{r: keptResponses{store}, id: "resp_1", tenant: "t", chunk: 10}
	log := newEventLog()
	var want [][]byte
	add := func(sizes ...int) {
		for _, n := range sizes {
			e := make([]byte, n)
			for i := range e {
				e[i] = byte('a' + (len(want)+i)%26)
			}
			want = append(want, e)
			log.append(e)
		}
		if err := k.keep(t.Context(), log); err != nil {
			t.Fatal(err)
		}
	}
	add(4, 4)           // fits the record
	add(4, 30, 2, 9, 1) // [4 4] and [4] sealed, [30] alone in 3 parts, [2] sealed
	add()               // unchanged: no write
	log.end()
	add(3, 25) // [9 1] and [3] sealed, [25] alone in 3 parts; the record ended, empty
	rec, err := k.r.events(t.Context(), "resp_1", "t")
	if err != nil || rec == nil {
		t.Fatalf("record %v, %v", rec, err)
	}
	if want, got := []int{2, 1, 1, 1, 2, 1, 1}, rec.Chunks; !slices.Equal(got, want) || !rec.Ended || len(rec.Events) != 0 {
		t.Fatalf("chunks %v, ended %v, %d events after them; want %v, ended, none", got, rec.Ended, len(rec.Events), want)
	}
	var got [][]byte
	for i, n := range rec.Chunks {
		c, err := k.r.chunk(t.Context(), "resp_1", "t", i, n)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c...)
		if store.puts[chunkKey("resp_1", i)] != 1 {
			t.Errorf("chunk %d written %d times", i, store.puts[chunkKey("resp_1", i)])
		}
	}
	for _, i := range []int{2, 6} {
		for j := 1; j < 3; j++ {
			if n := store.puts[partKey("resp_1", i, j)]; n != 1 {
				t.Errorf("part %d of chunk %d written %d times", j, i, n)
			}
		}
	}
	got = append(got, rec.Events...)
	if !slices.EqualFunc(got, want, bytes.Equal) {
		t.Errorf("kept %q, want %q", got, want)
	}
	if n := store.puts[eventsKey("resp_1")]; n != 3 {
		t.Errorf("record written %d times, want 3", n)
	}
	if _, err := k.r.chunk(t.Context(), "resp_1", "t", 0, 3); err == nil {
		t.Error("a chunk of another length was taken")
	}
	if rec, _ := k.r.events(t.Context(), "resp_1", "other"); rec != nil {
		t.Error("another tenant read the events")
	}
	// A split event with a part missing is refused.
	lost := partKey("resp_1", 6, 2)
	part, _, _ := store.Get(t.Context(), lost)
	if err := store.Delete(t.Context(), lost); err != nil {
		t.Fatal(err)
	}
	if _, err := k.r.chunk(t.Context(), "resp_1", "t", 6, 1); err == nil {
		t.Error("a split event with a part missing was taken")
	}
	if err := store.Put(t.Context(), lost, part); err != nil {
		t.Fatal(err)
	}
	// Deleting the response drops every value of its events.
	if err := k.r.put(t.Context(), "resp_1", &storedResponse{Tenant: "t", Object: json.RawMessage(`{"status":"completed"}`)}); err != nil {
		t.Fatal(err)
	}
	if ok, err := k.r.drop(t.Context(), "resp_1", "t"); !ok || err != nil {
		t.Fatalf("drop: %v, %v", ok, err)
	}
	for key := range store.puts {
		if _, ok, _ := store.Get(t.Context(), key); ok {
			t.Errorf("%s kept after the response was deleted", key)
		}
	}
}
