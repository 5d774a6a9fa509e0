package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// replicasDoc is the body of the replicas admin endpoint.
type replicasDoc struct {
	Replicas int    `json:"replicas"`
	Error    string `json:"error,omitempty"`
}

// replicasHandler serves GET and POST /v1/admin/replicas: the number of
// local replicas, and changing it while serving.
func (n *node) replicasHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet {
			n.replicasMu.Lock()
			doc := replicasDoc{Replicas: len(n.replicas)}
			n.replicasMu.Unlock()
			json.NewEncoder(w).Encode(doc)
			return
		}
		var want replicasDoc
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(replicasDoc{Error: "body must be {\"replicas\": N}: " + err.Error()})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
		defer cancel()
		got, err := n.scale(ctx, want.Replicas)
		doc := replicasDoc{Replicas: got}
		if err != nil {
			doc.Error = err.Error()
			w.WriteHeader(http.StatusBadRequest)
		}
		json.NewEncoder(w).Encode(doc)
	})
}

func cmdScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("scale", stderr)
	server := fs.String("server", "http://127.0.0.1:8080", "troupe server to scale")
	replicas := fs.Int("replicas", 0, "replicas to run (0: print the current number)")
	apiKey := fs.String("api-key", "", "API key for the server")
	if err := fs.Parse(args); err != nil {
		return err
	}
	url := strings.TrimRight(*server, "/") + "/v1/admin/replicas"
	method, body := http.MethodGet, []byte(nil)
	if *replicas != 0 {
		method = http.MethodPost
		body, _ = json.Marshal(replicasDoc{Replicas: *replicas})
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: keyTransport{key: *apiKey}}).Do(req)
	if err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	defer resp.Body.Close()
	var doc replicasDoc
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return fmt.Errorf("scale: %s answered %s: %w", url, resp.Status, err)
	}
	if doc.Error != "" {
		return fmt.Errorf("scale: %s (now %d replicas)", doc.Error, doc.Replicas)
	}
	fmt.Fprintf(stdout, "%d replicas\n", doc.Replicas)
	return nil
}
