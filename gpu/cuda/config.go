package cuda

import (
	"fmt"
	"io/fs"
	"time"
)

// Config selects and tunes a device.
type Config struct {
	// Ordinal is the CUDA device index (0 for the first GPU).
	Ordinal int
	// Library is the driver library to load; empty means "libcuda.so.1".
	Library string
	// Kernels holds the kernel artifacts laid out as package kernels embeds
	// them (manifest.json, cuda/NAME.sm_90a.cubin, cuda/NAME.compute_80.ptx);
	// nil means the embedded ones.
	Kernels fs.FS
	// StagingBytes is the size of the pinned host buffer that Write and Read
	// copy through; 0 means 8 MiB.
	StagingBytes int
	// QueueDepth bounds the operations waiting for the device's thread;
	// 0 means 1024. A caller that gets ahead of the driver blocks there.
	QueueDepth int
	// Spin is how long the device's thread, and a caller waiting for it,
	// poll before parking; 0 parks at once. On the H200 host measured
	// (docs/cuda.md) polling made a Sync round trip slower, not faster.
	Spin time.Duration
	// Serial turns programmatic dependent launch off: each kernel then
	// starts only when the one before it on the stream has finished. By
	// default a Hopper GPU running the sm_90a kernels starts a kernel's
	// blocks while the previous kernel drains (docs/cuda.md).
	Serial bool
	// PTX loads the compute_80 PTX (compiled by the driver at load) where
	// the Hopper cubins would serve, so that a Hopper GPU runs the kernels
	// as other GPUs do: for testing that path.
	PTX bool
}

// DefaultConfig returns the configuration of the first GPU.
func DefaultConfig() Config {
	return Config{Library: "libcuda.so.1", StagingBytes: 8 << 20, QueueDepth: 1024}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if c.Ordinal < 0 {
		return fmt.Errorf("cuda: config: ordinal %d is negative", c.Ordinal)
	}
	if c.StagingBytes < 0 || (c.StagingBytes > 0 && c.StagingBytes < 64<<10) {
		return fmt.Errorf("cuda: config: staging of %d bytes, want 0 or at least 64 KiB", c.StagingBytes)
	}
	if c.Spin < 0 {
		return fmt.Errorf("cuda: config: spin %v is negative", c.Spin)
	}
	if c.QueueDepth < 0 {
		return fmt.Errorf("cuda: config: queue depth %d is negative", c.QueueDepth)
	}
	return nil
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Library == "" {
		c.Library = d.Library
	}
	if c.StagingBytes == 0 {
		c.StagingBytes = d.StagingBytes
	}
	if c.QueueDepth == 0 {
		c.QueueDepth = d.QueueDepth
	}
	return c
}
