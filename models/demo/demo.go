package demo

import (
	"embed"
	"fmt"
	"io/fs"
	"unsafe"
)

//go:embed docs-olmo2-17m/config.json docs-olmo2-17m/generation_config.json docs-olmo2-17m/tokenizer.json docs-olmo2-17m/tokenizer_config.json
var files embed.FS

// Name is the model's name.
const Name = "docs-olmo2-17m"

// Weights returns model.safetensors, nil in a binary built with the
// nodemo tag. The bytes are read-only.
func Weights() []byte {
	if len(weights) == 0 {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(weights), len(weights))
}

// Embedded reports whether the checkpoint is in the binary: false when
// built with the nodemo tag (for copying small binaries to GPU hosts).
func Embedded() bool { return len(weights) > 0 }

// FS returns the model directory's other files (config.json, tokenizer.json,
// tokenizer_config.json, generation_config.json).
func FS() fs.FS {
	sub, err := fs.Sub(files, Name)
	if err != nil {
		panic(fmt.Sprintf("demo: embedded files: %v", err))
	}
	return sub
}
