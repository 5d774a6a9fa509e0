package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// serveFlags returns the names of `troupe serve`'s flags, from its usage.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	var usage bytes.Buffer
	if _, err := parseServe([]string{"-h"}, &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("serve -h: %v", err)
	}
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(usage.String(), -1) {
		out[m[1]] = true
	}
	if !out["route-listen"] || !out["placement"] {
		t.Fatalf("serve flags %v: parsing the usage failed", out)
	}
	return out
}

func readDeploy(t *testing.T, name string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", name))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("\t")) && strings.HasSuffix(name, ".yaml") {
		t.Fatalf("%s: YAML must not contain tabs", name)
	}
	return string(raw)
}

var flagRE = regexp.MustCompile(`(?m)(?:^|[\s'"])--([a-z][a-z-]*)`)

// checkFlags fails for every --flag outside comments in text that `troupe
// serve` does not define, and returns the flags used.
func checkFlags(t *testing.T, name, text string, known map[string]bool) map[string]bool {
	t.Helper()
	used := map[string]bool{}
	var code strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			code.WriteString(line + "\n")
		}
	}
	for _, m := range flagRE.FindAllStringSubmatch(code.String(), -1) {
		used[m[1]] = true
		if !known[m[1]] {
			t.Errorf("%s uses --%s, which troupe serve does not define", name, m[1])
		}
	}
	return used
}

// TestDeployFiles checks the deployment files against the binary: every
// flag they pass exists, the cluster flags are there, and the manifests
// have the kinds and fields the docs promise. (Without a YAML parser in the
// module's dependencies, the YAML checks are line-based.)
func TestDeployFiles(t *testing.T) {
	known := serveFlags(t)
	need := []string{"route-listen", "join", "bus-user", "bus-password", "store-dir", "data-listen"}

	unit := readDeploy(t, "troupe.service")
	for _, sec := range []string{"[Unit]", "[Service]", "[Install]", "User=troupe", "Restart=on-failure"} {
		if !strings.Contains(unit, sec) {
			t.Errorf("troupe.service lacks %q", sec)
		}
	}
	exec := unit[strings.Index(unit, "ExecStart="):]
	exec = exec[:strings.Index(exec, "'\n")]
	if !strings.Contains(exec, "troupe serve") {
		t.Errorf("ExecStart does not run troupe serve: %s", exec)
	}
	used := checkFlags(t, "troupe.service", exec, known)
	for _, f := range need {
		if !used[f] {
			t.Errorf("troupe.service does not pass --%s", f)
		}
	}

	docker := readDeploy(t, "Dockerfile")
	for _, s := range []string{"CGO_ENABLED=0", "USER 65532", "nonroot", "./cmd/troupe"} {
		if !strings.Contains(docker, s) {
			t.Errorf("Dockerfile lacks %q", s)
		}
	}

	compose := readDeploy(t, "compose.yaml")
	for _, svc := range []string{"jaeger:", "node-a:", "node-b:", "node-c:"} {
		if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(svc)).MatchString(compose) {
			t.Errorf("compose.yaml lacks service %s", svc)
		}
	}
	used = checkFlags(t, "compose.yaml", compose, known)
	for _, f := range append(need, "placement", "replicas") {
		if !used[f] {
			t.Errorf("compose.yaml does not pass --%s", f)
		}
	}
	if !strings.Contains(compose, "OTEL_EXPORTER_OTLP_ENDPOINT: http://jaeger:4318") {
		t.Error("compose.yaml does not send traces to jaeger")
	}

	k8s := readDeploy(t, "k8s/troupe.yaml")
	docs := strings.Split(k8s, "\n---\n")
	kinds := map[string]string{}
	for _, d := range docs {
		kind := regexp.MustCompile(`(?m)^kind: (\w+)$`).FindStringSubmatch(d)
		name := regexp.MustCompile(`(?m)^  name: ([\w-]+)$`).FindStringSubmatch(d)
		if kind == nil || name == nil {
			t.Fatalf("k8s document without kind or name:\n%s", d)
		}
		kinds[name[1]] = kind[1]
	}
	if kinds["troupe-routes"] != "Service" || kinds["troupe"] != "StatefulSet" {
		t.Errorf("k8s objects %v: want Service troupe-routes and StatefulSet troupe", kinds)
	}
	for _, s := range []string{"clusterIP: None", "serviceName: troupe-routes", "nvidia.com/gpu: 1", "runAsNonRoot: true", "secretKeyRef:", "volumeClaimTemplates:", "path: /ready"} {
		if !strings.Contains(k8s, s) {
			t.Errorf("k8s manifest lacks %q", s)
		}
	}
	used = checkFlags(t, "k8s/troupe.yaml", k8s, known)
	for _, f := range need {
		if !used[f] {
			t.Errorf("k8s manifest does not pass --%s", f)
		}
	}
}
