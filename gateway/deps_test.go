package gateway

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestImportsStayOutside keeps the gateway free of the serving internals: it talks to
// them only through the interfaces it declares.
func TestImportsStayOutside(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(path, "github.com/troupe/troupe/") {
				t.Errorf("%s imports %s; the gateway must depend only on its own interfaces", f, path)
			}
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}

// BenchmarkTokenPath measures the gateway's own cost per token on the websocket path:
// stop-string handling, metrics, frame encoding and buffering for resume.
func BenchmarkTokenPath(b *testing.B) {
	srv, err := New(testConfig(), &echoBackend{}, byteTokenizer{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown(b.Context())
	const tokens = 200
	prompt := byteTokenizer{}.Encode(strings.Repeat("abcdefghij", 20))
	req := GenerateRequest{RequestID: "bench", Model: testModel, Prompt: prompt, MaxTokens: tokens, IgnoreEOS: true, Stop: []string{"zzz"}}
	j := &job{model: testConfig().Models[0], prompts: [][]int32{prompt}, maxTokens: []int{tokens}, n: 1, base: req}
	b.ReportAllocs()
	for b.Loop() {
		st := &stream{key: streamKey{"", "bench"}, cancel: func() {}, limit: 8192}
		srv.runStream(b.Context(), st, j, time.Now(), func() {})
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tokens), "ns/token")
}
