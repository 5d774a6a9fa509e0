package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/troupe/troupe/models/synth"
)

func cmdSynth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("synth", stderr)
	arch := fs.String("arch", "olmo2", "architecture: "+strings.Join(synth.Archs(), ", "))
	var names []string
	for _, a := range synth.Archs() {
		names = append(names, a+": "+strings.Join(synth.Names(a), ", "))
	}
	preset := fs.String("preset", "1b", "shape ("+strings.Join(names, "; ")+")")
	layers := fs.Int("layers", 0, "keep only the first N layers of the shape (0: all)")
	out := fs.String("out", "", "output directory (required)")
	seed := fs.Uint64("seed", 1, "random seed")
	quiet := fs.Bool("quiet", false, "print nothing but errors")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("synth: --out is required")
	}
	progress := func(w, total int64) {
		if !*quiet {
			fmt.Fprintf(stderr, "wrote %.2f of %.2f GB\n", float64(w)/1e9, float64(total)/1e9)
		}
	}
	cfg, err := synth.Write(*out, *arch, *preset, *layers, *seed, progress)
	if err != nil {
		return err
	}
	if !*quiet {
		fmt.Fprintf(stdout, "%s: %s\n", *out, cfg.Describe())
	}
	return nil
}
