package models

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/troupe/troupe/models/chat"
	"github.com/troupe/troupe/models/safetensors"
)

// Bundle is a model directory opened for use: its configuration, its
// checkpoint (memory-mapped, or in memory for an embedded model) and the raw
// tokenizer files.
type Bundle struct {
	Name       string
	Dir        string // empty for an embedded model
	Config     *Config
	Checkpoint *safetensors.Checkpoint
	// Tokenizer is tokenizer.json; TokenizerConfig is tokenizer_config.json
	// (nil when absent).
	Tokenizer, TokenizerConfig []byte
	// ChatTemplate is the chat template a checkpoint keeps apart from
	// tokenizer_config.json (chat.ReadTemplate), which takes the place of
	// the config's; nil when there is none.
	ChatTemplate []byte
	// Sampling is generation_config.json's default sampling, if any.
	Sampling Sampling
}

// Close releases the checkpoint.
func (b *Bundle) Close() error {
	if b.Checkpoint == nil {
		return nil
	}
	return b.Checkpoint.Close()
}

// OpenDir opens a Hugging Face model directory.
func OpenDir(dir string) (*Bundle, error) {
	cfg, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	b := &Bundle{Name: filepath.Base(filepath.Clean(dir)), Dir: dir, Config: cfg}
	if err := b.generation(os.DirFS(dir)); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if err := b.texts(os.DirFS(dir)); err != nil {
		return nil, err
	}
	if b.Checkpoint, err = safetensors.OpenDir(dir); err != nil {
		return nil, err
	}
	if err := Check(cfg, b.Checkpoint); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// OpenFS opens a model held in memory: its small files in fsys and its
// checkpoint, used in place, in weights.
func OpenFS(name string, fsys fs.FS, weights []byte) (*Bundle, error) {
	ckpt, err := safetensors.FromBytes(weights)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return OpenWith(name, fsys, ckpt)
}

// OpenWith opens a model of its small files in fsys and the checkpoint
// ckpt, which may hold its tensors' headers alone
// (safetensors.FromHeaders): a bundle to check and describe before the
// weights are fetched.
func OpenWith(name string, fsys fs.FS, ckpt *safetensors.Checkpoint) (*Bundle, error) {
	raw, err := fs.ReadFile(fsys, "config.json")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	b := &Bundle{Name: name, Checkpoint: ckpt}
	if b.Config, err = ParseConfig(raw); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := b.generation(fsys); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := b.texts(fsys); err != nil {
		return nil, err
	}
	if err := Check(b.Config, b.Checkpoint); err != nil {
		return nil, err
	}
	return b, nil
}

// texts reads fsys's tokenizer files and chat template, where present.
func (b *Bundle) texts(fsys fs.FS) error {
	var err error
	if b.Tokenizer, err = readOptional(fsys, "tokenizer.json"); err != nil {
		return err
	}
	if b.TokenizerConfig, err = readOptional(fsys, "tokenizer_config.json"); err != nil {
		return err
	}
	b.ChatTemplate, err = chat.ReadTemplate(fsys)
	return err
}

// generation reads fsys's generation_config.json, if any: its end tokens
// join the config's, its sampling becomes the bundle's.
func (b *Bundle) generation(fsys fs.FS) error {
	raw, err := readOptional(fsys, "generation_config.json")
	if err != nil {
		return err
	}
	if err := b.Config.MergeGeneration(raw); err != nil {
		return err
	}
	b.Sampling, err = ParseSampling(raw)
	return err
}

func readOptional(fsys fs.FS, name string) ([]byte, error) {
	raw, err := fs.ReadFile(fsys, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return raw, nil
}
