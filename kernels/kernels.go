package kernels

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

//go:embed manifest.json cuda
var files embed.FS

// FS returns the embedded sources, artifacts and manifest, laid out as in
// the source tree (manifest.json, cuda/NAME.cu, cuda/NAME.sm_90a.cubin, ...).
func FS() fs.FS { return files }

// Manifest describes the built artifacts.
type Manifest struct {
	NVCC       string   `json:"nvcc"`
	CubinFlags string   `json:"cubin_flags"`
	PTXFlags   string   `json:"ptx_flags"`
	Modules    []Module `json:"modules"`
}

// Module is one compiled source file.
type Module struct {
	Name         string `json:"name"`
	Source       string `json:"source"`
	SourceSHA256 string `json:"source_sha256"`
	Cubin        string `json:"cubin"`
	CubinSHA256  string `json:"cubin_sha256"`
	PTX          string `json:"ptx"`
	PTXSHA256    string `json:"ptx_sha256"`
}

// ReadManifest parses manifest.json from fsys.
func ReadManifest(fsys fs.FS) (*Manifest, error) {
	raw, err := fs.ReadFile(fsys, "manifest.json")
	if err != nil {
		return nil, fmt.Errorf("kernels: read manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("kernels: parse manifest: %w", err)
	}
	return &m, nil
}

// Module returns the module called name.
func (m *Manifest) Module(name string) (Module, bool) {
	for _, mod := range m.Modules {
		if mod.Name == name {
			return mod, true
		}
	}
	return Module{}, false
}

// SourceHash computes the hash build.sh records for module name: over the
// module's .cu and then every .cuh in cuda/ in name order, each file's base
// name, a newline and its bytes; then "flags:", the cubin flags, a newline
// and the PTX flags.
func SourceHash(fsys fs.FS, name, cubinFlags, ptxFlags string) (string, error) {
	headers, err := fs.Glob(fsys, "cuda/*.cuh")
	if err != nil {
		return "", fmt.Errorf("kernels: hash %s: %w", name, err)
	}
	sort.Strings(headers)
	h := sha256.New()
	for _, f := range append([]string{"cuda/" + name + ".cu"}, headers...) {
		raw, err := fs.ReadFile(fsys, f)
		if err != nil {
			return "", fmt.Errorf("kernels: hash %s: %w", name, err)
		}
		fmt.Fprintf(h, "%s\n", path.Base(f))
		h.Write(raw)
	}
	fmt.Fprintf(h, "flags:%s\n%s", cubinFlags, ptxFlags)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// FileHash is the hex sha256 of a file in fsys.
func FileHash(fsys fs.FS, name string) (string, error) {
	raw, err := fs.ReadFile(fsys, name)
	if err != nil {
		return "", fmt.Errorf("kernels: hash %s: %w", name, err)
	}
	s := sha256.Sum256(raw)
	return hex.EncodeToString(s[:]), nil
}

// Verify checks that every source in cuda/ has a module in the manifest
// whose source hash matches the sources and whose artifacts exist and match
// their recorded hashes. It returns one error naming every mismatch.
func Verify(fsys fs.FS) error {
	m, err := ReadManifest(fsys)
	if err != nil {
		return err
	}
	srcs, err := fs.Glob(fsys, "cuda/*.cu")
	if err != nil {
		return fmt.Errorf("kernels: verify: %w", err)
	}
	var bad []string
	seen := map[string]bool{}
	for _, s := range srcs {
		name := strings.TrimSuffix(path.Base(s), ".cu")
		seen[name] = true
		mod, ok := m.Module(name)
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: not in the manifest (run kernels/build.sh)", s))
			continue
		}
		want, err := SourceHash(fsys, name, m.CubinFlags, m.PTXFlags)
		if err != nil {
			return err
		}
		if want != mod.SourceSHA256 {
			bad = append(bad, fmt.Sprintf("%s: sources changed since its artifacts were built (hash %s, manifest %s): run kernels/build.sh", s, want[:12], short(mod.SourceSHA256)))
		}
		for _, a := range [][2]string{{mod.Cubin, mod.CubinSHA256}, {mod.PTX, mod.PTXSHA256}} {
			got, err := FileHash(fsys, a[0])
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s: artifact %s missing", s, a[0]))
				continue
			}
			if got != a[1] {
				bad = append(bad, fmt.Sprintf("%s: artifact %s does not match the manifest", s, a[0]))
			}
		}
	}
	for _, mod := range m.Modules {
		if !seen[mod.Name] {
			bad = append(bad, fmt.Sprintf("manifest module %s has no source %s", mod.Name, mod.Source))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("kernels: %d problems:\n  %s", len(bad), strings.Join(bad, "\n  "))
	}
	return nil
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}
