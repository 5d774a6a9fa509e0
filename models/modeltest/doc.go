// Package modeltest finds the shared test data (the Hugging Face fixtures,
// tokenizers and anchors kept beside the repository) for the tests and
// benchmarks of the model packages and those above them.
package modeltest
