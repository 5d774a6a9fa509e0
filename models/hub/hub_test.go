package hub

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/troupe/troupe/models/hub/hubtest"
	"github.com/troupe/troupe/models/safetensors"
)

const (
	testRepo   = "acme/tiny-lm"
	testCommit = "0123456789abcdef0123456789abcdef01234567"
)

// newFakeHub is a Hub of testRepo: small files, a megabyte of weights in
// LFS, and files troupe does not fetch.
func newFakeHub() *hubtest.Hub {
	rng := rand.New(rand.NewPCG(1, 2))
	weights := make([]byte, 1<<20)
	for i := range weights {
		weights[i] = byte(rng.Uint32())
	}
	return &hubtest.Hub{
		Repo: testRepo, Commit: testCommit,
		Files: map[string][]byte{
			"config.json":                  []byte(`{"model_type": "olmo2"}`),
			"tokenizer.json":               []byte(`{"model": {}}`),
			"model.safetensors":            weights,
			"README.md":                    []byte("# tiny"),
			"pytorch_model.bin":            []byte("not fetched"),
			"original/consolidated.pth":    []byte("not fetched either"),
			"model.safetensors.index.json": []byte(`{"weight_map": {}}`),
		},
		LFS: map[string]bool{"model.safetensors": true, "pytorch_model.bin": true, "original/consolidated.pth": true},
	}
}

func testClient(t *testing.T, srv *httptest.Server) Client {
	return Client{Endpoint: srv.URL, Cache: t.TempDir(), HTTP: srv.Client()}
}

// TestSnapshot: a repository's wanted files land in the Hub's cache layout
// (blobs named by hash, snapshot links, the ref), equal to the Hub's;
// other files are left; a second call fetches nothing, and the cache
// serves offline and where the Hub cannot be reached.
func TestSnapshot(t *testing.T) {
	h := newFakeHub()
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := testClient(t, srv)
	var mu sync.Mutex
	done := map[string]Progress{}
	c.Progress = func(p Progress) {
		mu.Lock()
		done[p.File] = p
		mu.Unlock()
	}
	defer func() {
		// The plan came first: four files, every byte of them.
		var want int64
		for _, name := range []string{"config.json", "tokenizer.json", "model.safetensors", "model.safetensors.index.json"} {
			want += int64(len(h.Files[name]))
		}
		if p := done[""]; p.Files != 4 || p.Total != want {
			t.Errorf("the plan's report: %+v, want 4 files of %d bytes", p, want)
		}
	}()
	snap, err := c.Snapshot(t.Context(), testRepo, "main")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(c.Cache, "models--acme--tiny-lm")
	if want := filepath.Join(dir, "snapshots", testCommit); snap != want {
		t.Errorf("snapshot %s, want %s", snap, want)
	}
	if ref, err := os.ReadFile(filepath.Join(dir, "refs", "main")); err != nil || string(ref) != testCommit {
		t.Errorf("refs/main: %q, %v", ref, err)
	}
	entries, _ := os.ReadDir(snap)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := "config.json model.safetensors model.safetensors.index.json tokenizer.json"; strings.Join(names, " ") != want {
		t.Errorf("snapshot holds %v, want %s", names, want)
	}
	for _, name := range names {
		b := h.Files[name]
		etag := hubtest.BlobID(b)
		if h.LFS[name] {
			etag = hubtest.SHA256(b)
		}
		link, err := os.Readlink(filepath.Join(snap, name))
		if err != nil || link != filepath.Join("..", "..", "blobs", etag) {
			t.Errorf("%s links to %q (%v), want the blob %s", name, link, err, etag)
		}
		if got, err := os.ReadFile(filepath.Join(snap, name)); err != nil || !bytes.Equal(got, b) {
			t.Errorf("%s: %d bytes (%v), want the Hub's %d", name, len(got), err, len(b))
		}
		if p := done[name]; p.Done != int64(len(b)) || p.Total != int64(len(b)) || p.Cached {
			t.Errorf("%s: last progress %+v", name, p)
		}
	}
	gets := len(h.Gets())

	again, err := c.Snapshot(t.Context(), testRepo, "main")
	if err != nil || again != snap || len(h.Gets()) != gets || !done["model.safetensors"].Cached {
		t.Errorf("second snapshot %s (%v): %d file requests after %d; progress %+v", again, err, len(h.Gets()), gets, done["model.safetensors"])
	}
	off := c
	off.Offline, off.Endpoint = true, "http://127.0.0.1:1"
	for _, rev := range []string{"main", testCommit} {
		if got, err := off.Snapshot(t.Context(), testRepo, rev); err != nil || got != snap {
			t.Errorf("offline @%s: %s, %v", rev, got, err)
		}
	}
	if _, err := off.Snapshot(t.Context(), testRepo, "v2"); err == nil || !strings.Contains(err.Error(), "not in the cache") {
		t.Errorf("offline, a revision never fetched: %v", err)
	}
	off.Offline = false // the Hub unreachable: the cache answers
	if got, err := off.Snapshot(t.Context(), testRepo, "main"); err != nil || got != snap {
		t.Errorf("Hub unreachable: %s, %v", got, err)
	}
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer down.Close()
	off.Endpoint = down.URL // the Hub down: the cache answers too
	if got, err := off.Snapshot(t.Context(), testRepo, "main"); err != nil || got != snap {
		t.Errorf("Hub down: %s, %v", got, err)
	}
	// A blob already in the cache is linked, not fetched, for another
	// revision naming the same commit.
	if got, err := c.Snapshot(t.Context(), testRepo, testCommit); err != nil || got != snap || len(h.Gets()) != gets {
		t.Errorf("by commit: %s, %v, %d file requests after %d", got, err, len(h.Gets()), gets)
	}
}

