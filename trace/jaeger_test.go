package trace

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

// jaegerFixture is a query API response recorded from Jaeger v1.76.0 for a
// request traced by runRequest(tr, "e2e-grpc", 4).
func jaegerFixture(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "jaeger-traces.json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeJaeger(t *testing.T) {
	t.Parallel()
	ws, err := decodeJaeger(jaegerFixture(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 1 {
		t.Fatalf("got %d traces, want 1", len(ws))
	}
	w := ws[0].Waterfall
	if len(w.Spans) != 3+4+3*5 {
		t.Fatalf("got %d spans, want %d", len(w.Spans), 3+4+3*5)
	}
	root := w.Spans[0]
	if root.Name != SpanRequest || root.ParentID != "" || root.StartUS != 0 {
		t.Errorf("first span %+v, want the request root at 0", root)
	}
	if id, _ := root.String(string(AttrRequestID)); id != "e2e-grpc" {
		t.Errorf("request.id %q, want e2e-grpc", id)
	}
	for _, s := range w.Spans {
		for k := range s.Attrs {
			if jaegerInternalTag(k) {
				t.Errorf("span %s kept internal tag %s", s.Name, k)
			}
		}
		if s.Name == SpanDecodeStep {
			if _, ok := s.Attrs["token.seq"].(int64); !ok {
				t.Errorf("decode.step token.seq is %T, want int64", s.Attrs["token.seq"])
			}
		}
	}
	rows := Breakdown(w)
	if len(rows) != 4 {
		t.Fatalf("breakdown has %d rows, want 4", len(rows))
	}
	for i, r := range rows {
		if r.Seq != int64(i) || r.TokenID != 100+int64(i) || len(r.Shards) != 2 || r.TotalUS <= 0 {
			t.Errorf("row %d: %+v", i, r)
		}
	}
}

func TestJaegerClient(t *testing.T) {
	t.Parallel()
	fixture := jaegerFixture(t)
	var traceID string
	{
		ws, err := decodeJaeger(fixture)
		if err != nil {
			t.Fatal(err)
		}
		traceID = ws[0].TraceID
	}
	var gotQuery map[string]string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/traces/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != traceID {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"data":null,"errors":[{"code":404,"msg":"trace not found"}]}`))
			return
		}
		_, _ = w.Write(fixture)
	})
	mux.HandleFunc("GET /api/traces", func(w http.ResponseWriter, r *http.Request) {
		gotQuery = map[string]string{}
		for k, v := range r.URL.Query() {
			gotQuery[k] = v[0]
		}
		var tags map[string]string
		_ = json.Unmarshal([]byte(r.URL.Query().Get("tags")), &tags)
		if tags["request.id"] != "e2e-grpc" {
			_, _ = w.Write([]byte(`{"data":[],"total":0}`))
			return
		}
		_, _ = w.Write(fixture)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := JaegerClient{BaseURL: srv.URL, Service: "svc", HTTP: srv.Client()}
	ctx := context.Background()

	for _, id := range []string{traceID, "e2e-grpc"} {
		w, err := c.Fetch(ctx, id)
		if err != nil {
			t.Fatalf("Fetch(%s): %v", id, err)
		}
		if w.TraceID != traceID || len(w.Spans) != 22 {
			t.Errorf("Fetch(%s) = trace %s with %d spans", id, w.TraceID, len(w.Spans))
		}
	}
	if gotQuery["service"] != "svc" || gotQuery["start"] == "" || gotQuery["end"] == "" {
		t.Errorf("query %v lacks service, start or end", gotQuery)
	}
	if _, err := c.Fetch(ctx, "0123456789abcdef0123456789abcdef"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Fetch(unknown trace id) error %v, want ErrNotFound", err)
	}
	if _, err := c.Request(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Request(nobody) error %v, want ErrNotFound", err)
	}
}

func FuzzDecodeJaeger(f *testing.F) {
	f.Add(jaegerFixture(f))
	f.Add([]byte(`{"data":[{"traceID":"1","spans":[{"spanID":"a","startTime":1,"duration":2,"tags":[{"key":"k","value":1.5}]}]}]}`))
	f.Add([]byte(`{"errors":[{"code":500,"msg":"x"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ws, err := decodeJaeger(b)
		if err != nil {
			return
		}
		for _, w := range ws {
			for _, s := range w.Spans {
				if s.StartUS < 0 {
					t.Errorf("span %s starts before its trace: %v", s.SpanID, s.StartUS)
				}
			}
			Breakdown(w.Waterfall) // must not panic
		}
	})
}
