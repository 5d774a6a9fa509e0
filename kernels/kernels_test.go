package kernels

import (
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"
)

// TestManifest fails when a kernel source changed and its artifacts were
// not rebuilt with build.sh, or when an artifact was replaced by hand.
func TestManifest(t *testing.T) {
	if err := Verify(os.DirFS(".")); err != nil {
		t.Fatal(err)
	}
	// The embedded copy is what binaries load.
	if err := Verify(FS()); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyCatchesDrift edits a source in memory and expects Verify to
// name it.
func TestVerifyCatchesDrift(t *testing.T) {
	fsys := fstest.MapFS{}
	src := os.DirFS(".")
	m, err := ReadManifest(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"manifest.json"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fsys[f] = &fstest.MapFile{Data: raw}
	}
	for _, mod := range m.Modules {
		for _, f := range []string{mod.Source, mod.Cubin, mod.PTX} {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			fsys[f] = &fstest.MapFile{Data: raw}
		}
	}
	headers, err := filepath.Glob("cuda/*.cuh")
	if err != nil || len(headers) == 0 {
		t.Fatalf("headers: %v (%d)", err, len(headers))
	}
	for _, f := range headers {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fsys[f] = &fstest.MapFile{Data: raw}
	}
	hdr := fsys["cuda/common.cuh"].Data
	if err := Verify(fsys); err != nil {
		t.Fatalf("unchanged copy: %v", err)
	}
	fsys["cuda/common.cuh"] = &fstest.MapFile{Data: append(hdr, "\n// edit\n"...)}
	if err := Verify(fsys); err == nil {
		t.Fatal("got no error after editing a header")
	}
}