// TestResume: a download cut off mid-file fails, saying to run again; the
// next call asks for the rest by a range and the whole verifies.
func TestResume(t *testing.T) {
	h := newFakeHub()
	h.Cut = 300 << 10
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := testClient(t, srv)
	if _, err := c.Snapshot(t.Context(), testRepo, "main"); err == nil || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("cut download: %v", err)
	}
	blob := filepath.Join(c.Cache, "models--acme--tiny-lm", "blobs", hubtest.SHA256(h.Files["model.safetensors"]))
	part, err := os.Stat(blob + ".incomplete")
	if err != nil || part.Size() == 0 || part.Size() > int64(h.Cut) {
		t.Fatalf("partial file: %v, %v", part, err)
	}
	snap, err := c.Snapshot(t.Context(), testRepo, "main")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(snap, "model.safetensors")); !bytes.Equal(got, h.Files["model.safetensors"]) {
		t.Error("resumed file differs")
	}
	want := fmt.Sprintf("/cdn/model.safetensors bytes=%d-", part.Size())
	found := false
	for _, g := range h.Gets() {
		found = found || g == want
	}
	if !found {
		t.Errorf("no request %q among %q", want, h.Gets())
	}
	if _, err := os.Stat(blob + ".incomplete"); !os.IsNotExist(err) {
		t.Errorf("partial file left: %v", err)
	}
}

// TestCorrupt: bytes that do not hash to the Hub's record never enter the
// cache, for an LFS file and a small one.
func TestCorrupt(t *testing.T) {
	for _, name := range []string{"model.safetensors", "tokenizer.json"} {
		h := newFakeHub()
		h.Corrupt = name
		srv := httptest.NewServer(h)
		c := testClient(t, srv)
		_, err := c.Snapshot(t.Context(), testRepo, "main")
		srv.Close()
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "hash") {
			t.Errorf("%s corrupt: %v", name, err)
			continue
		}
		blobs, _ := os.ReadDir(filepath.Join(c.Cache, "models--acme--tiny-lm", "blobs"))
		for _, b := range blobs {
			want := hubtest.BlobID(h.Files[name])
			if h.LFS[name] {
				want = hubtest.SHA256(h.Files[name])
			}
			if strings.HasPrefix(b.Name(), want) {
				t.Errorf("%s corrupt: %s kept", name, b.Name())
			}
		}
		if _, err := os.Lstat(filepath.Join(c.Cache, "models--acme--tiny-lm", "snapshots", testCommit, name)); !os.IsNotExist(err) {
			t.Errorf("%s corrupt: linked in the snapshot (%v)", name, err)
		}
	}
}

