package trace

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestHandler(t *testing.T) {
	t.Parallel()
	p := newTestProvider(t, DefaultStoreConfig())
	id := runRequest(p.Tracer(), "req/with space", 3)
	srv := httptest.NewServer(Handler(p.Store()))
	t.Cleanup(srv.Close)

	tests := []struct {
		path       string
		wantStatus int
	}{
		{TracePath + id.String(), http.StatusOK},
		{RequestPath + "req%2Fwith%20space", http.StatusOK},
		{TracePath + "0123456789abcdef0123456789abcdef", http.StatusNotFound},
		{TracePath + "not-hex", http.StatusBadRequest},
		{RequestPath + "unknown", http.StatusNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			resp, err := srv.Client().Get(srv.URL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("GET %s: status %d, want %d", tc.path, resp.StatusCode, tc.wantStatus)
			}
			if tc.wantStatus != http.StatusOK {
				return
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			// Check the documented JSON field names, not just the Go types.
			var raw struct {
				TraceID string           `json:"trace_id"`
				Spans   []map[string]any `json:"spans"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
				t.Fatal(err)
			}
			if raw.TraceID != id.String() {
				t.Errorf("trace_id %q, want %s", raw.TraceID, id)
			}
			if len(raw.Spans) != 3+4+2*5 {
				t.Errorf("got %d spans, want %d", len(raw.Spans), 3+4+2*5)
			}
			for _, k := range []string{"name", "span_id", "parent_id", "start_us", "duration_us", "attrs"} {
				if _, ok := raw.Spans[0][k]; !ok {
					t.Errorf("span lacks %q: %v", k, raw.Spans[0])
				}
			}
		})
	}
	resp, err := srv.Client().Post(srv.URL+RequestPath+"x", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: status %d, want %d", resp.StatusCode, http.StatusMethodNotAllowed)
	}
}

func TestFetchRequest(t *testing.T) {
	t.Parallel()
	p := newTestProvider(t, DefaultStoreConfig())
	runRequest(p.Tracer(), "fetched", 4)
	srv := httptest.NewServer(Handler(p.Store()))
	t.Cleanup(srv.Close)
	ctx := context.Background()

	w, err := FetchRequest(ctx, srv.Client(), srv.URL+"/", "fetched")
	if err != nil {
		t.Fatalf("FetchRequest: %v", err)
	}
	local, _ := p.Store().ByRequest("fetched")
	got, _ := json.Marshal(Breakdown(w))
	want, _ := json.Marshal(Breakdown(local))
	if string(got) != string(want) {
		t.Errorf("breakdown of fetched waterfall:\n%s\nwant\n%s", got, want)
	}
	if _, err := FetchRequest(ctx, srv.Client(), srv.URL, "missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("FetchRequest(missing) error %v, want ErrNotFound", err)
	}
}
