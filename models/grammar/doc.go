// Package grammar constrains generation to a grammar, token by token: for
// a sequence's output so far it says which tokens of the vocabulary may
// come next, so that a draw from the logits it masks can only continue
// text the grammar accepts.
//
// JSON is OpenAI's JSON mode (response_format {"type": "json_object"}):
// the output is one JSON object (RFC 8259), from its opening brace, and
// generation ends when the object closes. A vocabulary's
// JSON is built once and shared by every sequence that uses it (safe for
// concurrent use); each sequence keeps a Seq of its own.
//
// A token is allowed where every byte it decodes to keeps the text a
// prefix of some valid JSON object. Tokens are scanned in lexicographic
// order of their bytes, so that a prefix shared by many tokens is scanned
// once and a prefix the grammar refuses rules out every token after it
// that shares it. The masks are cached by the scanner's state, which
// repeats often (inside a string at the same depth, say).
//
// Limits that keep a model from running on forever inside the grammar:
// at most MaxDepth nested objects and arrays, and at most MaxWhitespace
// whitespace bytes in a row between tokens of JSON (enough to indent a few
// levels; a model that would go on indenting must write something).
package grammar