// TestRefusals: tokens, gated and absent repositories and revisions are
// explained.
func TestRefusals(t *testing.T) {
	h := newFakeHub()
	h.Token = "hf_right"
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := testClient(t, srv)
	check := func(what string, c Client, repo, rev, want string) {
		t.Helper()
		_, err := c.Snapshot(t.Context(), repo, rev)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", what, err, want)
		}
	}
	check("no token", c, testRepo, "main", "set HF_TOKEN")
	c.Token = "hf_wrong"
	check("wrong token", c, testRepo, "main", "refused the token")
	c.Token = "hf_right"
	check("absent repository", c, "acme/other", "main", "no such repository")
	check("absent revision", c, testRepo, "v9", "no revision v9")
	check("bad id", c, "../etc", "main", "not a repository id")
	check("bad revision", c, testRepo, "a/../../b", "not a revision")
	if _, err := c.Snapshot(t.Context(), testRepo, "main"); err != nil {
		t.Errorf("right token: %v", err)
	}
	h.Gated = true
	check("gated", c, testRepo, "main", "accept its terms")
}

func TestParseRef(t *testing.T) {
	for in, want := range map[string]string{
		"allenai/OLMo-2-0425-1B":                "allenai/OLMo-2-0425-1B main",
		"Qwen/Qwen3-0.6B@refs/pr/3":             "Qwen/Qwen3-0.6B refs/pr/3",
		"meta-llama/Llama-3.2-1B@" + testCommit: "meta-llama/Llama-3.2-1B " + testCommit,
	} {
		repo, rev, err := ParseRef(in)
		if err != nil || repo+" "+rev != want {
			t.Errorf("ParseRef(%q) = %q %q, %v; want %q", in, repo, rev, err, want)
		}
	}
	for _, bad := range []string{"", "gpt2", "./models/x", "/abs/path", "a/b/c", "a/..", "a/b.git", "a/b@../x", "a/b@x y", "a/b@/x"} {
		if _, _, err := ParseRef(bad); err == nil {
			t.Errorf("ParseRef(%q): no error", bad)
		}
	}
}

// TestPlan: the Hub's file list is checked before any name or hash
// becomes a path.
func TestPlan(t *testing.T) {
	sha := strings.Repeat("a", 64)
	good := repoInfo{SHA: testCommit, Siblings: []sibling{{Name: "config.json", BlobID: testCommit, Size: 2}, {Name: "model.safetensors", LFS: &struct {
		SHA256 string `json:"sha256"`
		Size   int64  `json:"size"`
	}{sha, 9}}}}
	if files, err := plan(good); err != nil || len(files) != 2 || files[1].etag != sha || !files[1].lfs || files[1].size != 9 {
		t.Errorf("plan: %+v, %v", files, err)
	}
	for what, mut := range map[string]func(*repoInfo){
		"bad commit":        func(i *repoInfo) { i.SHA = "../x" },
		"bad blob id":       func(i *repoInfo) { i.Siblings[0].BlobID = "../../x" },
		"bad lfs hash":      func(i *repoInfo) { i.Siblings[1].LFS.SHA256 = "zz" },
		"negative size":     func(i *repoInfo) { i.Siblings[0].Size = -1 },
		"no config":         func(i *repoInfo) { i.Siblings = i.Siblings[1:] },
		"no weights":        func(i *repoInfo) { i.Siblings = i.Siblings[:1] },
		"weights in a path": func(i *repoInfo) { i.Siblings[1].Name = "sub/model.safetensors" },
	} {
		info := good
		info.Siblings = append([]sibling(nil), good.Siblings...)
		lfs := *good.Siblings[1].LFS
		info.Siblings[1].LFS = &lfs
		mut(&info)
		if _, err := plan(info); err == nil {
			t.Errorf("%s: no error", what)
		}
	}
}

