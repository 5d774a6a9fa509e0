// Package demo embeds a small trained model, docs-olmo2-17m, so that troupe
// serves something with nothing downloaded.
//
// docs-olmo2-17m is an OLMo 2 architecture (8 layers, hidden 384, 6 heads,
// vocabulary 8192, 17.3M parameters, bfloat16) trained on English technical
// documentation. It writes documentation-like prose; it is a demonstration
// of the pipeline, not an assistant.
package demo
