package models

import (
	"errors"
	"math"
	"strings"
	"testing"
)

const llamaJSON = `{"model_type":"llama","architectures":["LlamaForCausalLM"],"hidden_size":256,"intermediate_size":512,
"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":2048,"max_position_embeddings":512,
"rms_norm_eps":1e-5,"rope_theta":500000.0,"eos_token_id":[1,2],"bos_token_id":0,"tie_word_embeddings":false}`

func TestParseConfig4x(t *testing.T) {
	c, err := ParseConfig([]byte(llamaJSON))
	if err != nil {
		t.Fatal(err)
	}
	if c.Rope.Theta != 500000 || c.HeadDim != 64 || c.KVHeads != 2 || len(c.EOS) != 2 || c.BOS != 0 || c.Rope.RoundBF16 {
		t.Errorf("config %+v", c)
	}
}

func TestParseConfigRopeParameters(t *testing.T) {
	raw := strings.Replace(llamaJSON, `"rope_theta":500000.0`, `"rope_parameters":{"rope_theta":10000.0,"rope_type":"default"},"dtype":"bfloat16"`, 1)
	c, err := ParseConfig([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if c.Rope.Theta != 10000 || !c.Rope.RoundBF16 {
		t.Errorf("rope %+v", c.Rope)
	}
}

// TestLlama3Scaling checks the llama3 frequency rule at its three bands.
func TestLlama3Scaling(t *testing.T) {
	raw := strings.Replace(llamaJSON, `"rope_theta":500000.0`, `"rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}`, 1)
	c, err := ParseConfig([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	got := c.InvFreq()
	for i, f := range got {
		base := 1 / math.Pow(500000, float64(2*i)/64)
		wave := 2 * math.Pi / base
		var want float64
		switch {
		case wave < 8192/4.0:
			want = base
		case wave > 8192/1.0:
			want = base / 8
		default:
			s := (8192/wave - 1) / 3
			want = (1-s)*base/8 + s*base
		}
		if math.Abs(float64(f)-want) > 1e-6*want {
			t.Fatalf("inv_freq[%d] = %v, want %v", i, f, want)
		}
	}
}

func TestParseConfigRefusals(t *testing.T) {
	for _, c := range []struct{ edit, want string }{
		{`"model_type":"gpt2"`, `model_type "gpt2"`},
		{`"model_type":""`, "no model_type"},
		{`"model_type":"llama","attention_bias":true`, "attention_bias"},
		{`"model_type":"llama","hidden_act":"gelu"`, "hidden_act"},
		{`"model_type":"llama","rope_scaling":{"rope_type":"yarn","factor":4}`, "yarn"},

		{`"model_type":"llama","use_sliding_window":true`, "sliding"},
	} {
		raw := strings.Replace(llamaJSON, `"model_type":"llama"`, c.edit, 1)
		_, err := ParseConfig([]byte(raw))
		var ue *UnsupportedError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an unsupported error naming %q", c.edit, err, c.want)
		}
	}
	raw := strings.Replace(llamaJSON, `"num_key_value_heads":2`, `"num_key_value_heads":3`, 1)
	if _, err := ParseConfig([]byte(raw)); err == nil || !strings.Contains(err.Error(), "multiple") {
		t.Errorf("3 kv heads for 4 heads: got %v", err)
	}
	if _, err := ParseConfig([]byte(`{"model_type":`)); err == nil {
		t.Error("truncated JSON: no error")
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(llamaJSON))
	f.Add([]byte(`{"model_type":"qwen3_moe","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":2,"vocab_size":10,"num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":8,"mlp_only_layers":[1,-5,99]}`))
	f.Add([]byte(`{"model_type":"olmo2","hidden_size":1,"num_hidden_layers":1,"num_attention_heads":1,"vocab_size":1,"intermediate_size":1,"eos_token_id":"x"}`))
	f.Add([]byte(`{"model_type":"qwen3","hidden_size":64,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":10,"intermediate_size":8,` +
		`"quantization_config":{"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}}`))
	f.Add([]byte(`{"model_type":"llama","hidden_size":64,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":10,"intermediate_size":8,"quantization_config":{"quant_method":"gptq"}}`))
	f.Add([]byte(`{"model_type":"llama","hidden_size":64,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":10,"intermediate_size":8,"quantization_config":` +
		`{"quant_method":"compressed-tensors","format":"float-quantized","config_groups":{"group_0":{"weights":{"type":"float","num_bits":8,"strategy":"block","block_structure":[128,128]}}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		if q := c.Quant; q != nil && (q.Block[0] < 0 || q.Block[1] < 0 || q.Scale == "") {
			t.Fatalf("accepted fp8 blocks %v", q.Block)
		}
		// A config that parses must describe usable shapes.
		if c.Hidden <= 0 || c.Heads <= 0 || c.KVHeads <= 0 || c.Heads%c.KVHeads != 0 || c.HeadDim <= 0 || c.Vocab <= 0 {
			t.Fatalf("accepted unusable config %+v", c)
		}
		_ = c.InvFreq()
		_ = Expected(c)
	})
}
