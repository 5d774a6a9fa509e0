package hubtest

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Hub serves the repository Repo at commit Commit, main naming it.
type Hub struct {
	Repo, Commit string
	Files        map[string][]byte
	LFS          map[string]bool // files kept in LFS
	Token        string          // wanted where set
	Gated        bool
	Cut          int    // where > 0, the first answer for an LFS file stops after Cut bytes
	Corrupt      string // a file whose bytes are served with one flipped

	mu     sync.Mutex
	cutOff map[string]bool
	gets   []string // the file requests: path and Range
}

// BlobID is git's hash of a blob of b, the Hub's name for a small file.
func BlobID(b []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// SHA256 is b's SHA-256, the Hub's name for an LFS file.
func SHA256(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Etag is the Hub's name for file name's bytes.
func (h *Hub) Etag(name string) string {
	if h.LFS[name] {
		return SHA256(h.Files[name])
	}
	return BlobID(h.Files[name])
}

var modTime = time.Unix(1700000000, 0)

func (h *Hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fail := func(status int, code string) {
		w.Header().Set("X-Error-Code", code)
		w.Header().Set("X-Error-Message", code)
		w.WriteHeader(status)
	}
	if strings.HasPrefix(r.URL.Path, "/cdn/") {
		h.serveCDN(w, r)
		return
	}
	if h.Token != "" && r.Header.Get("Authorization") != "Bearer "+h.Token {
		fail(http.StatusUnauthorized, "")
		return
	}
	if h.Gated {
		fail(http.StatusForbidden, "GatedRepo")
		return
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/api/models/"); ok {
		repo, rev, _ := strings.Cut(rest, "/revision/")
		switch {
		case repo != h.Repo:
			fail(http.StatusNotFound, "RepoNotFound")
			return
		case rev != "main" && rev != h.Commit:
			fail(http.StatusNotFound, "RevisionNotFound")
			return
		}
		var sibs []map[string]any
		for name, b := range h.Files {
			s := map[string]any{"rfilename": name, "blobId": BlobID(b), "size": len(b)}
			if h.LFS[name] {
				s["size"] = 134 // the pointer's
				s["lfs"] = map[string]any{"sha256": SHA256(b), "size": len(b), "pointerSize": 134}
			}
			sibs = append(sibs, s)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"id": h.Repo, "sha": h.Commit, "siblings": sibs})
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/"+h.Repo+"/resolve/"+h.Commit+"/")
	b, found := h.Files[rest]
	if !ok || !found {
		fail(http.StatusNotFound, "EntryNotFound")
		return
	}
	h.log(r)
	if h.LFS[rest] {
		http.Redirect(w, r, "/cdn/"+rest, http.StatusFound)
		return
	}
	_, _ = w.Write(h.bytes(rest, b))
}

func (h *Hub) log(r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gets = append(h.gets, r.URL.Path+" "+r.Header.Get("Range"))
}

func (h *Hub) bytes(name string, b []byte) []byte {
	if name == h.Corrupt {
		b = bytes.Clone(b)
		b[len(b)/2] ^= 1
	}
	return b
}

// serveCDN serves an LFS file with ranges; the first answer for each stops
// after h.Cut bytes where Cut is set.
func (h *Hub) serveCDN(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/cdn/")
	h.log(r)
	b := h.bytes(name, h.Files[name])
	h.mu.Lock()
	if h.cutOff == nil {
		h.cutOff = map[string]bool{}
	}
	cut := h.Cut > 0 && !h.cutOff[name]
	h.cutOff[name] = true
	h.mu.Unlock()
	if !cut {
		http.ServeContent(w, r, name, modTime, bytes.NewReader(b))
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b[:h.Cut])
	w.(http.Flusher).Flush()
	panic(http.ErrAbortHandler) // the connection drops mid-file
}

// Gets lists the file requests served: each path, a space and its Range.
func (h *Hub) Gets() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.gets...)
}
