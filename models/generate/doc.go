// Package generate turns a sequence's logits, step by step, into tokens and
// text: sampling, incremental detokenization, stop sequences, end of
// sequence and token limits. The command line and the scheduler share it,
// so a request gives the same output however it is run.
//
// A State belongs to one sequence and is not safe for concurrent use.
package generate
