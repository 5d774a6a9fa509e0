package main

import (
	"context"
	"fmt"
	"io"
)

func cmdTrace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return fmt.Errorf("trace: not wired yet")
}
