//go:build !unix

package safetensors

import "os"

type mapping struct{ data []byte }

// mapFile reads the file where memory mapping is not available.
func mapFile(path string) (*mapping, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return &mapping{data: data}, nil
}

func (m *mapping) close() error { m.data = nil; return nil }
