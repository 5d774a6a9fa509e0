// Package models turns Hugging Face checkpoints into running models.
//
// It reads config.json (ReadConfig), checks a checkpoint before loading it
// (Inspect), loads its weights onto a gpu.Device (Load) and runs the forward
// pass of OLMo 2, Llama, Qwen3 and Qwen3-MoE over batches of tokens from
// many sequences at once, against a paged KV cache (Model.Forward). The
// forward pass is written once against gpu.Device, so every lane runs the
// same code.
//
// A Model is used by one goroutine at a time, the owner of its device.
// Subpackages: safetensors (checkpoint files), tokenizer and chat (text),
// sample (token sampling).
package models
