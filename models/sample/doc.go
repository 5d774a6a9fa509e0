// Package sample picks the next token from logits: greedy, temperature,
// top-k, top-p, min-p and repetition penalty, reproducibly from a seed.
//
// A Sampler belongs to one sequence and is not safe for concurrent use.
package sample
