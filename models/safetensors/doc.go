// Package safetensors reads Hugging Face safetensors checkpoints, single
// files and sharded directories (model.safetensors.index.json), without
// copying tensor data: files are memory-mapped and tensors are views.
//
// The header is validated before any tensor is handed out: known dtypes,
// shapes that match their byte ranges, ranges inside the file and no two
// tensors overlapping. A malformed file yields an error naming the file,
// the tensor and the problem.
//
// A File or Checkpoint is safe for concurrent reads; Close unmaps the data,
// after which tensor views must not be used.
package safetensors
