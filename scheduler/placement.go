package scheduler

import (
	"errors"
	"fmt"

	"github.com/troupe/troupe/bus"
)

// Stage is one pipeline stage of a placement: layers [First, Last) on Node.
type Stage struct {
	Node        string
	First, Last int
}

// Plan assigns consecutive layer ranges of a model of layers layers to
// nodes, one stage per entry of nodes (a node may appear more than once),
// as evenly as the layer count allows; earlier stages get the remainder.
func Plan(layers int, nodes []string) ([]Stage, error) {
	if len(nodes) == 0 {
		return nil, errors.New("placement: no nodes")
	}
	if layers < len(nodes) {
		return nil, fmt.Errorf("placement: %d stages for %d layers", len(nodes), layers)
	}
	out := make([]Stage, len(nodes))
	first := 0
	for i, n := range nodes {
		if n == "" {
			return nil, fmt.Errorf("placement: stage %d has no node", i)
		}
		size := layers / len(nodes)
		if i < layers%len(nodes) {
			size++
		}
		out[i] = Stage{Node: n, First: first, Last: first + size}
		first += size
	}
	return out, nil
}

// ShardArgs are the spawn arguments of a layer-shard (actors.SpawnRequest
// of kind ShardKind): which model, which layers, for which replica.
type ShardArgs struct {
	Model   string `msgpack:"model"`
	Replica string `msgpack:"replica"`
	Index   int    `msgpack:"index"`
	First   int    `msgpack:"first"`
	Last    int    `msgpack:"last"`
	// Blocks and BlockSize size the shard's KV cache; they must match the
	// replica's KV-manager.
	Blocks    int `msgpack:"blocks"`
	BlockSize int `msgpack:"block_size"`
}

// Schema implements bus.Message.
func (ShardArgs) Schema() bus.Schema { return bus.Schema{ID: "troupe.shard.args", Version: 1} }

// Validate checks a against a model of layers layers.
func (a ShardArgs) Validate(layers int) error {
	switch {
	case a.Replica == "":
		return errors.New("shard args: empty replica")
	case a.First < 0 || a.Last > layers || a.First >= a.Last:
		return fmt.Errorf("shard args: layers [%d, %d) of a %d-layer model", a.First, a.Last, layers)
	case a.Index < 0:
		return fmt.Errorf("shard args: stage %d", a.Index)
	case a.Blocks <= 0 || a.BlockSize <= 0 || a.BlockSize > 64:
		return fmt.Errorf("shard args: %d blocks of %d tokens", a.Blocks, a.BlockSize)
	}
	return nil
}

// ShardID names the layer-shard of stage index of replica.
func ShardID(replica string, index int) string { return fmt.Sprintf("%s-s%d", replica, index) }

// Spread picks the node of each of stages stages: the nodes of current
// first, in their order, then those of others not in current. With fewer
// nodes than stages, each node takes a run of consecutive stages (the
// earlier nodes one more when the count does not divide), so that the
// pipeline crosses between nodes as rarely as the spread allows.
func Spread(stages int, current, others []string) ([]string, error) {
	if stages < 1 || stages > 64 {
		return nil, fmt.Errorf("placement: %d stages: want 1 to 64", stages)
	}
	var cand []string
	seen := map[string]bool{}
	for _, n := range append(append([]string(nil), current...), others...) {
		if n == "" || seen[n] {
			continue
		}
		seen[n] = true
		cand = append(cand, n)
	}
	if len(cand) == 0 {
		return nil, errors.New("placement: no nodes")
	}
	if stages <= len(cand) {
		return cand[:stages], nil
	}
	out := make([]string, 0, stages)
	for j, n := range cand {
		k := stages / len(cand)
		if j < stages%len(cand) {
			k++
		}
		for ; k > 0; k-- {
			out = append(out, n)
		}
	}
	return out, nil
}
