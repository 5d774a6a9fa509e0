// Package gputest is the conformance suite every gpu.Device passes: each
// operation, on random inputs of awkward sizes, against the float64
// reference lane (gpu/ref).
package gputest
