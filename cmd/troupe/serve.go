package main

import (
	"context"
	"fmt"
	"io"
)

func cmdServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return fmt.Errorf("serve: not wired yet")
}
