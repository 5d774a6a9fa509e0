package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/troupe/troupe/scheduler"
)

// shape is what a replica looks like: stages pipeline stages in this
// process or, on a node started with --placement, a replica group over
// placements across the cluster's nodes.
type shape struct {
	stages    int
	placement string
}

// replicasDoc is the body of the replicas admin endpoint: the replicas
// this node schedules and their shape. In a request a zero field keeps
// what runs.
type replicasDoc struct {
	Replicas int `json:"replicas"`
	// Stages is the number of pipeline stages of each replica (of the
	// preferred placement, on a node with placements).
	Stages int `json:"stages,omitempty"`
	// Placement is the placement spec of each replica group, on a node
	// started with --placement.
	Placement string `json:"placement,omitempty"`
	Error     string `json:"error,omitempty"`
}

func (d replicasDoc) String() string {
	s := fmt.Sprintf("%d replicas of %d stages", d.Replicas, d.Stages)
	if d.Placement != "" {
		s += ", placements " + d.Placement
	}
	return s
}

// state reports the replicas serving and their shape.
func (n *node) state() replicasDoc {
	n.replicasMu.Lock()
	defer n.replicasMu.Unlock()
	return docOf(len(n.replicas), n.shape)
}

// declared is what the group's key says: the target of a resize under
// way, else the replicas serving.
func (n *node) declared() replicasDoc {
	n.replicasMu.Lock()
	t := n.target
	n.replicasMu.Unlock()
	if t != nil {
		return *t
	}
	return n.state()
}

// docOf describes replicas replicas of shape sh.
func docOf(replicas int, sh shape) replicasDoc {
	d := replicasDoc{Replicas: replicas, Stages: sh.stages, Placement: sh.placement}
	if d.Placement != "" {
		first, _, _ := strings.Cut(d.Placement, ";")
		d.Stages = strings.Count(first, ",") + 1
	}
	return d
}

// declare makes the group's key say that this node's replicas become
// replicas of shape sh, before the first of them changes, and returns
// once it does: a standby that takes the group over after a crash
// midway starts it as asked. end, called when the resize ends, makes the
// key say what then serves, and waits for that write too, so that a
// scale's answer means its key is written. Without a key (no --group)
// both do nothing.
func (n *node) declare(ctx context.Context, replicas int, sh shape) (end func(), err error) {
	l := n.lease
	if l == nil {
		return func() {}, nil
	}
	setTarget := func(t *replicasDoc) {
		n.replicasMu.Lock()
		n.target = t
		n.replicasMu.Unlock()
	}
	d := docOf(replicas, sh)
	setTarget(&d)
	wctx, cancel := context.WithTimeout(ctx, keyWriteWait)
	defer cancel()
	if err := l.Write(wctx); err != nil {
		setTarget(nil)
		return nil, fmt.Errorf("scale: the group's key could not say the new shape, nothing changed: %w", err)
	}
	return func() {
		setTarget(nil)
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyWriteWait)
		defer cancel()
		if err := l.Write(wctx); err != nil {
			fmt.Fprintf(n.log, "node %s: group %s: the key after a resize: %v\n", n.cfg.Node, n.cfg.Group, err)
		}
	}, nil
}

// keyWriteWait bounds the wait for a write of a group's key.
const keyWriteWait = 5 * time.Second

// publish makes reps the replicas that serve and report.
func (n *node) publish(reps []*replica) {
	n.replicasMu.Lock()
	n.replicas = slices.Clone(reps)
	n.replicasMu.Unlock()
	n.backend.setScheds(reps)
}

// reshape is the shape that want asks for.
func (n *node) reshape(want replicasDoc) (shape, error) {
	n.replicasMu.Lock()
	cur := n.shape
	n.replicasMu.Unlock()
	layers := n.bundle.Config.Layers
	switch {
	case want.Stages != 0 && want.Placement != "":
		return cur, fmt.Errorf("scale: give stages or a placement, not both")
	case want.Stages < 0 || want.Stages > layers:
		return cur, fmt.Errorf("scale: %d stages: want 1 to %d (the model's layers)", want.Stages, layers)
	case cur.placement == "" && want.Placement != "":
		return cur, fmt.Errorf("scale: this node runs local replicas; placements need a node started with --placement")
	case cur.placement == "" && want.Stages != 0:
		return shape{stages: want.Stages}, nil
	case want.Placement != "":
		specs, err := parsePlacements(want.Placement)
		if err != nil {
			return cur, fmt.Errorf("scale: %w", err)
		}
		for _, nodes := range specs {
			if _, err := scheduler.Plan(layers, nodes); err != nil {
				return cur, fmt.Errorf("scale: %w", err)
			}
		}
		return shape{placement: canonical(specs)}, nil
	case want.Stages != 0:
		// The preferred placement takes the stages: on its own nodes
		// first, then on the other live nodes of the cluster.
		specs, err := parsePlacements(cur.placement)
		if err != nil {
			return cur, err
		}
		nodes, err := scheduler.Spread(want.Stages, specs[0], n.view.aliveNodes())
		if err != nil {
			return cur, fmt.Errorf("scale: %w", err)
		}
		specs[0] = nodes
		return shape{placement: canonical(specs)}, nil
	}
	return cur, nil
}

