package kernels

import (
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// staticSharedMax is the static shared memory a kernel may declare on
// every GPU the PTX targets (compute capability 8.0 on): more takes
// dynamic shared memory and an opt-in at launch.
const staticSharedMax = 48 << 10

// sharedDecl is one .shared variable of a PTX file: its name, alignment
// and size in bytes.
var sharedDecl = regexp.MustCompile(`^\s*\.shared\s+(?:\.align\s+(\d+)\s+)?\.([busf])(\d+)\s+([\w$]+)((?:\[\d+\])*)\s*;`)

var entryHead = regexp.MustCompile(`\.entry\s+([\w$]+)\s*\(`)

var dims = regexp.MustCompile(`\[(\d+)\]`)

type sharedVar struct {
	name        string
	align, size int
}

func parseShared(line string) (sharedVar, bool) {
	m := sharedDecl.FindStringSubmatch(line)
	if m == nil {
		return sharedVar{}, false
	}
	bits, _ := strconv.Atoi(m[3])
	size := bits / 8
	for _, d := range dims.FindAllStringSubmatch(m[5], -1) {
		n, _ := strconv.Atoi(d[1])
		size *= n
	}
	align := bits / 8
	if m[1] != "" {
		align, _ = strconv.Atoi(m[1])
	}
	return sharedVar{name: m[4], align: align, size: size}, true
}

// staticShared is the static shared memory each entry of a PTX module
// declares: the .shared variables in its body, and those at module scope
// (a device function's, such as grid_best's) that its body names, each
// placed at its alignment.
func staticShared(ptx string) map[string]int {
	lines := strings.Split(ptx, "\n")
	var global []sharedVar
	for _, l := range lines {
		if !strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, " ") {
			if v, ok := parseShared(l); ok {
				global = append(global, v)
			}
		}
	}
	place := func(at int, v sharedVar) int {
		if v.align > 1 {
			at = (at + v.align - 1) / v.align * v.align
		}
		return at + v.size
	}
	out := map[string]int{}
	for i := 0; i < len(lines); i++ {
		m := entryHead.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		// The body runs to the first closing brace at the start of a line.
		j := i + 1
		for j < len(lines) && lines[j] != "}" {
			j++
		}
		body := strings.Join(lines[i:j], "\n")
		bytes := 0
		for _, l := range lines[i:j] {
			if v, ok := parseShared(l); ok {
				bytes = place(bytes, v)
			}
		}
		for _, v := range global {
			if strings.Contains(body, v.name) {
				bytes = place(bytes, v)
			}
		}
		out[m[1]] = bytes
		i = j
	}
	return out
}

// TestPTXStaticShared fails when a kernel of the PTX fallback declares
// more static shared memory than any GPU from compute capability 8.0 on
// allows a block: the driver would refuse the whole module on the GPUs
// that load the PTX, though the Hopper cubin loads.
func TestPTXStaticShared(t *testing.T) {
	fsys := FS()
	m, err := ReadManifest(fsys)
	if err != nil {
		t.Fatal(err)
	}
	entries := 0
	for _, mod := range m.Modules {
		raw, err := fs.ReadFile(fsys, mod.PTX)
		if err != nil {
			t.Fatal(err)
		}
		shared := staticShared(string(raw))
		if len(shared) == 0 {
			t.Errorf("%s: no entries found", mod.PTX)
		}
		for name, n := range shared {
			entries++
			if n > staticSharedMax {
				t.Errorf("%s: %s declares %d bytes of static shared memory, more than the %d every GPU allows", mod.PTX, name, n, staticSharedMax)
			}
		}
	}
	t.Logf("%d entries checked", entries)
}

func TestStaticSharedCounts(t *testing.T) {
	ptx := `
.shared .align 4 .b8 _ZZ9grid_bestE2sv[128];
.shared .align 1 .u8 _ZZ9grid_bestE4last;

.visible .entry small(
	.param .u64 small_param_0
)
{
	.shared .align 16 .b8 _ZZ4fastE2xs[32768];
	.shared .align 4 .b8 _ZZ4fastE4part[64];
	mov.u64 %rd1, _ZZ4fastE2xs;
	ret;
}

.visible .entry twice(
	.param .u64 twice_param_0
)
{
	.shared .align 16 .b8 _ZZ4fastILb0EE2xs[32768];
	.shared .align 16 .b8 _ZZ4fastILb1EE2xs[32768];
	.shared .align 1 .u8 flag;
	.shared .align 4 .f32 one;
	mov.u64 %rd1, _ZZ9grid_bestE2sv;
	ld.shared.u8 %rs1, [_ZZ9grid_bestE4last];
	ret;
}
`
	got := staticShared(ptx)
	want := map[string]int{
		"small": 32768 + 64,
		// 65536, a byte, f32 at 4-byte alignment, then the module's 128
		// and its byte.
		"twice": 65536 + 4 + 4 + 128 + 1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("static shared %v, want %v", got, want)
	}
}
