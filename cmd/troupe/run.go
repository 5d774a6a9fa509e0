package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/troupe/troupe/models/generate"
	"github.com/troupe/troupe/models/grammar"
	"github.com/troupe/troupe/models/sample"
)

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("run", stderr)
	var o loadOptions
	o.flags(fs)
	maxTokens := fs.Int("max-tokens", 128, "tokens to generate at most")
	temp := fs.Float64("temperature", 0, "sampling temperature (0: greedy)")
	topP := fs.Float64("top-p", 0, "nucleus sampling mass (0: off)")
	topK := fs.Int("top-k", 0, "sample among the k most likely tokens (0: all)")
	seed := fs.Int64("seed", -1, "random seed (-1: random)")
	jsonObject := fs.Bool("json-object", false, "write one JSON object (JSON mode) and stop when it closes")
	schemaFile := fs.String("json-schema", "", "write one JSON object that follows the JSON schema in this file")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: troupe run [flags] \"prompt\"")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return fmt.Errorf("run: no prompt")
	}
	prompt := strings.Join(fs.Args(), " ")
	o.quiet = true
	l, err := load(ctx, o, stderr)
	if err != nil {
		return err
	}
	defer l.Close()
	if l.tok == nil {
		return fmt.Errorf("run: %s has no tokenizer.json", l.bundle.Name)
	}
	p := generate.Params{MaxTokens: *maxTokens, Params: sample.Params{Temperature: float32(*temp), TopP: float32(*topP), TopK: *topK}}
	if *seed >= 0 {
		p.Seed = seed
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	if *jsonObject || *schemaFile != "" {
		toks := l.tok.TokenBytes()
		if w := l.model.Config.Vocab; w > len(toks) {
			toks = append(toks, make([][]byte, w-len(toks))...) // rows no token names
		}
		if p.Grammar, err = responseGrammar(toks, *schemaFile); err != nil {
			return fmt.Errorf("run: %w", err)
		}
	}
	fmt.Fprint(stdout, prompt)
	_, err = generateIDs(ctx, l, l.tok.Encode(prompt), p, func(st generate.Step) error {
		_, err := io.WriteString(stdout, st.Text)
		return err
	})
	fmt.Fprintln(stdout)
	return err
}

// responseGrammar is JSON mode's grammar over a vocabulary, or the JSON
// schema's in schemaFile where it is named.
func responseGrammar(vocab [][]byte, schemaFile string) (*grammar.Grammar, error) {
	v, err := grammar.NewVocab(vocab)
	if err != nil {
		return nil, err
	}
	if schemaFile == "" {
		return v.JSON(), nil
	}
	doc, err := os.ReadFile(schemaFile)
	if err != nil {
		return nil, err
	}
	s, err := grammar.CompileSchema(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", schemaFile, err)
	}
	return v.Schema(s), nil
}

// generateIDs runs one sequence from prompt, calling emit for every token.
func generateIDs(ctx context.Context, l *loaded, prompt []int32, p generate.Params, emit func(generate.Step) error) ([]int32, error) {
	if len(prompt) == 0 {
		return nil, fmt.Errorf("empty prompt")
	}
	cfg := l.model.Config
	if len(prompt)+p.MaxTokens > cfg.MaxPositions {
		return nil, fmt.Errorf("prompt of %d tokens plus %d to generate exceeds the context length of %d", len(prompt), p.MaxTokens, cfg.MaxPositions)
	}
	seq, err := l.model.NewSequence(len(prompt) + p.MaxTokens)
	if err != nil {
		return nil, err
	}
	defer seq.Close()
	var dec generate.Detokenizer = nopDecoder{}
	if l.tok != nil {
		dec = l.tok.NewDecoder(true)
	}
	g := generate.New(p, prompt, cfg.EOS, dec)
	logits, err := seq.Feed(ctx, prompt, false)
	if err != nil {
		return nil, err
	}
	var ids []int32
	for {
		st := g.Next(logits)
		ids = append(ids, st.ID)
		if err := emit(st); err != nil {
			return ids, err
		}
		if g.Done() {
			return ids, nil
		}
		if logits, err = seq.Feed(ctx, []int32{st.ID}, false); err != nil {
			return ids, err
		}
	}
}

type nopDecoder struct{}

func (nopDecoder) Next(int32) string { return "" }
func (nopDecoder) Flush() string     { return "" }
