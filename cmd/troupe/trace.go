package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/troupe/troupe/trace"
)

func cmdTrace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("trace", stderr)
	server := fs.String("server", "http://127.0.0.1:8080", "troupe server whose recent traces to read")
	jaeger := fs.String("jaeger", "", "read the trace (by request or trace id) from this Jaeger query service instead, e.g. http://localhost:16686")
	apiKey := fs.String("api-key", "", "API key for the server")
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: troupe trace [flags] REQUEST_ID")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("trace: want one request id")
	}
	id := fs.Arg(0)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var w trace.Waterfall
	var err error
	client := &http.Client{Transport: keyTransport{key: *apiKey}}
	if *jaeger != "" {
		w, err = trace.JaegerClient{BaseURL: strings.TrimRight(*jaeger, "/"), HTTP: client}.Fetch(ctx, id)
	} else {
		w, err = trace.FetchRequest(ctx, client, strings.TrimRight(*server, "/"), id)
	}
	if err != nil {
		return fmt.Errorf("trace %s: %w", id, err)
	}
	return trace.WriteBreakdown(stdout, trace.Breakdown(w), *asJSON)
}

// keyTransport adds an API key to each request.
type keyTransport struct{ key string }

func (t keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.key != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+t.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}
