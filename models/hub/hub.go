package hub

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/troupe/troupe/models/safetensors"
)

// DefaultEndpoint is the Hugging Face Hub.
const DefaultEndpoint = "https://huggingface.co"

// Client fetches checkpoints from a Hub into its cache.
type Client struct {
	Endpoint string       // the Hub's address; DefaultEndpoint where empty
	Token    string       // sent as a bearer token where set
	Cache    string       // the Hub cache folder (…/huggingface/hub)
	Offline  bool         // take the cache alone, asking the Hub nothing
	HTTP     *http.Client // http.DefaultClient where nil
	// Free, where set, replaces the file system's count of free bytes
	// under a path, which Snapshot checks before it fetches.
	Free func(path string) (int64, error)
	// Progress, where set, is told of each file as its bytes arrive, from
	// the goroutines fetching them (several at once), and once of each
	// file the cache holds.
	Progress func(Progress)
}

// Progress is where the fetch of one file stands, or, once before the
// fetching starts, with File empty, how many files (Files) of how many
// bytes (Total) are to be fetched.
type Progress struct {
	File        string
	Done, Total int64 // bytes
	Cached      bool  // the cache held it already
	Files       int
}

// FromEnv returns a Client set up as huggingface_hub sets itself up, from
// the variables lookup reads (os.LookupEnv in a program): HF_ENDPOINT,
// HF_TOKEN (else the token file under HF_HOME), HF_HUB_CACHE (else
// $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// $HOME/.cache/huggingface/hub) and HF_HUB_OFFLINE.
func FromEnv(lookup func(string) (string, bool)) Client {
	get := func(k string) string {
		v, _ := lookup(k)
		return v
	}
	home := get("HF_HOME")
	switch {
	case home != "":
	case get("XDG_CACHE_HOME") != "":
		home = filepath.Join(get("XDG_CACHE_HOME"), "huggingface")
	case get("HOME") != "":
		home = filepath.Join(get("HOME"), ".cache", "huggingface")
	default:
		home = filepath.Join(os.TempDir(), "huggingface")
	}
	c := Client{Endpoint: get("HF_ENDPOINT"), Token: get("HF_TOKEN"), Cache: get("HF_HUB_CACHE")}
	if c.Token == "" {
		if b, err := os.ReadFile(filepath.Join(home, "token")); err == nil {
			c.Token = strings.TrimSpace(string(b))
		}
	}
	if c.Cache == "" {
		c.Cache = filepath.Join(home, "hub")
	}
	switch strings.ToLower(get("HF_HUB_OFFLINE")) {
	case "1", "true", "yes", "on":
		c.Offline = true
	}
	return c
}

