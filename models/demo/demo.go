package demo

import (
	"embed"
	"fmt"
	"io/fs"
	"unsafe"
)

//go:embed docs-olmo2-17m/config.json docs-olmo2-17m/generation_config.json docs-olmo2-17m/tokenizer.json docs-olmo2-17m/tokenizer_config.json
var files embed.FS

// weights is the checkpoint, embedded as a string so that it is used in
// place, in the binary's read-only data, never copied.
//
//go:embed docs-olmo2-17m/model.safetensors
var weights string

// Name is the model's name.
const Name = "docs-olmo2-17m"

// Weights returns model.safetensors. The bytes are read-only.
func Weights() []byte { return unsafe.Slice(unsafe.StringData(weights), len(weights)) }

// FS returns the model directory's other files (config.json, tokenizer.json,
// tokenizer_config.json, generation_config.json).
func FS() fs.FS {
	sub, err := fs.Sub(files, Name)
	if err != nil {
		panic(fmt.Sprintf("demo: embedded files: %v", err))
	}
	return sub
}
