package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/troupe/troupe/models/generate"
	"github.com/troupe/troupe/models/sample"
)

func cmdGenerate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("generate", stderr)
	var o loadOptions
	o.flags(fs)
	idsFlag := fs.String("prompt-ids", "", "comma-separated prompt token ids")
	maxTokens := fs.Int("max-tokens", 16, "tokens to generate at most")
	temp := fs.Float64("temperature", 0, "sampling temperature (0: greedy)")
	seed := fs.Int64("seed", -1, "random seed (-1: random)")
	ignoreEOS := fs.Bool("ignore-eos", false, "keep generating past end-of-sequence tokens")
	repetition := fs.Float64("repetition-penalty", 0, "divide the logits of tokens already seen, prompt included (0 or 1: off)")
	presence := fs.Float64("presence-penalty", 0, "subtract from the logits of tokens the output holds (-2 to 2)")
	frequency := fs.Float64("frequency-penalty", 0, "subtract from each token's logit once per time the output holds it (-2 to 2)")
	biasFlag := fs.String("logit-bias", "", "comma-separated id:bias pairs added to those tokens' logits (bias -100 to 100)")
	asJSON := fs.Bool("json", false, "print one JSON object (the default; kept for scripts)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	_ = asJSON
	prompt, err := parseIDs(*idsFlag)
	if err != nil {
		return fmt.Errorf("generate: --prompt-ids: %w", err)
	}
	bias, err := parseBias(*biasFlag)
	if err != nil {
		return fmt.Errorf("generate: --logit-bias: %w", err)
	}
	p := generate.Params{MaxTokens: *maxTokens, IgnoreEOS: *ignoreEOS, Params: sample.Params{
		Temperature: float32(*temp), RepetitionPenalty: float32(*repetition),
		PresencePenalty: float32(*presence), FrequencyPenalty: float32(*frequency), LogitBias: bias,
	}}
	if *seed >= 0 {
		p.Seed = seed
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	o.quiet = true
	l, err := load(ctx, o, stderr)
	if err != nil {
		return err
	}
	defer l.Close()
	for _, id := range prompt {
		if id < 0 || int(id) >= l.model.Config.Vocab {
			return fmt.Errorf("generate: token id %d outside the vocabulary of %d", id, l.model.Config.Vocab)
		}
	}
	var text strings.Builder
	ids, err := generateIDs(ctx, l, prompt, p, func(st generate.Step) error {
		text.WriteString(st.Text)
		return nil
	})
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	if ids == nil {
		ids = []int32{}
	}
	return json.NewEncoder(stdout).Encode(struct {
		IDs  []int32 `json:"ids"`
		Text string  `json:"text"`
	}{ids, text.String()})
}

// parseBias reads id:bias pairs separated by commas; "" is none.
func parseBias(s string) (map[int32]float32, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[int32]float32{}
	for _, f := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(f), ":")
		id, err := strconv.ParseInt(k, 10, 32)
		if !ok || err != nil {
			return nil, fmt.Errorf("%q is not id:bias", f)
		}
		b, err := strconv.ParseFloat(v, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not id:bias", f)
		}
		out[int32(id)] = float32(b)
	}
	return out, nil
}

func parseIDs(s string) ([]int32, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("no ids")
	}
	var out []int32
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not a token id", f)
		}
		out = append(out, int32(v))
	}
	return out, nil
}
