package kernels

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The host launches every kernel on a Hopper GPU as a programmatic
// dependent launch: a kernel may start while the one before it still runs.
// TestEveryKernelWaits checks the sources' side of that contract: each
// entry point calls pdl_begin (common.cuh) or a pdl_begin_early of its
// module, directly or through a device function of its module that does,
// so none reads or writes before the kernel before it has finished.
func TestEveryKernelWaits(t *testing.T) {
	files, err := filepath.Glob("cuda/*.cu")
	if err != nil || len(files) == 0 {
		t.Fatalf("sources: %v (%d)", err, len(files))
	}
	entries := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// Macros define most entry points: join their lines.
		src := strings.ReplaceAll(string(raw), "\\\n", " ")
		waiters := map[string]bool{}
		for _, fn := range functions(src, devHead) {
			if callsWait.MatchString(fn.body) {
				waiters[fn.name] = true
			}
		}
		globals := functions(src, globalHead)
		if len(globals) == 0 {
			t.Errorf("%s: no entry points found", f)
		}
		for _, fn := range globals {
			entries++
			if strings.HasPrefix(fn.name, "__") {
				t.Errorf("%s: entry point name not found in %q", f, fn.name)
			}
			if !waits(fn.body, waiters) {
				t.Errorf("%s: entry point %s does not call pdl_begin before its work", f, fn.name)
			}
		}
	}
	t.Logf("%d entry points checked", entries)
}

func TestEveryKernelWaitsCatchesOne(t *testing.T) {
	src := `
DEV void helper(float* x) { pdl_begin(); x[0] = 1.f; }
extern "C" __global__ void good(float* x) { helper(x); }
extern "C" __global__ void also_good(float* x) {
  pdl_begin();
  x[0] = 2.f;
}
extern "C" __global__ void bad(float* x) { x[0] = 3.f; }
`
	waiters := map[string]bool{}
	for _, fn := range functions(src, devHead) {
		if strings.Contains(fn.body, "pdl_begin()") {
			waiters[fn.name] = true
		}
	}
	var missing []string
	for _, fn := range functions(src, globalHead) {
		if !waits(fn.body, waiters) {
			missing = append(missing, fn.name)
		}
	}
	if strings.Join(missing, ",") != "bad" {
		t.Fatalf("kernels without pdl_begin: %v, want [bad]", missing)
	}
}

// waits reports whether body calls pdl_begin or one of the named functions.
func waits(body string, waiters map[string]bool) bool {
	if callsWait.MatchString(body) {
		return true
	}
	for name := range waiters {
		if regexp.MustCompile(`\b` + name + `\s*[<(]`).MatchString(body) {
			return true
		}
	}
	return false
}

var (
	// callsWait matches a call of pdl_begin, or of a module's
	// pdl_begin_early (the next kernel let start before the wait).
	callsWait  = regexp.MustCompile(`\bpdl_begin(_early)?\(\)`)
	globalHead = regexp.MustCompile(`__global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)\s*)?(?:void\s+)?([\w#]+)\s*\(`)
	devHead    = regexp.MustCompile(`DEV\s[^;{()]*?\b(\w+)\s*\(`)
)

type function struct{ name, body string }

// functions finds the definitions whose heads head matches (group 1 the
// name): the body is the balanced braces after the parameter list.
// Declarations without a body are skipped.
func functions(src string, head *regexp.Regexp) []function {
	var out []function
	for _, m := range head.FindAllStringSubmatchIndex(src, -1) {
		params := closing(src, m[1]-1, '(', ')') // m[1]-1 is the list's '('
		j := params + 1
		for j < len(src) && src[j] != '{' && src[j] != ';' {
			j++
		}
		if j >= len(src) || src[j] == ';' {
			continue
		}
		out = append(out, function{name: src[m[2]:m[3]], body: src[j:min(closing(src, j, '{', '}')+1, len(src))]})
	}
	return out
}

// closing returns the index of the delimiter that closes the one at src[i],
// or len(src) when it is not closed.
func closing(src string, i int, open, close byte) int {
	depth := 0
	for ; i < len(src); i++ {
		switch src[i] {
		case open:
			depth++
		case close:
			if depth--; depth == 0 {
				return i
			}
		}
	}
	return len(src)
}
