package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/troupe/troupe/kernels"
	"github.com/troupe/troupe/models/demo"
)

// TestVersion: `troupe version` (and --version) names the Go toolchain,
// the platform, the embedded kernels' compiler and the demo model, as
// text or one JSON object, and refuses arguments.
func TestVersion(t *testing.T) {
	m, err := kernels.ReadManifest(kernels.FS())
	if err != nil {
		t.Fatal(err)
	}
	wantDemo := ""
	if demo.Embedded() {
		wantDemo = demo.Name
	}
	out, _, err := runCLI(t, "", "--version", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var v versionInfo
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	if v.Go != runtime.Version() || v.Platform != runtime.GOOS+"/"+runtime.GOARCH || v.Kernels != m.NVCC || m.NVCC == "" ||
		v.Demo != wantDemo || v.Version == "" {
		t.Errorf("version --json: %+v", v)
	}
	text, _, err := runCLI(t, "", "version")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"troupe " + v.Version, runtime.Version(), m.NVCC} {
		if !strings.Contains(text, want) {
			t.Errorf("version does not say %q:\n%s", want, text)
		}
	}
	if _, _, err := runCLI(t, "", "version", "now"); err == nil || !strings.Contains(err.Error(), `"now"`) {
		t.Errorf("version now: %v", err)
	}
}

// TestServeBuildInfo: a serving node's /metrics names its build.
func TestServeBuildInfo(t *testing.T) {
	s := startServe(t, nil)
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	want := fmt.Sprintf(`go=%q`, runtime.Version())
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "troupe_build_info{") && strings.Contains(line, want) && strings.HasSuffix(line, "} 1") {
			return
		}
	}
	t.Errorf("no troupe_build_info with %s:\n%s", want, raw)
}

// TestSemver: a build's module version becomes a micro service's semver
// version: releases and pseudo-versions without their v, anything else
// 0.0.0-devel.
func TestSemver(t *testing.T) {
	for in, want := range map[string]string{
		"v1.4.2":                             "1.4.2",
		"v0.0.0-20261205063838-6d9a48d1a2b3": "0.0.0-20261205063838-6d9a48d1a2b3",
		"v1.5.0-rc.1.0.20261205063838-6d9a48d1a2b3+dirty": "1.5.0-rc.1.0.20261205063838-6d9a48d1a2b3+dirty",
		"v2.0.0+incompatible":                             "2.0.0+incompatible",
		"(devel)":                                         "0.0.0-devel",
		"":                                                "0.0.0-devel",
		"1.2.3":                                           "0.0.0-devel",
		"v1.2":                                            "0.0.0-devel",
	} {
		if got := (versionInfo{Version: in}).semver(); got != want {
			t.Errorf("semver of %q = %q, want %q", in, got, want)
		}
	}
}
