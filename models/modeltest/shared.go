package modeltest

import (
	"os"
	"path/filepath"
	"testing"
)

// Shared returns the path of parts in the shared test data folder beside
// the module's root (the folder holding go.mod above the working
// directory), or "" when it is absent.
func Shared(t testing.TB, parts ...string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
	p := filepath.Join(append([]string{dir, "..", "shared"}, parts...)...)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// MustShared is Shared, skipping the test when the data is absent.
func MustShared(t testing.TB, parts ...string) string {
	t.Helper()
	p := Shared(t, parts...)
	if p == "" {
		t.Skipf("shared test data %s is absent", filepath.Join(parts...))
	}
	return p
}
