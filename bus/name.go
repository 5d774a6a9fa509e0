package bus

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrNameTaken is what Start returns when a node it joins through goes by
// the name it was given.
var ErrNameTaken = errors.New("bus: a node of the cluster goes by this name")

// seedWait bounds the wait for a seed's greeting; recheckWait how long a
// started server keeps asking the seeds that were silent before it.
const (
	seedWait    = time.Second
	recheckWait = time.Second
	routeSettle = 100 * time.Millisecond
)

// Routes between servers of one name never form: the cluster refuses the
// second one's routes over and over, and it would run alone, its registry
// and subjects apart from the cluster's. Every route port greets a
// connection with an INFO line (the NATS protocol's first message, before
// TLS or credentials) that carries its server's id, name and cluster, so
// Start asks each seed before the server starts (checkName) and, for a
// second after, the seeds that were silent (recheckName): of two nodes of
// one name that start at the same moment, whichever finds the other up
// refuses. A seed that is this node itself answers with its own server
// id. A node of the same name reached only through others (two hosts
// cloned from one image, each joining through a third) is met once this
// node has joined: the cluster tells the others of the newcomer, they open
// routes to it, and its server refuses theirs as of a duplicate name,
// which it logs. Start watches the log (nameWatch) until the node has been
// routed for routeSettle, and refuses the name if that line comes.

// seedHosts are the host:port of cfg's seed routes.
func seedHosts(cfg Config) []string {
	if cfg.Cluster.Listen == "" {
		return nil
	}
	var hosts []string
	for _, r := range cfg.Cluster.Routes {
		if u, err := routeURL(r, Auth{}); err == nil { // Validate refuses the others
			hosts = append(hosts, u.Host)
		}
	}
	return hosts
}

// askSeeds asks each of hosts at once for its greeting. It returns a host
// whose server goes by cfg's name in cfg's cluster and is not server self
// (if any), and the hosts that did not answer.
func askSeeds(ctx context.Context, cfg Config, hosts []string, self string) (taken string, silent []string) {
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for _, h := range hosts {
		wg.Go(func() {
			g, err := greeting(ctx, h)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				silent = append(silent, h)
			case g.name == cfg.Name && g.cluster == cfg.Cluster.Name && g.id != self:
				taken = h
			}
		})
	}
	wg.Wait()
	return taken, silent
}

// checkName refuses the name of a node that cfg joins through, before the
// server starts; it returns the seeds that did not answer.
func checkName(ctx context.Context, cfg Config) (silent []string, err error) {
	taken, silent := askSeeds(ctx, cfg, seedHosts(cfg), "")
	if taken != "" {
		return nil, nameTaken(cfg, taken)
	}
	return silent, nil
}

// recheckName asks the seeds that were silent before server self started
// again, a fifth of recheckWait apart, until each has answered or
// recheckWait has passed.
func recheckName(ctx context.Context, cfg Config, silent []string, self string) error {
	end := time.Now().Add(recheckWait)
	for len(silent) > 0 && time.Now().Before(end) {
		var taken string
		if taken, silent = askSeeds(ctx, cfg, silent, self); taken != "" {
			return nameTaken(cfg, taken)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(recheckWait / 5):
		}
	}
	return nil
}

func nameTaken(cfg Config, host string) error {
	return fmt.Errorf("%w: %q answers at %s, in cluster %q: give this node another name", ErrNameTaken, cfg.Name, host, cfg.Cluster.Name)
}

// greetingInfo is what a server's greeting says of it.
type greetingInfo struct{ id, name, cluster string }

// greeting reads the INFO line the server at hostport sends first.
func greeting(ctx context.Context, hostport string) (greetingInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, seedWait)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return greetingInfo{}, err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	if err := c.SetReadDeadline(dl); err != nil {
		return greetingInfo{}, err
	}
	line, err := bufio.NewReaderSize(c, 4096).ReadSlice('\n')
	if err != nil {
		return greetingInfo{}, fmt.Errorf("greeting of %s: %w", hostport, err)
	}
	g, err := parseGreeting(line)
	if err != nil {
		return greetingInfo{}, fmt.Errorf("greeting of %s: %w", hostport, err)
	}
	return g, nil
}

// parseGreeting reads a server's id, name and cluster from its INFO line.
func parseGreeting(line []byte) (greetingInfo, error) {
	rest, ok := strings.CutPrefix(string(line), "INFO ")
	if !ok {
		return greetingInfo{}, errors.New("not an INFO line")
	}
	var info struct {
		ID      string `json:"server_id"`
		Name    string `json:"server_name"`
		Cluster string `json:"cluster"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(rest)), &info); err != nil {
		return greetingInfo{}, err
	}
	return greetingInfo{id: info.ID, name: info.Name, cluster: info.Cluster}, nil
}

// duplicateName is how the server logs a route refused because its peer
// goes by this server's name.
const duplicateName = "Remote server has a duplicate name"

// nameWatch passes the server's log on (to Logger) and reports the first
// route refused for a duplicate name.
type nameWatch struct {
	server.Logger
	dup chan string // the refused route's log line; buffered, one
}

// newNameWatch passes the log to next, or drops it when next is nil.
func newNameWatch(next server.Logger) *nameWatch {
	if next == nil {
		next = discard{}
	}
	return &nameWatch{Logger: next, dup: make(chan string, 1)}
}

func (w *nameWatch) Errorf(format string, v ...any) {
	if strings.Contains(format, duplicateName) {
		select {
		case w.dup <- fmt.Sprintf(format, v...):
		default:
		}
	}
	w.Logger.Errorf(format, v...)
}

// discard is a server.Logger that drops every line.
type discard struct{}

func (discard) Noticef(string, ...any) {}
func (discard) Warnf(string, ...any)   {}
func (discard) Fatalf(string, ...any)  {}
func (discard) Errorf(string, ...any)  {}
func (discard) Debugf(string, ...any)  {}
func (discard) Tracef(string, ...any)  {}

// watchName waits, when cfg has seed routes, until the node has had a
// route for routeSettle (or, without one, until end, or until ctx ends),
// and refuses the name if the server refused a route for a duplicate name
// meanwhile.
func watchName(ctx context.Context, cfg Config, w *nameWatch, routes func() int, end time.Time) error {
	if len(seedHosts(cfg)) == 0 {
		return nil
	}
	var routed time.Time
	tick := time.NewTicker(routeSettle / 10)
	defer tick.Stop()
	for {
		select {
		case line := <-w.dup:
			return fmt.Errorf("%w: %q is the name of a node the cluster's routes lead to (%s): give this node another name", ErrNameTaken, cfg.Name, line)
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			if routed.IsZero() && routes() > 0 {
				routed = now
			}
			if !routed.IsZero() && now.Sub(routed) >= routeSettle || routed.IsZero() && now.After(end) {
				return nil
			}
		}
	}
}
