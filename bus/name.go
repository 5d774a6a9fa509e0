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
)

// ErrNameTaken is what Start returns when a node it joins through goes by
// the name it was given.
var ErrNameTaken = errors.New("bus: a node of the cluster goes by this name")

// seedWait bounds the wait for a seed's greeting.
const seedWait = time.Second

// checkName refuses the name of a node that cfg joins through. Routes
// between servers of one name never form: the cluster refuses the second
// one's routes over and over, and it would run alone, its registry and
// subjects apart from the cluster's. Every route port greets a connection
// with an INFO line (the NATS protocol's first message, before TLS or
// credentials) that carries its server's name and cluster, so each seed is
// asked before this node's server starts. Seeds that do not answer within
// a second are skipped: nodes start in any order, and a seed may be this
// node itself. Nodes reached only through others, and nodes that start at
// the same moment, are not checked.
func checkName(ctx context.Context, cfg Config) error {
	if cfg.Cluster.Listen == "" || len(cfg.Cluster.Routes) == 0 {
		return nil
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		taken string
	)
	for _, r := range cfg.Cluster.Routes {
		u, err := routeURL(r, Auth{})
		if err != nil {
			return err // Validate refuses it first
		}
		wg.Go(func() {
			name, cluster, err := greeting(ctx, u.Host)
			if err == nil && name == cfg.Name && cluster == cfg.Cluster.Name {
				mu.Lock()
				taken = u.Host
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if taken != "" {
		return fmt.Errorf("%w: %q answers at %s, in cluster %q: give this node another name", ErrNameTaken, cfg.Name, taken, cfg.Cluster.Name)
	}
	return nil
}

// greeting reads the INFO line the server at hostport sends first and
// returns the server's name and cluster.
func greeting(ctx context.Context, hostport string) (name, cluster string, err error) {
	ctx, cancel := context.WithTimeout(ctx, seedWait)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	if err := c.SetReadDeadline(dl); err != nil {
		return "", "", err
	}
	line, err := bufio.NewReaderSize(c, 4096).ReadSlice('\n')
	if err != nil {
		return "", "", fmt.Errorf("greeting of %s: %w", hostport, err)
	}
	name, cluster, err = parseGreeting(line)
	if err != nil {
		return "", "", fmt.Errorf("greeting of %s: %w", hostport, err)
	}
	return name, cluster, nil
}

// parseGreeting reads a server's name and cluster from its INFO line.
func parseGreeting(line []byte) (name, cluster string, err error) {
	rest, ok := strings.CutPrefix(string(line), "INFO ")
	if !ok {
		return "", "", errors.New("not an INFO line")
	}
	var info struct {
		Name    string `json:"server_name"`
		Cluster string `json:"cluster"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(rest)), &info); err != nil {
		return "", "", err
	}
	return info.Name, info.Cluster, nil
}
