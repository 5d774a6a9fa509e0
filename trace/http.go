package trace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	oteltrace "go.opentelemetry.io/otel/trace"
)

// Paths the Handler serves.
const (
	TracePath   = "/debug/traces/"
	RequestPath = "/debug/requests/"
)

// ErrNotFound reports a trace or request that is not known.
var ErrNotFound = errors.New("trace: not found")

// Handler serves a Store's traces as Waterfall JSON:
//
//	GET /debug/traces/{trace_id}      the trace, by 32-digit hex id
//	GET /debug/requests/{request_id}  the trace of a request
//
// Unknown ids answer 404, malformed trace ids 400.
func Handler(s *Store) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+TracePath+"{trace_id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := oteltrace.TraceIDFromHex(r.PathValue("trace_id"))
		if err != nil {
			http.Error(w, "malformed trace id", http.StatusBadRequest)
			return
		}
		wf, ok := s.Trace(id)
		writeWaterfall(w, wf, ok)
	})
	mux.HandleFunc("GET "+RequestPath+"{request_id}", func(w http.ResponseWriter, r *http.Request) {
		wf, ok := s.ByRequest(r.PathValue("request_id"))
		writeWaterfall(w, wf, ok)
	})
	return mux
}

func writeWaterfall(w http.ResponseWriter, wf Waterfall, ok bool) {
	if !ok {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(wf) // the client has gone if this fails
}

// HTTPDoer sends HTTP requests; *http.Client is one.
type HTTPDoer interface {
	Do(*http.Request) (*http.Response, error)
}

// FetchRequest gets the waterfall of request id from a troupe server's
// Handler mounted at baseURL (for example http://localhost:8080).
// It returns an error wrapping ErrNotFound when the server does not know
// the request.
func FetchRequest(ctx context.Context, c HTTPDoer, baseURL, id string) (Waterfall, error) {
	u := strings.TrimRight(baseURL, "/") + RequestPath + url.PathEscape(id)
	var w Waterfall
	if err := getJSON(ctx, c, u, &w); err != nil {
		return Waterfall{}, fmt.Errorf("trace: fetch request %s: %w", id, err)
	}
	return w, nil
}

// getJSON decodes the JSON body of GET u into v, numbers as json.Number.
func getJSON(ctx context.Context, c HTTPDoer, u string, v any) error {
	if c == nil {
		c = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return ErrNotFound
	case resp.StatusCode != http.StatusOK:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	dec := json.NewDecoder(resp.Body)
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return nil
}
