package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/troupe/troupe/models/hub"
)

// pullResult is what pull --json prints.
type pullResult struct {
	Model    string `json:"model"`
	Revision string `json:"revision"`
	Dir      string `json:"dir"`
}

func cmdPull(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("pull", stderr)
	asJSON := fs.Bool("json", false, "print JSON only: the repository, revision and folder")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: troupe pull [--json] ORG/NAME[@REVISION]\n\nFetches a checkpoint from the Hugging Face Hub into its cache (HF_HUB_CACHE, else\n$HF_HOME/hub, else ~/.cache/huggingface/hub) and prints its folder. HF_TOKEN (or the\ntoken file under HF_HOME) is sent for gated and private repositories, HF_ENDPOINT names\na mirror, HF_HUB_OFFLINE=1 takes the cache alone. Every command's --model takes\nORG/NAME[@REVISION] the same way.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("pull: want one repository, ORG/NAME[@REVISION]")
	}
	repo, rev, err := hub.ParseRef(fs.Arg(0))
	if err != nil {
		return fmt.Errorf("pull: %w", err)
	}
	progress := stderr
	if *asJSON {
		progress = nil
	}
	dir, err := fetchModel(ctx, repo, rev, progress)
	if err != nil {
		return fmt.Errorf("pull: %w", err)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(pullResult{Model: repo, Revision: rev, Dir: dir})
	}
	_, err = fmt.Fprintln(stdout, dir)
	return err
}

// modelDir is the folder a --model value names: a folder as it is, or
// a Hub repository (ORG/NAME[@REVISION]; no folder by that name) fetched
// into the Hub's cache, with the repository's id as the model's name.
// Progress goes to progress unless it is nil.
func modelDir(ctx context.Context, spec string, progress io.Writer) (dir, name string, err error) {
	if _, err := os.Stat(spec); err == nil || spec == "" {
		return spec, "", nil
	}
	repo, rev, perr := hub.ParseRef(spec)
	if perr != nil {
		return spec, "", nil // a path: opening it says what is wrong
	}
	if dir, err = fetchModel(ctx, repo, rev, progress); err != nil {
		return "", "", fmt.Errorf("%s is not a folder, and as a Hugging Face repository: %w", spec, err)
	}
	return dir, repo, nil
}

// fetchModel fetches repo at rev into the Hub's cache and returns its
// folder.
func fetchModel(ctx context.Context, repo, rev string, progress io.Writer) (string, error) {
	c := hub.FromEnv(os.LookupEnv)
	if progress != nil {
		p := &pullProgress{w: progress}
		c.Progress = p.report
		fmt.Fprintf(progress, "fetching %s@%s into %s\n", repo, rev, c.Cache)
	}
	return c.Snapshot(ctx, repo, rev)
}

// pullProgress prints a line as each file is found cached or fetched, and
// while files are in flight a line a second of their bytes and rate.
type pullProgress struct {
	w      io.Writer
	mu     sync.Mutex
	last   time.Time
	begun  map[string]time.Time
	flight map[string]hub.Progress
}

func (p *pullProgress) report(s hub.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.begun == nil {
		p.begun, p.flight, p.last = map[string]time.Time{}, map[string]hub.Progress{}, now
	}
	switch {
	case s.Cached:
		fmt.Fprintf(p.w, "  %-40s %10s  cached\n", s.File, bytesOf(s.Total))
		return
	case s.File == "":
		fmt.Fprintf(p.w, "  %d file(s) to fetch, %s\n", s.Files, bytesOf(s.Total))
		return
	}
	if _, ok := p.begun[s.File]; !ok {
		p.begun[s.File] = now
	}
	if s.Done == s.Total {
		delete(p.flight, s.File)
		secs := now.Sub(p.begun[s.File]).Seconds()
		rate := ""
		if secs > 0.05 {
			rate = fmt.Sprintf(", %s/s", bytesOf(int64(float64(s.Total)/secs)))
		}
		fmt.Fprintf(p.w, "  %-40s %10s  fetched in %.1fs%s\n", s.File, bytesOf(s.Total), secs, rate)
		return
	}
	p.flight[s.File] = s
	if now.Sub(p.last) < time.Second {
		return
	}
	p.last = now
	var done, total int64
	for _, f := range p.flight {
		done, total = done+f.Done, total+f.Total
	}
	fmt.Fprintf(p.w, "  %d file(s) in flight: %s of %s (%.0f%%)\n", len(p.flight), bytesOf(done), bytesOf(total), 100*float64(done)/float64(max(total, 1)))
}