var (
	repoRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$`)
	revisionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
	commitRE   = regexp.MustCompile(`^[0-9a-f]{40}$`)
	sha256RE   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ParseRef reads "ORG/NAME" or "ORG/NAME@REVISION" (a branch, tag or
// commit; "main" where none is given).
func ParseRef(s string) (repo, revision string, err error) {
	repo, revision, _ = strings.Cut(s, "@")
	if revision == "" {
		revision = "main"
	}
	if !repoRE.MatchString(repo) || strings.Contains(repo, "..") || strings.HasSuffix(repo, ".git") {
		return "", "", fmt.Errorf("hub: %q is not a repository id (ORG/NAME)", s)
	}
	if !revisionRE.MatchString(revision) || slices.Contains(strings.Split(revision, "/"), "..") || strings.HasSuffix(revision, "/") {
		return "", "", fmt.Errorf("hub: %q is not a revision", revision)
	}
	return repo, revision, nil
}

// repoInfo is what the Hub's API says of a repository at a revision
// (GET /api/models/REPO/revision/REV?blobs=true).
type repoInfo struct {
	SHA      string    `json:"sha"`
	Siblings []sibling `json:"siblings"`
}

type sibling struct {
	Name   string `json:"rfilename"`
	BlobID string `json:"blobId"`
	Size   int64  `json:"size"`
	LFS    *struct {
		SHA256 string `json:"sha256"`
		Size   int64  `json:"size"`
	} `json:"lfs"`
}

// file is one file to fetch: its name in the repository, the cache's name
// for its bytes (the SHA-256 of an LFS file, the git blob hash of another)
// and its size.
type file struct {
	name, etag string
	size       int64
	lfs        bool
}

// wanted reports whether troupe loads a repository's top-level file name.
func wanted(name string) bool {
	switch name {
	case "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
		"special_tokens_map.json", "chat_template.jinja", "chat_template.json":
		return true
	}
	return strings.HasSuffix(name, ".safetensors") || strings.HasSuffix(name, ".safetensors.index.json")
}

// plan checks what the Hub said of a repository and returns the files to
// fetch: every name and hash is checked, since they become paths.
func plan(info repoInfo) ([]file, error) {
	if !commitRE.MatchString(info.SHA) {
		return nil, fmt.Errorf("the Hub named commit %q", truncate(info.SHA))
	}
	var files []file
	config, weights := false, false
	for _, s := range info.Siblings {
		if strings.ContainsAny(s.Name, `/\`) || !wanted(s.Name) {
			continue
		}
		f := file{name: s.Name, etag: s.BlobID, size: s.Size}
		if s.LFS != nil {
			f.etag, f.size, f.lfs = s.LFS.SHA256, s.LFS.Size, true
		}
		if (f.lfs && !sha256RE.MatchString(f.etag)) || (!f.lfs && !commitRE.MatchString(f.etag)) || f.size < 0 {
			return nil, fmt.Errorf("%s: the Hub gave hash %q and size %d", truncate(s.Name), truncate(f.etag), f.size)
		}
		config = config || f.name == "config.json"
		weights = weights || strings.HasSuffix(f.name, ".safetensors")
		files = append(files, f)
	}
	switch {
	case !config:
		return nil, errors.New("the repository has no config.json")
	case !weights:
		return nil, errors.New("the repository has no safetensors weights (troupe reads no other format)")
	}
	return files, nil
}

// repoDir is the cache's folder for repo.
func (c Client) repoDir(repo string) string {
	return filepath.Join(c.Cache, "models--"+strings.ReplaceAll(repo, "/", "--"))
}

// Snapshot returns the folder that holds repo's files at revision, fetching
// those the cache lacks. Offline, or where the Hub cannot be reached or
// answers with a server error, it returns the cache's snapshot of the
// revision if there is one.
func (c Client) Snapshot(ctx context.Context, repo, revision string) (string, error) {
	if _, _, err := ParseRef(repo + "@" + revision); err != nil {
		return "", err
	}
	dir := c.repoDir(repo)
	if c.Offline {
		return c.cached(dir, repo, revision)
	}
	info, err := c.info(ctx, repo, revision)
	if err != nil {
		var he *statusError
		if (!errors.As(err, &he) || he.status >= 500) && ctx.Err() == nil { // unreachable, or down
			if snap, cerr := c.cached(dir, repo, revision); cerr == nil {
				return snap, nil
			}
		}
		return "", err
	}
	files, err := plan(info)
	if err != nil {
		return "", fmt.Errorf("hub: %s@%s: %w", repo, revision, err)
	}
	snap := filepath.Join(dir, "snapshots", info.SHA)
	if err := os.MkdirAll(snap, 0o755); err != nil {
		return "", fmt.Errorf("hub: %w", err)
	}
	var missing []file
	for _, f := range files {
		if st, err := os.Stat(filepath.Join(dir, "blobs", f.etag)); err == nil && st.Size() == f.size {
			c.report(Progress{File: f.name, Done: f.size, Total: f.size, Cached: true})
		} else {
			missing = append(missing, f)
		}
	}
	if err := c.room(dir, missing); err != nil {
		return "", fmt.Errorf("hub: %s@%s: %w", repo, revision, err)
	}
	if len(missing) > 0 {
		var total int64
		for _, f := range missing {
			total += f.size
		}
		c.report(Progress{Files: len(missing), Total: total})
	}
	if err := c.fetchAll(ctx, repo, info.SHA, dir, missing); err != nil {
		return "", fmt.Errorf("hub: %s@%s: %w", repo, revision, err)
	}
	for _, f := range files {
		link := filepath.Join(snap, f.name)
		target := filepath.Join("..", "..", "blobs", f.etag)
		if got, err := os.Readlink(link); err == nil && got == target {
			continue
		}
		_ = os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			// Another process may have linked it between the two calls.
			if got, lerr := os.Readlink(link); lerr != nil || got != target {
				return "", fmt.Errorf("hub: %w", err)
			}
		}
	}
	if revision != info.SHA {
		ref := filepath.Join(dir, "refs", filepath.FromSlash(revision))
		if err := os.MkdirAll(filepath.Dir(ref), 0o755); err != nil {
			return "", fmt.Errorf("hub: %w", err)
		}
		// Written whole, then renamed: a reader never sees half a ref.
		tmp, err := os.CreateTemp(filepath.Dir(ref), ".ref-")
		if err == nil {
			_, err = tmp.WriteString(info.SHA)
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = os.Rename(tmp.Name(), ref)
			}
			if err != nil {
				_ = os.Remove(tmp.Name())
			}
		}
		if err != nil {
			return "", fmt.Errorf("hub: %w", err)
		}
	}
	return snap, nil
}

// cached is the cache's snapshot of repo at revision, where it holds a
// config.json and weights.
func (c Client) cached(dir, repo, revision string) (string, error) {
	commit := revision
	if !commitRE.MatchString(revision) {
		b, err := os.ReadFile(filepath.Join(dir, "refs", filepath.FromSlash(revision)))
		if err != nil {
			return "", fmt.Errorf("hub: %s@%s is not in the cache %s", repo, revision, c.Cache)
		}
		commit = strings.TrimSpace(string(b))
	}
	snap := filepath.Join(dir, "snapshots", commit)
	weights, _ := filepath.Glob(filepath.Join(snap, "*.safetensors"))
	if _, err := os.Stat(filepath.Join(snap, "config.json")); err != nil || !commitRE.MatchString(commit) || len(weights) == 0 {
		return "", fmt.Errorf("hub: %s@%s is not in the cache %s", repo, revision, c.Cache)
	}
	return snap, nil
}

func (c Client) report(p Progress) {
	if c.Progress != nil {
		c.Progress(p)
	}
}

func (c Client) endpoint() string {
	if c.Endpoint == "" {
		return DefaultEndpoint
	}
	return strings.TrimRight(c.Endpoint, "/")
}

// statusError is an answer of the Hub's other than success.
type statusError struct {
	status     int
	code, text string
}

func (e *statusError) Error() string {
	s := fmt.Sprintf("the Hub answered %d", e.status)
	if e.code != "" {
		s += " (" + e.code + ")"
	}
	if e.text != "" {
		s += ": " + e.text
	}
	return s
}

// get asks the Hub for u, with the token and header h.
func (c Client) get(ctx context.Context, u string, h http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("User-Agent", "troupe")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		text := resp.Header.Get("X-Error-Message")
		if text == "" {
			var body struct {
				Error string `json:"error"`
			}
			if json.Unmarshal(msg, &body) == nil {
				text = body.Error
			}
		}
		return nil, &statusError{status: resp.StatusCode, code: resp.Header.Get("X-Error-Code"), text: truncate(text)}
	}
	return resp, nil
}

// explain words a failed request about repo at revision for the person
// who asked.
func (c Client) explain(repo, revision string, err error) error {
	var se *statusError
	if !errors.As(err, &se) {
		return fmt.Errorf("hub: %s@%s: %w", repo, revision, err)
	}
	why := ""
	switch {
	case se.code == "GatedRepo" || (se.status == http.StatusForbidden && c.Token != ""):
		why = fmt.Sprintf("the repository is gated: accept its terms at %s/%s and set HF_TOKEN to a token of that account", c.endpoint(), repo)
	case se.status == http.StatusUnauthorized && c.Token == "":
		why = "the Hub wants a token for it (private, gated or absent): set HF_TOKEN"
	case se.status == http.StatusUnauthorized:
		why = "the Hub refused the token (HF_TOKEN) for it"
	case se.code == "RevisionNotFound":
		why = "the repository has no revision " + revision
	case se.status == http.StatusNotFound:
		why = "no such repository on " + c.endpoint()
	}
	if why == "" {
		return fmt.Errorf("hub: %s@%s: %w", repo, revision, err)
	}
	return fmt.Errorf("hub: %s@%s: %s (%w)", repo, revision, why, err)
}

// info asks the Hub what repo holds at revision.
func (c Client) info(ctx context.Context, repo, revision string) (repoInfo, error) {
	var info repoInfo
	resp, err := c.get(ctx, c.endpoint()+"/api/models/"+repo+"/revision/"+url.PathEscape(revision)+"?blobs=true", nil)
	if err != nil {
		return info, c.explain(repo, revision, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&info); err != nil {
		return info, fmt.Errorf("hub: %s@%s: the Hub's answer: %w", repo, revision, err)
	}
	return info, nil
}

// room checks that the cache's file system has room for files beyond
// what their partial downloads hold already.
func (c Client) room(dir string, files []file) error {
	var need int64
	for _, f := range files {
		need += f.size
		if st, err := os.Stat(filepath.Join(dir, "blobs", f.etag+".incomplete")); err == nil {
			need -= min(st.Size(), f.size)
		}
	}
	if need == 0 {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(dir, "blobs"), 0o755); err != nil {
		return err
	}
	free := c.Free
	if free == nil {
		free = freeBytes
	}
	avail, err := free(filepath.Join(dir, "blobs"))
	if err != nil {
		return nil // unknown: the writes will say
	}
	if need > avail {
		return fmt.Errorf("fetching needs %s and %s is free where the cache is (%s): make room or set HF_HUB_CACHE", sizeOf(need), sizeOf(avail), c.Cache)
	}
	return nil
}

// freeBytes is how many bytes an unprivileged process may still write on
// the file system holding path.
func freeBytes(path string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

func sizeOf(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// fetchers is how many files are fetched at once.
const fetchers = 4

// fetchAll fetches files of repo at commit into the blobs of dir, fetchers
// at a time; the first failure stops the others and is returned.
func (c Client) fetchAll(ctx context.Context, repo, commit, dir string, files []file) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, fetchers)
	for _, f := range files {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			if err := c.fetch(ctx, repo, commit, f, filepath.Join(dir, "blobs", f.etag)); err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("%s: %w", f.name, err)
					cancel()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}

// fetch downloads f of repo at commit into blob, through blob.incomplete:
// what an earlier attempt left there is kept and the rest asked for by a
// range; the whole is checked against f's hash before it becomes blob. A
// lock on the partial file keeps two processes from fetching it at once.
func (c Client) fetch(ctx context.Context, repo, commit string, f file, blob string) error {
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return err
	}
	part, err := os.OpenFile(blob+".incomplete", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer part.Close()
	if err := syscall.Flock(int(part.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", part.Name(), err)
	}
	if st, err := os.Stat(blob); err == nil && st.Size() == f.size {
		return nil // another process fetched it while this one waited
	}
	h := newHash(f)
	have, err := io.Copy(h, part)
	if err != nil {
		return err
	}
	if have > f.size {
		if have, err = 0, part.Truncate(0); err != nil {
			return err
		}
		h = newHash(f)
	}
	if have < f.size {
		rng := ""
		if have > 0 {
			rng = "bytes=" + strconv.FormatInt(have, 10) + "-"
		}
		resp, err := c.resolve(ctx, repo, commit, f.name, rng)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusPartialContent {
			// The whole file: start again.
			if err := part.Truncate(0); err != nil {
				return err
			}
			have, h = 0, newHash(f)
		}
		if _, err := part.Seek(have, io.SeekStart); err != nil {
			return err
		}
		w := &counter{f: f.name, done: have, total: f.size, report: c.report}
		n, err := io.Copy(io.MultiWriter(part, h, w), io.LimitReader(resp.Body, f.size-have+1))
		have += n
		if err != nil {
			return fmt.Errorf("after %d of %d bytes (run again to resume): %w", have, f.size, err)
		}
	}
	if have != f.size {
		_ = os.Remove(part.Name())
		return fmt.Errorf("%d bytes where the Hub records %d", have, f.size)
	}
	if err := verify(h, f); err != nil {
		_ = os.Remove(part.Name())
		return err
	}
	if err := part.Sync(); err != nil {
		return err
	}
	return os.Rename(part.Name(), blob)
}

// resolve asks the Hub for file name of repo at commit, for the byte
// range rng where it is set.
func (c Client) resolve(ctx context.Context, repo, commit, name, rng string) (*http.Response, error) {
	hdr := http.Header{}
	if rng != "" {
		hdr.Set("Range", rng)
	}
	resp, err := c.get(ctx, c.endpoint()+"/"+repo+"/resolve/"+commit+"/"+url.PathEscape(name), hdr)
	if err != nil {
		return nil, c.explain(repo, commit, err)
	}
	return resp, nil
}

// verify checks that h, which has taken f's bytes, gives f's hash.
func verify(h hash.Hash, f file) error {
	if got := hex.EncodeToString(h.Sum(nil)); got != f.etag {
		return fmt.Errorf("its bytes hash to %s where the Hub records %s", got, f.etag)
	}
	return nil
}

// newHash is the hash that names f: SHA-256 for an LFS file, git's blob
// hash (SHA-1 over "blob SIZE\0" and the bytes) for another.
func newHash(f file) hash.Hash {
	if f.lfs {
		return sha256.New()
	}
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", f.size)
	return h
}

// counter reports a file's bytes as they are written.
type counter struct {
	f           string
	done, total int64
	report      func(Progress)
}

func (w *counter) Write(p []byte) (int, error) {
	w.done += int64(len(p))
	w.report(Progress{File: w.f, Done: w.done, Total: w.total})
	return len(p), nil
}

func truncate(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// Remote is what a repository holds at a revision, read without its
// weights: its small files whole and each safetensors file's header.
type Remote struct {
	Commit  string
	Files   map[string][]byte // config.json and the tokenizer's files, verified
	Headers map[string]Header // by safetensors file
}

// Header is a safetensors file's first bytes, those of its header, and the
// file's size.
type Header struct {
	Prefix []byte
	Size   int64
}

// maxSmall bounds a small file Peek reads whole.
const maxSmall = 64 << 20

// Peek reads what repo holds at revision without its weights: the files
// Snapshot would fetch but the safetensors whole, and of each safetensors
// file the header, by ranges. It never writes to the cache.
func (c Client) Peek(ctx context.Context, repo, revision string) (*Remote, error) {
	if _, _, err := ParseRef(repo + "@" + revision); err != nil {
		return nil, err
	}
	if c.Offline {
		return nil, fmt.Errorf("hub: %s@%s: offline (HF_HUB_OFFLINE), and not in the cache %s", repo, revision, c.Cache)
	}
	info, err := c.info(ctx, repo, revision)
	if err != nil {
		return nil, err
	}
	files, err := plan(info)
	if err != nil {
		return nil, fmt.Errorf("hub: %s@%s: %w", repo, revision, err)
	}
	r := &Remote{Commit: info.SHA, Files: map[string][]byte{}, Headers: map[string]Header{}}
	for _, f := range files {
		if strings.HasSuffix(f.name, ".safetensors") {
			first, err := c.prefix(ctx, repo, info.SHA, f, 8)
			if err != nil {
				return nil, fmt.Errorf("hub: %s@%s: %s: %w", repo, revision, f.name, err)
			}
			n, err := safetensors.HeaderLen(first)
			if err != nil || n > f.size {
				return nil, fmt.Errorf("hub: %s@%s: %s: not a safetensors file (%v)", repo, revision, f.name, err)
			}
			head, err := c.prefix(ctx, repo, info.SHA, f, n)
			if err != nil {
				return nil, fmt.Errorf("hub: %s@%s: %s: %w", repo, revision, f.name, err)
			}
			r.Headers[f.name] = Header{Prefix: head, Size: f.size}
			continue
		}
		if f.size > maxSmall {
			continue
		}
		b, err := c.prefix(ctx, repo, info.SHA, f, f.size)
		if err == nil {
			h := newHash(f)
			h.Write(b)
			err = verify(h, f)
		}
		if err != nil {
			return nil, fmt.Errorf("hub: %s@%s: %s: %w", repo, revision, f.name, err)
		}
		r.Files[f.name] = b
	}
	return r, nil
}

// prefix reads the first n bytes of f (n at most its size), by a range.
func (c Client) prefix(ctx context.Context, repo, commit string, f file, n int64) ([]byte, error) {
	if n > f.size {
		return nil, fmt.Errorf("%d bytes asked of a %d-byte file", n, f.size)
	}
	if n == 0 {
		return []byte{}, nil
	}
	resp, err := c.resolve(ctx, repo, commit, f.name, "bytes=0-"+strconv.FormatInt(n-1, 10))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(resp.Body, b); err != nil {
		return nil, fmt.Errorf("reading its first %d bytes: %w", n, err)
	}
	return b, nil
}

// Cached returns the cache's snapshot of repo at revision where it holds a
// config.json and weights, asking the Hub nothing.
func (c Client) Cached(repo, revision string) (string, error) {
	if _, _, err := ParseRef(repo + "@" + revision); err != nil {
		return "", err
	}
	return c.cached(c.repoDir(repo), repo, revision)
}
