package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// Checkpoint is a set of tensors from one file or a sharded directory.
type Checkpoint struct {
	tensors map[string]*Tensor
	maps    []*mapping
}

// FromBytes parses a checkpoint held in memory (for example one embedded in
// the binary). The tensors alias buf.
func FromBytes(buf []byte) (*Checkpoint, error) {
	ts, _, err := Parse(buf)
	if err != nil {
		return nil, err
	}
	return &Checkpoint{tensors: ts}, nil
}

// OpenFile maps one safetensors file.
func OpenFile(path string) (*Checkpoint, error) {
	c := &Checkpoint{tensors: map[string]*Tensor{}}
	if err := c.add(path, nil); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// OpenDir opens the checkpoint of a Hugging Face model directory: either
// model.safetensors or the shards named by model.safetensors.index.json.
func OpenDir(dir string) (*Checkpoint, error) {
	index := filepath.Join(dir, "model.safetensors.index.json")
	raw, err := os.ReadFile(index)
	if errors.Is(err, os.ErrNotExist) {
		single := filepath.Join(dir, "model.safetensors")
		if _, err := os.Stat(single); err != nil {
			return nil, fmt.Errorf("%s holds neither model.safetensors nor model.safetensors.index.json", dir)
		}
		return OpenFile(single)
	}
	if err != nil {
		return nil, err
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, fmt.Errorf("%s: %w", index, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: empty weight_map", index)
	}
	want := map[string][]string{}
	for name, file := range idx.WeightMap {
		if file == "" || filepath.Base(file) != file {
			return nil, fmt.Errorf("%s: tensor %q maps to %q, not a file in the directory", index, name, file)
		}
		want[file] = append(want[file], name)
	}
	files := make([]string, 0, len(want))
	for f := range want {
		files = append(files, f)
	}
	sort.Strings(files)
	c := &Checkpoint{tensors: map[string]*Tensor{}}
	for _, f := range files {
		if err := c.add(filepath.Join(dir, f), want[f]); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// add maps path and takes its tensors; names, when given, must all be there.
func (c *Checkpoint) add(path string, names []string) error {
	m, err := mapFile(path)
	if err != nil {
		return err
	}
	c.maps = append(c.maps, m)
	ts, _, err := Parse(m.data)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for _, n := range names {
		if _, ok := ts[n]; !ok {
			return fmt.Errorf("%s: tensor %q listed in the index is missing", path, n)
		}
	}
	for n, t := range ts {
		if _, dup := c.tensors[n]; dup {
			return fmt.Errorf("%s: tensor %q appears in two shards", path, n)
		}
		c.tensors[n] = t
	}
	return nil
}

// Tensor returns the named tensor.
func (c *Checkpoint) Tensor(name string) (*Tensor, bool) {
	t, ok := c.tensors[name]
	return t, ok
}

// Names lists the tensors in sorted order.
func (c *Checkpoint) Names() []string {
	out := make([]string, 0, len(c.tensors))
	for n := range c.tensors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Bytes is the size of every tensor's data, the weights a device holds
// for the whole checkpoint in its dtypes.
func (c *Checkpoint) Bytes() int64 {
	var n int64
	for _, t := range c.tensors {
		n += t.Bytes()
	}
	return n
}

// FromHeaders is a checkpoint of tensors without their data, as
// ParseHeader returns them: enough to check a model's shapes and sizes
// before fetching its weights; not for loading.
func FromHeaders(files ...map[string]*Tensor) (*Checkpoint, error) {
	c := &Checkpoint{tensors: map[string]*Tensor{}}
	for _, ts := range files {
		for name, t := range ts {
			if _, dup := c.tensors[name]; dup {
				return nil, fmt.Errorf("tensor %q stands in two files", name)
			}
			c.tensors[name] = t
		}
	}
	return c, nil
}

// Close unmaps the files.
func (c *Checkpoint) Close() error {
	var first error
	for _, m := range c.maps {
		if err := m.close(); err != nil && first == nil {
			first = err
		}
	}
	c.maps = nil
	return first
}
