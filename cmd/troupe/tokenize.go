package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/troupe/troupe/models/tokenizer"
)

func cmdTokenize(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return tokenizeFrom(ctx, args, os.Stdin, stdout, stderr)
}

func tokenizeFrom(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flags("tokenize", stderr)
	model := fs.String("model", "", modelUsage)
	file := fs.String("tokenizer", "", "a tokenizer.json file (instead of --model)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var tok *tokenizer.Tokenizer
	var err error
	if *file != "" {
		tok, err = tokenizer.Load(*file)
	} else {
		var raw []byte
		if raw, err = tokenizerJSON(ctx, *model, stderr); err == nil {
			tok, err = tokenizer.Parse(raw)
		}
	}
	if err != nil {
		return fmt.Errorf("tokenize: %w", err)
	}
	var texts []string
	if err := json.NewDecoder(stdin).Decode(&texts); err != nil {
		return fmt.Errorf("tokenize: stdin must hold a JSON array of strings: %w", err)
	}
	out := make([][]int32, len(texts))
	for i, s := range texts {
		out[i] = tok.Encode(s)
		if out[i] == nil {
			out[i] = []int32{}
		}
	}
	return json.NewEncoder(stdout).Encode(out)
}

// tokenizerJSON reads a model's tokenizer.json without loading its weights.
func tokenizerJSON(ctx context.Context, spec string, progress io.Writer) ([]byte, error) {
	b, _, err := peekBundle(ctx, spec, progress)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	if b.Tokenizer == nil {
		return nil, fmt.Errorf("%s has no tokenizer.json", b.Name)
	}
	return b.Tokenizer, nil
}
