// Package hub fetches model checkpoints from the Hugging Face Hub (or a
// mirror of its HTTP API) into the Hub's own local cache, laid out as
// huggingface_hub lays it out (models--ORG--NAME/{blobs,snapshots,refs}),
// so that a checkpoint already fetched by Python tools is used as it is and
// one fetched here serves them too.
//
// Only what troupe loads is fetched: the top-level safetensors files (and
// their index), config.json, generation_config.json, the tokenizer's files
// and a chat template. Each file is verified against the Hub's record (the
// SHA-256 of an LFS file, the git blob hash of a small one) before it
// enters the cache, and an interrupted download resumes where it stopped.
// Peek reads a repository without its weights (its small files and each
// safetensors file's header, by ranges), to check a model before fetching
// it.
package hub
