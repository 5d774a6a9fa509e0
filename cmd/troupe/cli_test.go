package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/models/safetensors"
	"github.com/troupe/troupe/scheduler"
)

func runCLI(t *testing.T, stdin string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	var err error
	if args[0] == "tokenize" {
		err = tokenizeFrom(t.Context(), args[1:], strings.NewReader(stdin), &out, &errOut)
	} else {
		err = dispatch(context.Background(), args, &out, &errOut)
	}
	return out.String(), errOut.String(), err
}

func TestGenerateJSON(t *testing.T) {
	ref := demoRefs(t)[0]
	out, _, err := runCLI(t, "", "generate", "--prompt-ids", "473,623", "--max-tokens", "6", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		IDs  []int32 `json:"ids"`
		Text string  `json:"text"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	if len(got.IDs) != 6 || got.IDs[0] != ref.GreedyIDs[0] || got.IDs[5] != ref.GreedyIDs[5] || !strings.HasPrefix(ref.Text, got.Text) {
		t.Errorf("got %+v, want the start of %v %q", got, ref.GreedyIDs, ref.Text)
	}
	if _, _, err := runCLI(t, "", "generate", "--prompt-ids", "1,x"); err == nil {
		t.Error("bad ids: no error")
	}
	if _, _, err := runCLI(t, "", "generate", "--prompt-ids", "99999"); err == nil {
		t.Error("id outside the vocabulary: no error")
	}
}

// TestRunJSON: run writes one JSON object, or one that follows a schema
// file, after the prompt; a schema it cannot follow is an error naming why.
func TestRunJSON(t *testing.T) {
	const prompt = "The configuration file:"
	out, _, err := runCLI(t, "", "run", "--json-object", "--max-tokens", "300", prompt)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := jsonObjectPrefix(strings.TrimSuffix(strings.TrimPrefix(out, prompt), "\n")); !ok {
		t.Errorf("run --json-object wrote %q", out)
	}
	dir := t.TempDir()
	schema := filepath.Join(dir, "s.json")
	if err := os.WriteFile(schema, []byte(`{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCLI(t, "", "run", "--json-schema", schema, prompt)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]bool
	body := strings.TrimSuffix(strings.TrimPrefix(out, prompt), "\n")
	if err := json.Unmarshal([]byte(body), &got); err != nil || len(got) != 1 {
		t.Errorf("run --json-schema wrote %q: %v", out, err)
	}
	// An integer's bounds are kept; a bound finer than a millionth is refused.
	if err := os.WriteFile(schema, []byte(`{"type":"object","properties":{"n":{"type":"integer","minimum":100,"maximum":199}},"required":["n"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, err = runCLI(t, "", "run", "--json-schema", schema, prompt); err != nil {
		t.Fatal(err)
	}
	var n struct{ N int }
	if err := json.Unmarshal([]byte(strings.TrimSuffix(strings.TrimPrefix(out, prompt), "\n")), &n); err != nil || n.N < 100 || n.N > 199 {
		t.Errorf("run --json-schema with an integer from 100 to 199 wrote %q: %v", out, err)
	}
	if err := os.WriteFile(schema, []byte(`{"type":"object","properties":{"x":{"type":"number","minimum":0.0000001}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCLI(t, "", "run", "--json-schema", schema, prompt); err == nil || !strings.Contains(err.Error(), "at most six digits after the point") {
		t.Errorf("a number with a minimum of 1e-7: %v", err)
	}
}

func TestTokenize(t *testing.T) {
	out, _, err := runCLI(t, `["The kernel", ""]`, "tokenize")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "[[473,623],[]]" {
		t.Errorf("got %s", out)
	}
	if _, _, err := runCLI(t, `{"not":"a list"}`, "tokenize"); err == nil {
		t.Error("bad stdin: no error")
	}
}

// TestInspectRefusals: inspect names the exact reason a checkpoint cannot be
// served, before loading weights.
func TestInspectRefusals(t *testing.T) {
	good, err := os.ReadFile(filepath.Join("..", "..", "models", "demo", demo.Name, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	ckpt, err := safetensors.FromBytes(demo.Weights())
	if err != nil {
		t.Fatal(err)
	}
	write := func(t *testing.T, cfg []byte, drop, reshape string) string {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644)
		var ts []*safetensors.Tensor
		for _, n := range ckpt.Names() {
			if n == drop {
				continue
			}
			x, _ := ckpt.Tensor(n)
			if n == reshape {
				x = &safetensors.Tensor{Name: n, DType: x.DType, Shape: []int{x.Shape[0] / 2, x.Shape[1] * 2}, Data: x.Data}
			}
			ts = append(ts, x)
		}
		f, _ := os.Create(filepath.Join(dir, "model.safetensors"))
		if err := safetensors.Write(f, ts, nil); err != nil {
			t.Fatal(err)
		}
		f.Close()
		return dir
	}
	for _, c := range []struct {
		name, want string
		cfg        []byte
		drop, resh string
	}{
		{"model type", `model_type "gpt_neox"`, bytes.Replace(good, []byte(`"olmo2"`), []byte(`"gpt_neox"`), 1), "", ""},
		{"missing tensor", "missing tensor model.layers.3.mlp.up_proj.weight", good, "model.layers.3.mlp.up_proj.weight", ""},
		{"mis-shaped tensor", "model.layers.0.self_attn.q_proj.weight has shape [192 768]", good, "", "model.layers.0.self_attn.q_proj.weight"},
		{"option", "attention_bias", bytes.Replace(good, []byte(`"attention_bias": false`), []byte(`"attention_bias": true`), 1), "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := write(t, c.cfg, c.drop, c.resh)
			_, _, err := runCLI(t, "", "inspect", "--model", dir)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error naming %q", err, c.want)
			}
		})
	}
	out, _, err := runCLI(t, "", "inspect", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r report
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Parameters < 17e6 || r.DTypes["BF16"] != r.Parameters {
		t.Errorf("inspect --json: %s (%v)", out, err)
	}
}

// TestServeConfigFile: the file replaces the defaults and flags override the
// file, lists included; unknown keys are refused.
func TestServeConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "serve.json")
	os.WriteFile(file, []byte(`{"listen":"127.0.0.1:9000","replicas":3,"api_keys":["a"],"max_seqs":7,"max_in_flight_per_key":4,"served_model_names":["x","y"]}`), 0o644)
	cfg, err := parseServe([]string{"--config", file, "--listen", "127.0.0.1:9001", "--api-keys", "b,c"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9001" || cfg.Replicas != 3 || cfg.MaxSeqs != 7 || strings.Join(cfg.APIKeys, ",") != "b,c" || cfg.Shards != 1 || cfg.MaxInFlightPerKey != 4 || strings.Join(cfg.ServedModelNames, ",") != "x,y" {
		t.Errorf("config %+v", cfg)
	}
	os.WriteFile(file, []byte(`{"step_timeout":"1m30s","orphan_grace":"2m","cluster":{"name":"x"}}`), 0o644)
	if cfg, err := parseServe([]string{"--config", file}, &bytes.Buffer{}); err != nil || cfg.StepTimeout != 90*time.Second || cfg.OrphanGrace != 2*time.Minute || cfg.Cluster.Name != "x" {
		t.Errorf("durations: step_timeout %v, orphan_grace %v, %v", cfg.StepTimeout, cfg.OrphanGrace, err)
	}
	os.WriteFile(file, []byte(`{"tp":2,"threads":4}`), 0o644)
	if cfg, err := parseServe([]string{"--config", file}, &bytes.Buffer{}); err != nil || cfg.TP != 2 || cfg.Threads != 4 {
		t.Errorf("tp from the file: %d, %v", cfg.TP, err)
	}
	for bad, flag := range map[string]string{
		`{"tp":0}`: "--tp 0", `{"step_timeout":5}`: "step_timeout", `{"step_timeout":"5 parsecs"}`: "step_timeout",
		`{"cluster":{"nmae":"x"}}`: "nmae", `{"max_seqs":-1}`: "--max-seqs", `{"kv_blocks":-5}`: "--kv-blocks",
		`{"max_queue":0}`: "--max-queue", `{"max_in_flight_per_key":-1}`: "--max-in-flight-per-key",
		`{"served_model_names":["a","a"]}`: "named twice", `{"served_model_names":["a b"]}`: "without spaces", `{"max_batch_tokens":0}`: "--max-batch-tokens", `{"threads":-2}`: "--threads",
		`{"trace_sample_ratio":7}`: "--trace-sample", `{"shards":0}`: "--shards", `{"micro_batches":-1}`: "--micro-batches",
		`{"group":"g"}`: "--group g needs --placement", `{"group":"a.b","placement":"a"}`: "--group",
		`{"group":"n1","node":"n1","placement":"n1"}`: "--group n1: the node's own name", `{"orphan_grace":"1s"}`: "--orphan-grace",
		`{"orphan_grace":"-1m"}`: "--orphan-grace", `{"orphan_grace":5}`: "orphan_grace", `{"kv_cache":"f8"}`: "--kv-cache",
		`{"code_weights":"most"}`: "weight coding \"most\"", `{"code_weights":1}`: "code_weights",
	} {
		os.WriteFile(file, []byte(bad), 0o644)
		if _, err := parseServe([]string{"--config", file}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: got %v, want an error naming %s", bad, err, flag)
		}
	}
	os.WriteFile(file, []byte(`{"replcas":3}`), 0o644)
	if _, err := parseServe([]string{"--config", file}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "replcas") {
		t.Errorf("unknown key: got %v", err)
	}
}

// FuzzServeConfig reads arbitrary config files: each is refused with an
// error, or gives a config whose every setting is in range.
func FuzzServeConfig(f *testing.F) {
	for _, seed := range []string{
		`{"listen":"127.0.0.1:9000","replicas":3,"api_keys":["a"],"max_seqs":7}`,
		`{"step_timeout":"1m30s","cluster":{"name":"x","route_listen":"10.0.0.1:6222","user":"u","password":"p"}}`,
		`{"tp":2,"threads":4}`, `{"placement":"a,b;a","micro_batches":0}`, `{"kv_blocks":-5}`, `{"placement":"a,b;b","group":"g"}`,
		`{"trace_sample_ratio":1e400}`, `{"step_timeout":"-1s"}`, `[]`, `null`, `{"shards":1}{"shards":2}`,
	} {
		f.Add([]byte(seed))
	}
	file := filepath.Join(f.TempDir(), "serve.json")
	f.Fuzz(func(t *testing.T, raw []byte) {
		if err := os.WriteFile(file, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := parseServe([]string{"--config", file}, io.Discard)
		if err != nil {
			return
		}
		if cfg.Shards < 1 || cfg.Replicas < 0 || cfg.Threads < 0 || cfg.MaxQueue < 1 || cfg.MaxBatchTokens < 1 ||
			cfg.MaxSeqs < 1 || cfg.KVBlocks < 0 || cfg.TP < 1 || cfg.StepTimeout <= 0 ||
			(cfg.OrphanGrace != 0 && cfg.OrphanGrace < minOrphanGrace) ||
			cfg.MicroBatches < 0 || cfg.MicroBatches > scheduler.MaxMicroBatches ||
			!(cfg.TraceSampleRatio >= 0 && cfg.TraceSampleRatio <= 1) {
			t.Fatalf("accepted a config out of range: %+v", cfg)
		}
		if _, err := kvCacheType(cfg.KVCache, cfg.Device); err != nil {
			t.Fatalf("accepted kv_cache %q: %v", cfg.KVCache, err)
		}
		if cfg.Placement != "" {
			if _, err := parsePlacements(cfg.Placement); err != nil {
				t.Fatalf("accepted placement %q: %v", cfg.Placement, err)
			}
		}
		if cfg.Group != "" && (cfg.Placement == "" || bus.Token(cfg.Group) != cfg.Group || cfg.Group == cfg.Node) {
			t.Fatalf("accepted group %q with placement %q", cfg.Group, cfg.Placement)
		}
	})
}
