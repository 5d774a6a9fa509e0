package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// testMainEnv makes the test binary run as troupe itself: the tests that
// need troupe processes (allreduce-bench --procs) start this binary with
// it set.
const testMainEnv = "TROUPE_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(testMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
