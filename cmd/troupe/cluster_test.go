package main

import (
	"io"
	"strings"
	"testing"
)

func TestCheckExposure(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{nil, ""},
		{[]string{"--bus-listen", "127.0.0.1:4222"}, ""},
		{[]string{"--route-listen", "10.0.0.1:6222"}, "--route-listen 10.0.0.1:6222 is reachable"},
		{[]string{"--bus-listen", "0.0.0.0:4222"}, "--bus-listen 0.0.0.0:4222 is reachable"},
		{[]string{"--data-listen", "10.0.0.1:0"}, "--data-listen"},
		{[]string{"--route-listen", "10.0.0.1:6222", "--insecure"}, ""},
		{[]string{"--route-listen", "10.0.0.1:6222", "--bus-user", "u", "--bus-password", "p"}, ""},
		{[]string{"--placement", "a,,b"}, "placement 0"},
		{[]string{"--placement", "a,b;c", "--step-timeout", "0s"}, "--step-timeout"},
		{[]string{"--tp", "2"}, ""},
		{[]string{"--tp", "0"}, "--tp 0"},
		{[]string{"--tp", "9"}, "at most 8"},
		{[]string{"--tp", "2", "--shards", "2"}, "--tp and --shards are exclusive"},
		{[]string{"--tp", "2", "--placement", "a"}, "--tp and --placement are exclusive"},
		{[]string{"--tp", "2", "--replicas", "2"}, ""},
		{[]string{"--tp", "2", "--replicas", "0"}, "needs a local replica"},
		{[]string{"--tp", "4", "--replicas", "3", "--device", "cuda"}, "at most 8 GPUs"},
		{[]string{"--tp", "2", "--device", "ref"}, "--device cpu or cuda"},
	} {
		_, err := parseServe(tc.args, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: got %v, want an error containing %q", tc.args, err, tc.wantErr)
		}
	}
}

func TestParsePlacements(t *testing.T) {
	got, err := parsePlacements(" a, b ,c;a")
	if err != nil || len(got) != 2 || strings.Join(got[0], "|") != "a|b|c" || strings.Join(got[1], "|") != "a" {
		t.Fatalf("got %q, %v", got, err)
	}
	for _, bad := range []string{"", ";", "a;", "a b", "a.b", strings.Repeat("a;", 17) + "a"} {
		if _, err := parsePlacements(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzParsePlacements(f *testing.F) {
	f.Add("h0,h1,h2;h0")
	f.Add("a;;b")
	f.Fuzz(func(t *testing.T, spec string) {
		ps, err := parsePlacements(spec)
		if err != nil {
			return
		}
		for _, p := range ps {
			if len(p) == 0 {
				t.Fatalf("%q: empty placement accepted", spec)
			}
			for _, n := range p {
				if n == "" || strings.ContainsAny(n, ",; .*>") {
					t.Fatalf("%q: node %q accepted", spec, n)
				}
			}
		}
	})
}
