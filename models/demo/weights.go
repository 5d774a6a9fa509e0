//go:build !nodemo

package demo

import _ "embed"

// weights is the checkpoint, embedded as a string so that it is used in
// place, in the binary's read-only data, never copied.
//
//go:embed docs-olmo2-17m/model.safetensors
var weights string
