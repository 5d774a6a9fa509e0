package gatewaytest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// A script whose child keeps stdout open past the deadline must not hang the
// caller: the process group is killed and runNode returns.
func TestRunNodeKillsTheGroup(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed")
	}
	dir := t.TempDir()
	script := `import { spawn } from "node:child_process";
spawn("sleep", ["300"], { stdio: ["ignore", "inherit", "inherit"] });
setTimeout(() => {}, 300000);
`
	if err := os.WriteFile(filepath.Join(dir, "hang.mjs"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := runNode(ctx, dir, "hang.mjs", nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("runNode of a script killed at its deadline returned no error")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("runNode still waiting 60 s after its deadline")
	}
}