// FuzzPlan: whatever the Hub answers, plan never panics and every file it
// accepts has a top-level name and a hex hash for a name.
func FuzzPlan(f *testing.F) {
	f.Add([]byte(`{"sha":"` + testCommit + `","siblings":[{"rfilename":"config.json","blobId":"` + testCommit + `","size":3},{"rfilename":"a.safetensors","lfs":{"sha256":"` + strings.Repeat("b", 64) + `","size":5}}]}`))
	f.Add([]byte(`{"sha":"x","siblings":[{"rfilename":"../../config.json"}]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var info repoInfo
		if json.Unmarshal(raw, &info) != nil {
			return
		}
		files, err := plan(info)
		if err != nil {
			return
		}
		for _, fl := range files {
			if strings.ContainsAny(fl.name, `/\`) || fl.name == ".." || !wanted(fl.name) || fl.size < 0 ||
				strings.ContainsAny(fl.etag, "./\\") || (len(fl.etag) != 40 && len(fl.etag) != 64) {
				t.Errorf("accepted %+v", fl)
			}
		}
	})
}

// TestFromEnv: the Client follows huggingface_hub's variables.
func TestFromEnv(t *testing.T) {
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, "token"), []byte("hf_file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
	c := FromEnv(env(map[string]string{"HF_HOME": home, "HF_ENDPOINT": "https://mirror.example", "HF_HUB_OFFLINE": "1"}))
	if c.Cache != filepath.Join(home, "hub") || c.Token != "hf_file" || c.Endpoint != "https://mirror.example" || !c.Offline {
		t.Errorf("FromEnv: %+v", c)
	}
	c = FromEnv(env(map[string]string{"HF_HOME": home, "HF_TOKEN": "hf_env", "HF_HUB_CACHE": "/elsewhere", "HF_HUB_OFFLINE": "0"}))
	if c.Token != "hf_env" || c.Cache != "/elsewhere" || c.Offline {
		t.Errorf("FromEnv: %+v", c)
	}
	for vars, want := range map[string]string{
		`{"XDG_CACHE_HOME": "/xdg", "HOME": "/home/u"}`: "/xdg/huggingface/hub",
		`{"HOME": "/home/u"}`:                           "/home/u/.cache/huggingface/hub",
	} {
		var m map[string]string
		_ = json.Unmarshal([]byte(vars), &m)
		if c := FromEnv(env(m)); c.Cache != want {
			t.Errorf("%s: cache %s, want %s", vars, c.Cache, want)
		}
	}
}

// TestPeek: a repository is read without its weights: its small files
// whole and verified, each safetensors file's header by ranges, nothing
// written to the cache.
func TestPeek(t *testing.T) {
	var st bytes.Buffer
	tensors := []*safetensors.Tensor{
		{Name: "model.embed_tokens.weight", DType: "BF16", Shape: []int{256, 64}, Data: make([]byte, 256*64*2)},
		{Name: "model.norm.weight", DType: "F32", Shape: []int{64}, Data: make([]byte, 64*4)},
	}
	if err := safetensors.Write(&st, tensors, nil); err != nil {
		t.Fatal(err)
	}
	h := newFakeHub()
	h.Files["model.safetensors"] = st.Bytes()
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := testClient(t, srv)
	r, err := c.Peek(t.Context(), testRepo, "main")
	if err != nil {
		t.Fatal(err)
	}
	if r.Commit != testCommit || string(r.Files["config.json"]) != string(h.Files["config.json"]) || r.Files["tokenizer.json"] == nil || r.Files["model.safetensors"] != nil {
		t.Errorf("peeked %s, files %v", r.Commit, len(r.Files))
	}
	hd := r.Headers["model.safetensors"]
	got, err := safetensors.ParseHeader(hd.Prefix, hd.Size)
	if err != nil || hd.Size != int64(st.Len()) || len(got) != 2 || got["model.norm.weight"].Shape[0] != 64 {
		t.Fatalf("header: %v, %d bytes of %d, %v", got, len(hd.Prefix), hd.Size, err)
	}
	for _, g := range h.Gets() {
		if strings.HasPrefix(g, "/cdn/model.safetensors") && !strings.Contains(g, "bytes=0-") {
			t.Errorf("weights asked whole: %q", g)
		}
	}
	if entries, _ := os.ReadDir(c.Cache); len(entries) != 0 {
		t.Errorf("peek wrote to the cache: %v", entries)
	}
	if _, err := c.Cached(testRepo, "main"); err == nil {
		t.Error("Cached after a peek alone")
	}
	if _, err := c.Snapshot(t.Context(), testRepo, "main"); err != nil {
		t.Fatal(err)
	}
	if dir, err := c.Cached(testRepo, "main"); err != nil || !strings.HasSuffix(dir, testCommit) {
		t.Errorf("Cached after a snapshot: %s, %v", dir, err)
	}
	h.Corrupt = "config.json"
	if _, err := c.Peek(t.Context(), testRepo, "main"); err == nil || !strings.Contains(err.Error(), "hash") {
		t.Errorf("corrupt config: %v", err)
	}
	c.Offline = true
	if _, err := c.Peek(t.Context(), testRepo, "main"); err == nil {
		t.Error("offline peek: no error")
	}
}

// TestRoom: a fetch that the cache's file system has no room for is
// refused before any byte is fetched, saying what it needs; a partial
// download counts as room already taken.
func TestRoom(t *testing.T) {
	h := newFakeHub()
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := testClient(t, srv)
	c.Free = func(string) (int64, error) { return 1000, nil }
	if _, err := c.Snapshot(t.Context(), testRepo, "main"); err == nil || !strings.Contains(err.Error(), "needs 1.0 MiB") {
		t.Errorf("no room: %v", err)
	}
	if len(h.Gets()) != 0 {
		t.Errorf("fetched with no room: %v", h.Gets())
	}
	// All but 1000 bytes already there, partly.
	weights := h.Files["model.safetensors"]
	need := int64(len(weights))
	for _, name := range []string{"config.json", "tokenizer.json", "model.safetensors.index.json"} {
		need += int64(len(h.Files[name]))
	}
	blobs := filepath.Join(c.Cache, "models--acme--tiny-lm", "blobs")
	if err := os.WriteFile(filepath.Join(blobs, h.Etag("model.safetensors")+".incomplete"), weights[:need-1000], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Snapshot(t.Context(), testRepo, "main"); err != nil {
		t.Errorf("room enough beside the partial file: %v", err)
	}
}

// TestConcurrentSnapshots: processes fetching one repository at once
// (here goroutines with clients of their own) all end with the same
// snapshot, each file fetched once under the partial file's lock.
func TestConcurrentSnapshots(t *testing.T) {
	h := newFakeHub()
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := testClient(t, srv)
	dirs := make([]string, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range dirs {
		wg.Go(func() { dirs[i], errs[i] = c.Snapshot(t.Context(), testRepo, "main") })
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != dirs[0] {
			t.Errorf("snapshot %d: %s, %v", i, dirs[i], errs[i])
		}
	}
	got, err := os.ReadFile(filepath.Join(dirs[0], "model.safetensors"))
	if err != nil || !bytes.Equal(got, h.Files["model.safetensors"]) {
		t.Errorf("weights: %d bytes, %v", len(got), err)
	}
	weights := 0
	for _, g := range h.Gets() {
		if strings.HasPrefix(g, "/cdn/model.safetensors") {
			weights++
		}
	}
	if weights != 1 {
		t.Errorf("the weights fetched %d times: %v", weights, h.Gets())
	}
}
