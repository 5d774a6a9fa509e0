// Package gatewaytest runs the gateway's Node.js test scripts (the official
// openai npm client, the demo page in Chromium through playwright-core)
// against any troupe server.
package gatewaytest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// NodeProject prepares a directory that runs the scripts of npmDir (the gateway's
// testdata/npm) with their node_modules, or skips the test. node_modules comes from
// TROUPE_NODE_MODULES or from an `npm ci` in npmDir.
func NodeProject(t testing.TB, npmDir, pkg string) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed; install Node.js 20+ to run the official npm client tests")
	}
	src, err := filepath.Abs(npmDir)
	if err != nil {
		t.Fatal(err)
	}
	modules := os.Getenv("TROUPE_NODE_MODULES")
	if modules == "" {
		modules = filepath.Join(src, "node_modules")
	}
	if _, err := os.Stat(filepath.Join(modules, pkg, "package.json")); err != nil {
		t.Skipf("npm package %s not found in %s; run `npm ci` in gateway/testdata/npm or set TROUPE_NODE_MODULES to a node_modules directory that has it", pkg, modules)
	}
	dir := t.TempDir()
	for _, f := range []string{"package.json", "sdk.mjs", "browser.mjs"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// RunNode runs a script of a NodeProject directory with extra environment
// variables and returns what it printed; the test fails if the script fails or
// outlives timeout.
func RunNode(t testing.TB, dir, script string, timeout time.Duration, env ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, stderr, err := runNode(ctx, dir, script, env)
	if err != nil {
		t.Fatalf("node %s: %v\nstdout: %s\nstderr: %s", script, err, out, stderr)
	}
	return out
}

// runNode runs node script in dir, in a process group of its own: when ctx
// ends the whole group is killed, the browsers a script started included, so
// a child holding the output pipe open cannot keep runNode waiting.
func runNode(ctx context.Context, dir, script string, env []string) (stdout []byte, stderr string, err error) {
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var errb strings.Builder
	cmd.Stderr = &errb
	stdout, err = cmd.Output()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever the script left running
	}
	return stdout, errb.String(), err
}
