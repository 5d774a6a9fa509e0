package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cpu"
	"github.com/troupe/troupe/gpu/ref"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/models/tokenizer"
)

// openBundle opens what --model names: a model directory, a Hugging Face
// repository (ORG/NAME[@REVISION], fetched into the Hub's cache first,
// its progress told to progress unless that is nil), or the embedded demo
// model when spec is empty.
func openBundle(ctx context.Context, spec string, progress io.Writer) (*models.Bundle, error) {
	if spec == "" {
		if !demo.Embedded() {
			return nil, fmt.Errorf("this binary was built without the demo model (tag nodemo): pass --model DIR")
		}
		return models.OpenFS(demo.Name, demo.FS(), demo.Weights())
	}
	dir, name, err := modelDir(ctx, spec, progress)
	if err != nil {
		return nil, err
	}
	b, err := models.OpenDir(dir)
	if err == nil && name != "" {
		b.Name = name
	}
	return b, err
}

// openDevice opens a compute lane by name.
func openDevice(ctx context.Context, name string, threads int) (gpu.Device, error) {
	switch name {
	case "", "cpu":
		return cpu.New(cpu.Config{Threads: threads, Spin: cpu.DefaultConfig().Spin})
	case "ref":
		return ref.New(), nil
	case "cuda":
		return openCUDA(ctx)
	}
	return nil, fmt.Errorf("unknown device %q (cpu, cuda, ref)", name)
}

// loaded is a model ready to run.
type loaded struct {
	bundle *models.Bundle
	dev    gpu.Device
	model  *models.Model
	tok    *tokenizer.Tokenizer
	cache  gpu.DType // the KV cache's element type
	tp     *tpGroup  // tensor parallelism: the GPUs and their fabric; nil otherwise
}

func (l *loaded) Close() {
	if l.model != nil {
		l.model.Close()
	}
	if l.tp != nil {
		l.tp.Close()
	} else if l.dev != nil {
		l.dev.Close()
	}
	l.bundle.Close()
}

// loadOptions are the flags shared by the commands that load a model.
type loadOptions struct {
	model, device string
	kvCache       string
	threads       int
	tp            int
	maxTokens     int
	quiet         bool
	codeWeights   models.Coding
}

// flags registers the model, device and thread flags.
func (o *loadOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.model, "model", "", modelUsage)
	fs.StringVar(&o.device, "device", "cpu", "compute lane: cpu, cuda or ref")
	fs.IntVar(&o.threads, "threads", 0, "CPU threads (0: all)")
	fs.StringVar(&o.kvCache, "kv-cache", "auto", kvCacheUsage)
	fs.IntVar(&o.tp, "tp", 1, "tensor-parallel ranks: GPUs 0 to N-1 joined by peer memory (cuda only)")
	o.codeWeights = models.CodeAuto
	fs.TextVar(&o.codeWeights, "code-weights", o.codeWeights, codeWeightsUsage)
}

const modelUsage = "model directory, or a Hugging Face repository ORG/NAME[@REVISION] fetched into its cache (see troupe pull -h) (default: the embedded demo model)"

const codeWeightsUsage = "weights also held in a lossless 12-bit code for one-token products (cuda): none, head (the LM head's), all (the LM head's and every layer product's of at least 2^24 weights) or auto (all where those take at most an eighth of the memory free beside the weights, else head); each coded matrix streams a quarter fewer bytes a decode step and takes three quarters more memory"

// load opens the bundle, the device and the model, reporting progress to
// progress unless quiet.
func load(ctx context.Context, o loadOptions, progress io.Writer) (*loaded, error) {
	start := time.Now()
	cache, err := kvCacheType(o.kvCache, o.device)
	if err != nil {
		return nil, err
	}
	var fetch io.Writer
	if !o.quiet {
		fetch = progress
	}
	b, err := openBundle(ctx, o.model, fetch)
	if err != nil {
		return nil, err
	}
	l := &loaded{bundle: b, cache: cache}
	if b.Tokenizer != nil {
		if l.tok, err = tokenizer.Parse(b.Tokenizer); err != nil {
			b.Close()
			return nil, fmt.Errorf("%s: tokenizer.json: %w", b.Name, err)
		}
	}
	if o.tp > 1 {
		if o.device != "cuda" {
			b.Close()
			return nil, fmt.Errorf("--tp %d needs --device cuda", o.tp)
		}
		if l.tp, err = openTP(ctx, o.tp); err != nil {
			b.Close()
			return nil, err
		}
		l.dev = l.tp.devs[0]
	} else if o.tp < 1 {
		b.Close()
		return nil, fmt.Errorf("--tp %d: want 1 or more", o.tp)
	} else if l.dev, err = openDevice(ctx, o.device, o.threads); err != nil {
		b.Close()
		return nil, err
	}
	if !o.quiet {
		fmt.Fprintf(progress, "loading %s (%s, %.1fM parameters) on %s\n", b.Name, b.Config.Describe(), float64(models.Params(b.Config))/1e6, l.dev.Name())
	}
	mo := models.Options{MaxTokens: o.maxTokens, CacheDType: cache, CodeWeights: o.codeWeights}
	if !o.quiet {
		mo.Progress = loadProgress(progress, b.Checkpoint.Bytes())
	}
	if l.tp != nil {
		l.model, err = models.LoadTP(b.Config, b.Checkpoint, l.tp.gpuDevices(), l.tp.reducers(), mo)
	} else {
		l.model, err = models.Load(b.Config, b.Checkpoint, l.dev, mo)
	}
	if err != nil {
		l.Close()
		return nil, err
	}
	if !o.quiet {
		coded := ""
		if n, c := l.model.Coded(); n > 0 {
			coded = fmt.Sprintf(" (%d matrices also in the 12-bit code, --code-weights %s as %s)", n, o.codeWeights, c)
		}
		fmt.Fprintf(progress, "loaded in %s%s\n", time.Since(start).Round(time.Millisecond), coded)
	}
	return l, nil
}

const kvCacheUsage = "KV cache element type: auto (f32 on the CPU lane, exact; bf16 on CUDA), f32, bf16 or f16"

// kvCacheType is the KV cache's element type that --kv-cache names for a
// device.
func kvCacheType(name, device string) (gpu.DType, error) {
	if name == "" || name == "auto" {
		if device == "cuda" {
			return gpu.BF16, nil
		}
		return gpu.F32, nil
	}
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
		if name == dt.String() {
			return dt, nil
		}
	}
	return 0, fmt.Errorf("--kv-cache %q: want auto, f32, bf16 or f16", name)
}

// loadProgress returns a models.Options.Progress that prints to w, a
// second apart, how many bytes of the checkpoint a load has placed, of
// total where total is not 0; nil where w is nil.
func loadProgress(w io.Writer, total int64) func(int64) {
	if w == nil {
		return nil
	}
	last := time.Now()
	return func(n int64) {
		now := time.Now()
		if now.Sub(last) < time.Second {
			return
		}
		last = now
		if total > 0 {
			fmt.Fprintf(w, "  %s of %s of weights placed (%.0f%%)\n", bytesOf(n), bytesOf(total), 100*float64(n)/float64(total))
			return
		}
		fmt.Fprintf(w, "  %s of weights placed\n", bytesOf(n))
	}
}
