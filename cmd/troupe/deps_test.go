package main

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/troupe/troupe"

// layers maps a package tree to the trees it must never import, directly
// or not: the lower layers know nothing of the bus, the actors, the
// scheduler or the gateway, and the gateway knows only its own interfaces.
var layers = map[string][]string{
	"gpu":     {"bus", "actors", "gateway", "scheduler", "trace", "cmd", "models", "xgmi"},
	"kernels": {"bus", "actors", "gateway", "scheduler", "trace", "cmd", "models", "xgmi"},
	"xgmi":    {"bus", "actors", "gateway", "scheduler", "trace", "cmd", "models"},
	"models":  {"bus", "actors", "gateway", "scheduler", "trace", "cmd", "xgmi"},
	"bus":     {"actors", "gateway", "scheduler", "cmd", "models", "gpu"},
	"actors":  {"gateway", "scheduler", "cmd", "models", "gpu"},
	"trace":   {"actors", "gateway", "scheduler", "cmd", "models", "gpu"},
	"gateway": {"bus", "actors", "scheduler", "cmd", "models", "gpu", "xgmi"},
}

func TestLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		pkg := fields[0]
		tree := treeOf(pkg)
		forbidden, ok := layers[tree]
		if !ok {
			continue
		}
		checked++
		for _, dep := range fields[1:] {
			for _, f := range forbidden {
				if treeOf(dep) == f {
					t.Errorf("%s imports %s: the %s layer must not depend on %s", pkg, dep, tree, f)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no packages checked")
	}
}

// treeOf returns the top-level folder of a package of this module, or "".
func treeOf(pkg string) string {
	rest, ok := strings.CutPrefix(pkg, module+"/")
	if !ok {
		return ""
	}
	top, _, _ := strings.Cut(rest, "/")
	return top
}
