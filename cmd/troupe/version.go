package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/troupe/troupe/kernels"
	"github.com/troupe/troupe/models/demo"
)

// versionInfo is what `troupe version` reports: what a bug report needs to
// name the binary.
type versionInfo struct {
	Version  string `json:"version"`            // the module's, "(devel)" when built from a checkout
	Revision string `json:"revision,omitempty"` // the source's commit, where the build recorded it
	Time     string `json:"time,omitempty"`     // the commit's time
	Modified bool   `json:"modified,omitempty"` // built from a tree with changes beyond that commit
	Go       string `json:"go"`
	Platform string `json:"platform"`
	Kernels  string `json:"kernels"` // the compiler of the embedded CUDA kernels
	Demo     string `json:"demo"`    // the embedded demo model, or "" when built without it
}

// buildVersion reads the binary's own build record.
func buildVersion() versionInfo {
	v := versionInfo{Version: "unknown", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v.Version = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Revision = s.Value
			case "vcs.time":
				v.Time = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if m, err := kernels.ReadManifest(kernels.FS()); err == nil {
		v.Kernels = m.NVCC
	}
	if demo.Embedded() {
		v.Demo = demo.Name
	}
	return v
}

// semverRE is the pattern semver.org suggests, which micro services'
// versions must match.
var semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// semver is v's module version as the node's micro services report it:
// a release or pseudo-version without its v, and 0.0.0-devel for a build
// that recorded none (go run, a checkout's go build).
func (v versionInfo) semver() string {
	if s, ok := strings.CutPrefix(v.Version, "v"); ok && semverRE.MatchString(s) {
		return s
	}
	return "0.0.0-devel"
}

// labels are v as the labels of the gateway's troupe_build_info metric.
func (v versionInfo) labels() map[string]string {
	l := map[string]string{"version": v.Version, "go": v.Go, "platform": v.Platform}
	if v.Revision != "" {
		l["revision"] = v.Revision
	}
	return l
}

func cmdVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("version", stderr)
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("version: unexpected argument %q", fs.Arg(0))
	}
	v := buildVersion()
	if *asJSON {
		return json.NewEncoder(stdout).Encode(v)
	}
	rev := v.Revision
	if rev == "" {
		rev = "no revision recorded"
	} else if v.Modified {
		rev += " (modified)"
	}
	if v.Time != "" {
		rev += ", " + v.Time
	}
	demoModel := v.Demo
	if demoModel == "" {
		demoModel = "none (built with nodemo)"
	}
	_, err := fmt.Fprintf(stdout, "troupe %s (%s)\n%s %s\nCUDA kernels: %s\ndemo model: %s\n",
		v.Version, rev, v.Go, v.Platform, v.Kernels, demoModel)
	return err
}
