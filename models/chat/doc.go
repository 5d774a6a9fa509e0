// Package chat renders conversations into prompt text with the chat
// template a Hugging Face model ships in tokenizer_config.json (or beside
// it in chat_template.jinja or chat_template.json).
//
// Templates are Jinja; they are compiled once, when the config is parsed,
// by github.com/ardanlabs/jinja with the settings Hugging Face transformers
// uses (trim_blocks and lstrip_blocks on). The template sees messages (a
// list of {role, content}, with name, tool_calls and tool_call_id where
// set), tools (none, or the functions the model may call),
// add_generation_prompt, the special tokens the config names (bos_token,
// eos_token, pad_token, unk_token) and the helpers raise_exception and
// strftime_now, plus the variables a request adds (Options.Vars, such as
// enable_thinking).
//
// Concurrency: a *Config is immutable after LoadConfig or ParseConfig and
// safe for concurrent use; Render may be called from many goroutines.
package chat
