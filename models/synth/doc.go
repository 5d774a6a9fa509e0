// Package synth writes random-weight checkpoints with the shapes of real
// models, for benchmarks that need a model's size but not its knowledge.
package synth
