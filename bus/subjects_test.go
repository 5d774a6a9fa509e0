package bus

import (
	"strings"
	"testing"
)

func TestSubjects(t *testing.T) {
	s, err := NewSubjects("prod")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ got, want string }{
		{s.Submit("llama-3.1-8b"), "troupe.prod.sched.llama-3=2E1-8b.submit"},
		{s.Tokens("req1"), "troupe.prod.tokens.req1"},
		{s.Cancel("req1"), "troupe.prod.cancel.req1"},
		{s.CancelAll(), "troupe.prod.cancel.*"},
		{s.Spawn("node-a"), "troupe.prod.spawn.node-a"},
		{s.Stop("node-a"), "troupe.prod.stop.node-a"},
		{s.Heartbeat("node-a"), "troupe.prod.hb.node-a"},
		{s.HeartbeatAll(), "troupe.prod.hb.*"},
		{s.Events("node-a"), "troupe.prod.events.node-a"},
		{s.Actor("shard", "r0/s1"), "troupe.prod.actor.shard.r0=2Fs1"},
		{s.ActorEndpoint("shard", "r0", "step"), "troupe.prod.actor.shard.r0.step"},
		{s.KVManager("r0", KVReserve), "troupe.prod.actor.kvmgr.r0.reserve"},
		{s.RegistryBucket(), "troupe_prod_registry"},
		{s.ResponsesBucket(), "troupe_prod_responses"},
		{s.Exchange("r0/tp"), "troupe.prod.exchange.r0=2Ftp"},
		{s.Submit("*"), "troupe.prod.sched.=2A.submit"},
		{s.Tokens(""), "troupe.prod.tokens.="},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
	for _, bad := range []string{"", "a.b", "a b", "*"} {
		if _, err := NewSubjects(bad); err == nil {
			t.Errorf("NewSubjects(%q) succeeded, want an error", bad)
		}
	}
}

func TestParseTokenRejects(t *testing.T) {
	for _, tok := range []string{"", "a.b", "=2", "=zz", "=41", "a=", "=2e"} {
		if got, err := ParseToken(tok); err == nil {
			t.Errorf("ParseToken(%q) = %q, want an error", tok, got)
		}
	}
}

func FuzzToken(f *testing.F) {
	for _, s := range []string{"", "llama-3.1-8b", "a b*>", "=", "\x00\xff", "org/model:tag"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		tok := Token(name)
		if strings.ContainsAny(tok, ". *>\t\r\n") || tok == "" {
			t.Fatalf("Token(%q) = %q is not one subject token", name, tok)
		}
		back, err := ParseToken(tok)
		if err != nil || back != name {
			t.Fatalf("ParseToken(Token(%q)) = %q, %v", name, back, err)
		}
	})
}

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"=", "abc", "=2E", "=2e", "a=4", "=41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		name, err := ParseToken(tok)
		if err != nil {
			return
		}
		if got := Token(name); got != tok {
			t.Fatalf("Token(ParseToken(%q)) = %q: two tokens for one name", tok, got)
		}
	})
}