// canonical writes placements back as a spec.
func canonical(specs [][]string) string {
	var ps []string
	for _, nodes := range specs {
		ps = append(ps, strings.Join(nodes, ","))
	}
	return strings.Join(ps, ";")
}

// resize brings the replicas this node schedules to want while serving.
// When the shape changes it replaces the replicas one at a time: the new
// replica's stages are started (on other nodes through their spawners,
// for placements) and it takes requests, then the old one drains: it
// stops taking requests, finishes those it runs, and its stages stop.
// No request is lost, and none changes its text. A replica that goes
// while shrinking drains the same way.
func (n *node) resize(ctx context.Context, want replicasDoc) (replicasDoc, error) {
	n.resizeMu.Lock()
	defer n.resizeMu.Unlock()
	if want.Replicas == 0 {
		want.Replicas = n.state().Replicas
	}
	if want.Replicas < 1 || want.Replicas > 64 {
		return n.state(), fmt.Errorf("scale: %d replicas: want 1 to 64", want.Replicas)
	}
	sh, err := n.reshape(want)
	if err != nil {
		return n.state(), err
	}
	end, err := n.declare(ctx, want.Replicas, sh)
	if err != nil {
		return n.state(), err
	}
	defer end()
	n.replicasMu.Lock()
	old := slices.Clone(n.replicas)
	n.replicasMu.Unlock()
	var keep, stale []*replica
	for _, r := range old {
		if r.shape == sh {
			keep = append(keep, r)
		} else {
			stale = append(stale, r)
		}
	}
	for len(keep) < want.Replicas {
		rep, err := n.startReplica(ctx, sh)
		if err != nil {
			return n.state(), fmt.Errorf("scale: %w", err)
		}
		keep = append(keep, rep)
		n.publish(append(slices.Clone(stale), keep...))
		if len(stale) > 0 {
			r := stale[0]
			stale = stale[1:]
			n.publish(append(slices.Clone(stale), keep...))
			n.retire(ctx, r, true)
		}
	}
	for len(stale) > 0 || len(keep) > want.Replicas {
		var r *replica
		if len(stale) > 0 {
			r, stale = stale[0], stale[1:]
		} else {
			r, keep = keep[len(keep)-1], keep[:len(keep)-1]
		}
		n.publish(append(slices.Clone(stale), keep...))
		n.retire(ctx, r, true)
	}
	n.replicasMu.Lock()
	n.shape = sh
	n.replicasMu.Unlock()
	return n.state(), nil
}

// retire drains replica rep, which no longer takes new requests, then
// stops its scheduler, its KV-manager and, with stages, a group's stages
// on their nodes. When ctx ends before its requests do, they end with a
// final frame.
func (n *node) retire(ctx context.Context, rep *replica, stages bool) {
	if err := rep.svc.Drain(ctx); err != nil && rep.svc.Active() > 0 {
		fmt.Fprintf(n.log, "replica %s: %v: ending %d requests\n", rep.id, err, rep.svc.Active())
	}
	rep.cancel()
	<-rep.done
	if g := rep.group; g != nil {
		g.stop()
		<-g.done
		if stages {
			n.stopStages(g)
		}
	}
	n.stopActors(rep)
	if n.tpd != nil {
		n.tpd.release(rep.id)
	}
	fmt.Fprintf(n.log, "replica %s stopped\n", rep.id)
}

// replicasHandler serves GET and POST /v1/admin/replicas: the replicas
// this node schedules, and changing their number or shape while serving.
func (n *node) replicasHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet {
			json.NewEncoder(w).Encode(n.state())
			return
		}
		var want replicasDoc
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<12))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			doc := n.state()
			doc.Error = fmt.Sprintf("body must be {\"replicas\": N, \"stages\": S, \"placement\": \"a,b;c\"}: %v", err)
			json.NewEncoder(w).Encode(doc)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
		defer cancel()
		doc, err := n.resize(ctx, want)
		if err != nil {
			doc.Error = err.Error()
			w.WriteHeader(http.StatusBadRequest)
		}
		json.NewEncoder(w).Encode(doc)
	})
}

func cmdScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("scale", stderr)
	server := fs.String("server", "http://127.0.0.1:8080", "troupe server to scale")
	replicas := fs.Int("replicas", 0, "replicas to run (0: as many as now)")
	stages := fs.Int("stages", 0, "pipeline stages of each replica (0: as now); on a node with placements, of the preferred one, spread over the cluster's live nodes")
	placement := fs.String("placement", "", "placements of each replica group, e.g. \"a,b,c;a\" (a node started with --placement)")
	apiKey := fs.String("api-key", "", "API key for the server")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("scale: unexpected arguments %q", fs.Args())
	}
	url := strings.TrimRight(*server, "/") + "/v1/admin/replicas"
	want := replicasDoc{Replicas: *replicas, Stages: *stages, Placement: *placement}
	method, body := http.MethodGet, []byte(nil)
	if want != (replicasDoc{}) {
		method = http.MethodPost
		body, _ = json.Marshal(want)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: keyTransport{key: *apiKey}}).Do(req)
	if err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	defer resp.Body.Close()
	var doc replicasDoc
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return fmt.Errorf("scale: %s answered %s: %w", url, resp.Status, err)
	}
	if doc.Error != "" {
		msg := doc.Error
		doc.Error = ""
		return fmt.Errorf("%s (now %s)", msg, doc)
	}
	fmt.Fprintln(stdout, doc)
	return nil
}
