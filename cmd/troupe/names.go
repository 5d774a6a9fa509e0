package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/troupe/troupe/actors"
)

// nameKind is the registry kind of the cluster's names. A node's own
// replicas are named NODE-r0, NODE-r1, … and a replica group's GROUP-r0, …
// whichever node schedules it, so a node and a group of one name would
// run two schedulers of one replica on its stages. Each node claims its
// name (state "node") and its group's (state "group", shared by the
// group's nodes) for as long as it runs.
const nameKind = "name"

// Claims of a name: by a node, or by the nodes of a replica group.
const (
	claimNode  = "node"
	claimGroup = "group"
)

// nameClaims are the names a node holds in the registry.
type nameClaims struct {
	reg    *actors.Registry
	log    io.Writer
	claims []nameClaim
}

// nameClaim is one name: its entry, whether this node holds it, and
// whether a conflict found after the start has been reported.
type nameClaim struct {
	e              actors.Entry
	held, reported bool
}

// claimNames claims node's name and, with a group, the group's: one of
// nodes that start at the same moment wins each name (the registry's
// claim is atomic), and a name a live node or group holds otherwise is
// refused. A node's name held by a node of that name is taken over (this
// node before a restart; two live nodes of one name do not reach each
// other's registry, see bus.ErrNameTaken). A registry that does not
// answer within 5 s checks nothing: keep claims the names later.
func claimNames(ctx context.Context, reg *actors.Registry, node, group string, log io.Writer) (*nameClaims, error) {
	c := &nameClaims{reg: reg, log: log}
	c.add(node, node, claimNode)
	if group != "" {
		c.add(group, node, claimGroup)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for i := range c.claims {
		n := &c.claims[i]
		if err := c.claim(cctx, n); err != nil {
			if !errors.Is(err, errNameConflict) {
				fmt.Fprintf(log, "node %s: names not checked: %v\n", node, err)
				continue
			}
			flag := "--node"
			if n.e.State == claimGroup {
				flag = "--group"
			}
			return nil, fmt.Errorf("serve: %s %s: %w: name the %s otherwise", flag, n.e.ID, err, n.e.State)
		}
	}
	return c, nil
}

func (c *nameClaims) add(name, node, what string) {
	c.claims = append(c.claims, nameClaim{e: actors.Entry{Kind: nameKind, ID: name, Node: node, Status: actors.StatusRunning, State: what}})
}

// errNameConflict: a name is held by what it may not name at once.
var errNameConflict = errors.New("name taken")

// claim takes n, or says who holds it.
func (c *nameClaims) claim(ctx context.Context, n *nameClaim) error {
	e := n.e
	rec, err := c.reg.Claim(ctx, e)
	switch {
	case err == nil:
	case !errors.Is(err, actors.ErrClaimed):
		return err
	case e.State == claimGroup && rec.State == claimGroup:
		// Another node of the group: the name is the group's.
	case e.State == claimNode && rec.State == claimNode && rec.Node == e.Node:
		// This node's name, written before it restarted.
	case rec.State == claimGroup:
		return fmt.Errorf("%w: a replica group of that name runs (on node %s)", errNameConflict, rec.Node)
	default:
		return fmt.Errorf("%w: a node of that name runs", errNameConflict)
	}
	n.held = true
	return nil
}

// keep writes the names held every second until ctx ends, and claims those
// the registry did not answer for at the start; a name found taken then is
// reported once and left alone.
func (c *nameClaims) keep(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		for i := range c.claims {
			n := &c.claims[i]
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			switch {
			case n.held:
				_ = c.reg.Put(wctx, n.e) // a miss is made up a second later
			case !n.reported:
				if err := c.claim(wctx, n); errors.Is(err, errNameConflict) {
					n.reported = true
					fmt.Fprintf(c.log, "node %s: %s %s: %v: its replicas share their names\n", n.e.Node, n.e.State, n.e.ID, err)
				}
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			c.release()
			return
		case <-t.C:
		}
	}
}

// release gives the node's own name back as it stops, so that a group
// may take it at once; a group's name lapses when its last node stops.
func (c *nameClaims) release() {
	for _, n := range c.claims {
		if n.held && n.e.State == claimNode {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.reg.Delete(ctx, nameKind, n.e.ID)
			cancel()
		}
	}
}
