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

// Function calling: the echo model writes the prompt back, and under
// tool_choice "auto" a <tool_call> block in it comes back as a call.
const tools = [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
const call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>';
const called = await client.chat.completions.create({ model, messages: [{ role: "user", content: call }], tools });
assert.equal(called.choices[0].finish_reason, "tool_calls");
const tc = called.choices[0].message.tool_calls;
assert.equal(tc.length, 1);
assert.equal(tc[0].type, "function");
assert.equal(tc[0].function.name, "get_weather");
assert.deepEqual(JSON.parse(tc[0].function.arguments), { city: "Oslo" });
assert.match(tc[0].id, /^call_/);
assert.equal(called.choices[0].message.content, "tools: get_weather\nuser:\nassistant: ");
checks++;

const cs = await client.chat.completions.create({ model, messages: [{ role: "user", content: call }], tools, stream: true });
let args = "", name = "", ctext2 = "", finish2 = null;
for await (const chunk of cs) {
  for (const c of chunk.choices) {
    ctext2 += c.delta.content ?? "";
    for (const d of c.delta.tool_calls ?? []) {
      assert.equal(d.index, 0);
      name += d.function?.name ?? "";
      args += d.function?.arguments ?? "";
    }
    finish2 = c.finish_reason ?? finish2;
  }
}
assert.equal(name, "get_weather");
assert.deepEqual(JSON.parse(args), { city: "Oslo" });
assert.equal(finish2, "tool_calls");
assert.ok(!ctext2.includes("<tool_call"), ctext2);
checks++;

// The call and its answer go back in the conversation.
const back = await client.chat.completions.create({
  model, tools,
  messages: [{ role: "user", content: "w?" }, { role: "assistant", content: null, tool_calls: tc }, { role: "tool", tool_call_id: tc[0].id, content: "-3" }],
});
assert.equal(back.choices[0].message.content, 'tools: get_weather\nuser: w?\nassistant:  -> get_weather({"city": "Oslo"})\ntool[' + tc[0].id + ']: -3\nassistant: ');
checks++;

const models = await client.models.list();
assert.deepEqual(models.data.map((m) => m.id), [model]);
checks++;

console.log(JSON.stringify({ ok: true, checks }));
