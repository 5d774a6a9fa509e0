// Package gateway serves a troupe model to clients: an OpenAI-compatible HTTP API
// (/v1/chat/completions, /v1/completions, /v1/responses and its kept responses,
// /v1/models) with
// server-sent-event streaming,
// a websocket token stream (/v1/stream) whose requests survive a reconnect, health and
// readiness probes, Prometheus metrics, and an embedded demo page.
//
// The gateway knows nothing of models, the bus or the scheduler. It consumes three small
// interfaces that the caller supplies: a [Tokenizer], an optional [ChatTemplate] and a
// [Backend] that runs one generation and streams its tokens to a callback. A Backend may
// also implement [StatsSource] to have its queue depth, running set, KV usage and
// mailbox depths exported on /metrics.
//
// # Validation
//
// Every request is decoded and validated before anything reaches the Backend; bad input
// gets a 400 with an OpenAI-shaped error body naming the parameter. Unknown JSON fields
// are ignored, as the OpenAI API does, so newer clients keep working; fields the gateway
// knows but cannot honour (the deprecated functions, suffix, best_of > 1, non-text
// response formats) are rejected with a 400 that says so.
//
// # Function calling
//
// Chat requests' tools reach the [ChatTemplate]. A call that tool_choice forces is
// generated under a JSON schema the gateway builds from the functions' parameters
// ([GenerateRequest.Schema]: the arguments of a named function, or a document of calls
// for "required"), so it always parses; under "auto" the model's own
// <tool_call>{...}</tool_call> blocks become calls, streamed without any part of a block
// reaching the content.
//
// # Stop strings
//
// Stop strings are passed to the Backend, and the gateway also applies them itself to
// the text it streams: text that could be the start of a stop string is held back until
// it is known not to be, the stop string is never sent, and the generation is cancelled
// as soon as one matches.
//
// # Concurrency
//
// A [Server] is safe for concurrent use. Each HTTP request runs on its handler's
// goroutine; each websocket connection owns one writer goroutine; each websocket
// generation runs on a goroutine owned by the Server, because it outlives its
// connection for the resume grace period. [Server.Shutdown] stops new work, waits for
// running generations until its context ends, then cancels what is left and waits for
// every goroutine it started. Cancellation always propagates: a client that goes away
// (an HTTP client closing its connection, a websocket cancel frame, or the end of the
// grace period) cancels the context passed to [Backend.Generate].
package gateway
