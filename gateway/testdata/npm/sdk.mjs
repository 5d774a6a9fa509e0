// Drives the gateway with the official openai npm package. Run by the Go test
// TestNodeOpenAISDK, which passes TROUPE_BASE_URL and TROUPE_API_KEY.
import assert from "node:assert/strict";
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.TROUPE_BASE_URL + "/v1",
  apiKey: process.env.TROUPE_API_KEY,
  maxRetries: 0,
});
const model = "echo-1";
let checks = 0;

const chat = await client.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], seed: 3 });
assert.equal(chat.object, "chat.completion");
assert.equal(chat.choices[0].message.content, "user: hi\nassistant: ");
assert.equal(chat.choices[0].finish_reason, "stop");
assert.equal(chat.usage.total_tokens, 40);
checks++;

const stream = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "hi" }], max_tokens: 4, stream: true, stream_options: { include_usage: true },
});
let text = "", usage = null, finish = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    text += c.delta.content ?? "";
    finish = c.finish_reason ?? finish;
  }
}
assert.equal(text, "user");
assert.equal(finish, "length");
assert.equal(usage.completion_tokens, 4);
checks++;

const comp = await client.completions.create({ model, prompt: [[104, 105], [111, 107]], n: 2, stop: ["k"] });
assert.deepEqual(comp.choices.map((c) => c.text), ["hi", "hi", "o", "o"]);
assert.equal(comp.usage.prompt_tokens, 4);
checks++;

const cstream = await client.completions.create({ model, prompt: "streamed", stream: true });
let ctext = "";
for await (const chunk of cstream) for (const c of chunk.choices) ctext += c.text;
assert.equal(ctext, "streamed");
checks++;

await assert.rejects(client.completions.create({ model: "nope", prompt: "x" }), (e) => {
  assert.ok(e instanceof OpenAI.BadRequestError, "want BadRequestError, got " + e.constructor.name);
  assert.equal(e.status, 400);
  assert.equal(e.code, "model_not_found");
  assert.equal(e.param, "model");
  assert.match(e.message, /nope/);
  return true;
});
checks++;

await assert.rejects(client.chat.completions.create({ model, messages: [{ role: "user", content: "x" }], temperature: 3 }), (e) => {
  assert.ok(e instanceof OpenAI.BadRequestError);
  assert.equal(e.param, "temperature");
  return true;
});
checks++;

const bad = new OpenAI({ baseURL: process.env.TROUPE_BASE_URL + "/v1", apiKey: "wrong", maxRetries: 0 });
await assert.rejects(bad.models.list(), (e) => {
  assert.ok(e instanceof OpenAI.AuthenticationError);
  return true;
});
checks++;

const models = await client.models.list();
assert.deepEqual(models.data.map((m) => m.id), [model]);
checks++;

console.log(JSON.stringify({ ok: true, checks }));
