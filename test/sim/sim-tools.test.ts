// The simulator calls tools as vLLM's OpenAI server does (tools + tool_choice): the non-streamed and
// streamed shapes, arguments valid for the function's JSON Schema, the seeded "auto" rule, errors, and
// the official openai SDK doing a tool call against the simulator on loopback.
import t from 'tap';
import OpenAI from 'openai';
import { startEngine } from '../../src/sim/index.js';
import { post, sseData } from '../support/sim-util.js';

const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'the weather in a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', minLength: 3 },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
        days: { type: 'integer', minimum: 1, maximum: 7 },
        hourly: { type: 'boolean' },
        spots: { type: 'array', items: { type: 'number', minimum: -5, maximum: 5 }, minItems: 2, maxItems: 3 },
        where: { type: 'object', properties: { lat: { type: 'number' }, lon: { type: 'number' } }, required: ['lat', 'lon'] },
      },
      required: ['city', 'unit', 'days'],
    },
  },
};
const lookup = { type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] } } };
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

/** Checks a get_weather argument object against the schema above. */
function checkWeather(t: Tap.Test, a: Record<string, any>): void {
  t.type(a.city, 'string');
  t.ok(a.city.length >= 3, 'minLength');
  t.ok(['celsius', 'fahrenheit'].includes(a.unit), 'enum');
  t.ok(Number.isInteger(a.days) && a.days >= 1 && a.days <= 7, 'integer in bounds');
  t.type(a.hourly, 'boolean');
  t.ok(Array.isArray(a.spots) && a.spots.length >= 2 && a.spots.length <= 3, 'array length');
  for (const s of a.spots) t.ok(typeof s === 'number' && s >= -5 && s <= 5, 'item bounds');
  t.type(a.where.lat, 'number');
  t.type(a.where.lon, 'number');
}

t.test('a forced function: message.tool_calls, content null, finish_reason tool_calls', async (t) => {
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const body = { messages, tools: [lookup, weather], tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 500 };
  const r = await post(e.url, '/v1/chat/completions', body);
  t.equal(r.status, 200, r.body);
  const j = JSON.parse(r.body);
  const ch = j.choices[0];
  t.equal(ch.finish_reason, 'tool_calls');
  t.equal(ch.message.role, 'assistant');
  t.equal(ch.message.content, null);
  t.equal(ch.message.refusal, null);
  t.equal(ch.message.tool_calls.length, 1);
  const call = ch.message.tool_calls[0];
  t.match(call.id, /^chatcmpl-tool-/);
  t.equal(call.type, 'function');
  t.equal(call.function.name, 'get_weather');
  t.type(call.function.arguments, 'string');
  checkWeather(t, JSON.parse(call.function.arguments));
  t.ok(j.usage.completion_tokens >= 1);
  t.equal(j.usage.completion_tokens, Math.ceil(call.function.arguments.length / 4), 'the arguments are the completion');
  // without max_tokens, at most the default output length of tokens (the arguments stay whole)
  const short = JSON.parse((await post(e.url, '/v1/chat/completions', { ...body, max_tokens: undefined })).body);
  t.equal(short.usage.completion_tokens, 16);
  t.equal(short.choices[0].message.tool_calls[0].function.arguments, call.function.arguments);
  // deterministic: the same request, the same arguments
  const again = JSON.parse((await post(e.url, '/v1/chat/completions', body)).body);
  t.equal(again.choices[0].message.tool_calls[0].function.arguments, call.function.arguments);
  t.not(again.choices[0].message.tool_calls[0].id, call.id, 'a fresh call id');
});

t.test('required always calls; none never; no tools: plain text with refusal null', async (t) => {
  const e = await startEngine({ timeScale: 0, toolCallRate: 0 });
  t.teardown(() => e.close());
  for (let i = 0; i < 5; i++) {
    const r = JSON.parse((await post(e.url, '/v1/chat/completions', { messages: [{ role: 'user', content: `q${i}` }], tools: [lookup], tool_choice: 'required' })).body);
    t.equal(r.choices[0].finish_reason, 'tool_calls');
    t.equal(r.choices[0].message.tool_calls[0].function.name, 'lookup');
    t.type(JSON.parse(r.choices[0].message.tool_calls[0].function.arguments).q, 'string');
  }
  const none = JSON.parse((await post(e.url, '/v1/chat/completions', { messages, tools: [lookup], tool_choice: 'none', max_tokens: 3 })).body);
  t.equal(none.choices[0].finish_reason, 'length');
  t.same(none.choices[0].message.tool_calls, []);
  t.type(none.choices[0].message.content, 'string');
  t.equal(none.choices[0].message.refusal, null);
  // toolCallRate 0: auto never calls
  const auto = JSON.parse((await post(e.url, '/v1/chat/completions', { messages, tools: [lookup] })).body);
  t.equal(auto.choices[0].finish_reason, 'stop');
});

t.test('auto: a seeded rule on the last user message, at about the configured rate', async (t) => {
  const e = await startEngine({ timeScale: 0, toolCallRate: 0.3 });
  t.teardown(() => e.close());
  let called = 0;
  const n = 200;
  const first: boolean[] = [];
  for (let i = 0; i < n; i++) {
    const r = JSON.parse((await post(e.url, '/v1/chat/completions', { messages: [{ role: 'user', content: `question ${i}` }], tools: [lookup, weather], tool_choice: 'auto' })).body);
    const c = r.choices[0].finish_reason === 'tool_calls';
    first.push(c);
    if (c) called++;
  }
  t.ok(called > n * 0.18 && called < n * 0.42, `about 30 % call a tool (${called}/${n})`);
  // the same message decides the same way
  for (let i = 0; i < 20; i++) {
    const r = JSON.parse((await post(e.url, '/v1/chat/completions', { messages: [{ role: 'user', content: `question ${i}` }], tools: [lookup, weather] })).body);
    t.equal(r.choices[0].finish_reason === 'tool_calls', first[i], `question ${i} decides as before`);
  }
  const all = await startEngine({ timeScale: 0, toolCallRate: 1 });
  t.teardown(() => all.close());
  const r = JSON.parse((await post(all.url, '/v1/chat/completions', { messages, tools: [lookup, weather] })).body);
  t.equal(r.choices[0].finish_reason, 'tool_calls');
});

t.test('streamed: id and name first, argument fragments after, finish_reason tool_calls', async (t) => {
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const r = await post(e.url, '/v1/chat/completions', { messages, tools: [weather], tool_choice: 'required', stream: true, stream_options: { include_usage: true } });
  t.equal(r.status, 200);
  const events = sseData(r.body);
  t.equal(events.at(-1), '[DONE]');
  const chunks = events.slice(0, -1).map((d) => JSON.parse(d));
  t.same(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
  const calls = chunks.filter((c) => c.choices.length > 0 && c.choices[0].delta.tool_calls);
  const head = calls[0].choices[0].delta.tool_calls[0];
  t.equal(head.index, 0);
  t.match(head.id, /^chatcmpl-tool-/);
  t.equal(head.type, 'function');
  t.equal(head.function.name, 'get_weather');
  t.equal(head.function.arguments, '');
  let args = '';
  for (const c of calls.slice(1)) {
    const d = c.choices[0].delta.tool_calls[0];
    t.equal(d.index, 0);
    t.equal(d.id, undefined, 'fragments carry no id');
    args += d.function.arguments;
  }
  t.ok(calls.length > 2, 'several fragments');
  checkWeather(t, JSON.parse(args));
  const last = calls.at(-1);
  t.equal(last.choices[0].finish_reason, 'tool_calls');
  for (const c of calls.slice(0, -1)) t.equal(c.choices[0].finish_reason, null);
  const usage = chunks.at(-1).usage;
  t.equal(usage.completion_tokens, calls.length - 1, 'one fragment per token');
  // the streamed arguments are the non-streamed ones
  const ns = JSON.parse((await post(e.url, '/v1/chat/completions', { messages, tools: [weather], tool_choice: 'required' })).body);
  t.equal(ns.choices[0].message.tool_calls[0].function.arguments, args);
});

t.test('a history with assistant tool_calls and tool results is accepted and answered', async (t) => {
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const history = [
    ...messages,
    { role: 'assistant', content: null, tool_calls: [{ id: 'chatcmpl-tool-1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'chatcmpl-tool-1', content: '{"temp": 21}' },
  ];
  const r = await post(e.url, '/v1/chat/completions', { messages: history, tools: [weather], tool_choice: 'none', max_tokens: 4 });
  t.equal(r.status, 200, r.body);
  t.equal(JSON.parse(r.body).choices[0].message.content.length, 16);
});

t.test('bad tools and tool_choice: 400 naming the field', async (t) => {
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const cases: [unknown, string][] = [
    [{ messages, tools: 'x' }, 'tools'],
    [{ messages, tools: [{ type: 'function' }] }, 'tools'],
    [{ messages, tools: [{ type: 'retrieval', function: { name: 'a' } }] }, 'tools'],
    [{ messages, tools: [{ type: 'function', function: { name: '' } }] }, 'tools'],
    [{ messages, tools: [{ type: 'function', function: { name: 'a', parameters: 3 } }] }, 'tools'],
    [{ messages, tools: Array.from({ length: 129 }, () => lookup) }, 'tools'],
    [{ messages, tool_choice: 'required' }, 'tool_choice'],
    [{ messages, tools: [lookup], tool_choice: 'sometimes' }, 'tool_choice'],
    [{ messages, tools: [lookup], tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
    [{ messages, tools: [lookup], tool_choice: { type: 'function' } }, 'tool_choice'],
  ];
  for (const [body, param] of cases) {
    const r = await post(e.url, '/v1/chat/completions', body);
    t.equal(r.status, 400, JSON.stringify(body).slice(0, 80));
    const err = JSON.parse(r.body).error;
    t.equal(err.param, param);
    t.type(err.message, 'string');
  }
  // a schema far deeper than sense: answered, bounded
  let deep: Record<string, unknown> = { type: 'string' };
  for (let i = 0; i < 200; i++) deep = { type: 'object', properties: { a: deep }, required: ['a'] };
  const r = await post(e.url, '/v1/chat/completions', { messages, tools: [{ type: 'function', function: { name: 'deep', parameters: deep } }], tool_choice: 'required' });
  t.equal(r.status, 200);
  JSON.parse(JSON.parse(r.body).choices[0].message.tool_calls[0].function.arguments);
});

t.test('the openai SDK: a tool call, not streamed and streamed', async (t) => {
  const e = await startEngine({ timeScale: 0, models: ['m'] });
  t.teardown(() => e.close());
  const client = new OpenAI({ baseURL: `${e.url}/v1`, apiKey: 'none', maxRetries: 0 });
  const tools = [weather] as OpenAI.Chat.Completions.ChatCompletionTool[];
  const c = await client.chat.completions.create({ model: 'm', messages: messages as any, tools, tool_choice: 'required' });
  t.equal(c.choices[0]!.finish_reason, 'tool_calls');
  const call = c.choices[0]!.message.tool_calls![0]! as OpenAI.Chat.Completions.ChatCompletionMessageFunctionToolCall;
  t.equal(call.function.name, 'get_weather');
  checkWeather(t, JSON.parse(call.function.arguments));

  const stream = await client.chat.completions.create({ model: 'm', messages: messages as any, tools, tool_choice: 'required', stream: true });
  let name = '';
  let args = '';
  let id = '';
  let finish: string | null = null;
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (ch === undefined) continue;
    for (const tc of ch.delta.tool_calls ?? []) {
      if (tc.id) id = tc.id;
      if (tc.function?.name) name += tc.function.name;
      if (tc.function?.arguments) args += tc.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  t.equal(finish, 'tool_calls');
  t.equal(name, 'get_weather');
  t.match(id, /^chatcmpl-tool-/);
  t.equal(args, call.function.arguments);
  // the SDK's stream helper assembles the same call
  const runner = client.chat.completions.stream({ model: 'm', messages: messages as any, tools, tool_choice: 'required' });
  const final = await runner.finalChatCompletion();
  const fc = final.choices[0]!.message.tool_calls![0]! as OpenAI.Chat.Completions.ChatCompletionMessageFunctionToolCall;
  t.equal(fc.function.name, 'get_weather');
  t.equal(fc.function.arguments, call.function.arguments);
});

t.test('response_format json_object and json_schema: the content is valid JSON, streamed and not', async (t) => {
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const obj = JSON.parse((await post(e.url, '/v1/chat/completions', { messages, response_format: { type: 'json_object' } })).body);
  const o = JSON.parse(obj.choices[0].message.content);
  t.type(o.answer, 'string');
  t.equal(obj.choices[0].message.refusal, null);
  const schema = weather.function.parameters;
  const body = { messages, response_format: { type: 'json_schema', json_schema: { name: 'w', schema } }, max_tokens: 400 };
  const r = JSON.parse((await post(e.url, '/v1/chat/completions', body)).body);
  checkWeather(t, JSON.parse(r.choices[0].message.content));
  t.equal(r.usage.completion_tokens, Math.ceil(r.choices[0].message.content.length / 4));
  const s = await post(e.url, '/v1/chat/completions', { ...body, stream: true });
  const chunks = sseData(s.body).slice(0, -1).map((d) => JSON.parse(d));
  const text = chunks.map((c) => c.choices[0].delta.content ?? '').join('');
  t.equal(text, r.choices[0].message.content, 'streamed content is the same JSON');
  const text2 = JSON.parse((await post(e.url, '/v1/chat/completions', { messages, response_format: { type: 'text' }, max_tokens: 2 })).body);
  t.equal(text2.choices[0].message.content.length, 8, 'text: free text');
  for (const rf of ['json', { type: 'yaml' }, { type: 'json_schema' }, { type: 'json_schema', json_schema: { schema: [] } }]) {
    const bad = await post(e.url, '/v1/chat/completions', { messages, response_format: rf });
    t.equal(bad.status, 400);
    t.equal(JSON.parse(bad.body).error.param, 'response_format');
  }
});

t.test('stop strings: the text ends before the first one, finish_reason stop, stop_reason names it', async (t) => {
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const prompt = 'Tell me a story about the sea.';
  for (const kind of ['chat', 'completion'] as const) {
    const path = kind === 'chat' ? '/v1/chat/completions' : '/v1/completions';
    const base = kind === 'chat' ? { messages: [{ role: 'user', content: prompt }], max_tokens: 12 } : { prompt, max_tokens: 12 };
    const content = (j: any) => (kind === 'chat' ? j.choices[0].message.content : j.choices[0].text);
    const full = content(JSON.parse((await post(e.url, path, base)).body)) as string;
    t.equal(full.length, 48);
    const stop = full.slice(21, 26); // spans two tokens
    const at = full.indexOf(stop);
    const r = JSON.parse((await post(e.url, path, { ...base, stop: [stop, 'never there'] })).body);
    t.equal(content(r), full.slice(0, at), `${kind}: the text before the stop string`);
    t.equal(r.choices[0].finish_reason, 'stop');
    t.equal(r.choices[0].stop_reason, stop);
    t.equal(r.usage.completion_tokens, Math.floor(at / 4) + 1);
    const s = await post(e.url, path, { ...base, stop, stream: true });
    const chunks = sseData(s.body).slice(0, -1).map((d) => JSON.parse(d));
    const text = chunks.map((c) => (kind === 'chat' ? c.choices[0].delta.content ?? '' : c.choices[0].text)).join('');
    t.equal(text, full.slice(0, at), `${kind}: streamed the same`);
    t.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
    t.equal(chunks.at(-1).choices[0].stop_reason, stop);
    // a stop string the text does not hold changes nothing
    const none = JSON.parse((await post(e.url, path, { ...base, stop: 'zzzz' })).body);
    t.equal(content(none), full);
    t.equal(none.choices[0].finish_reason, 'length');
  }
  for (const stop of [3, [''], ['a', 4], Array.from({ length: 17 }, () => 'x'), 'y'.repeat(1025)]) {
    const bad = await post(e.url, '/v1/completions', { prompt, stop });
    t.equal(bad.status, 400);
    t.equal(JSON.parse(bad.body).error.param, 'stop');
  }
});

t.test('echo on completions: the prompt precedes the text, streamed and not', async (t) => {
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const prompt = 'Say "hi"\n\tthen stop';
  const plain = JSON.parse((await post(e.url, '/v1/completions', { prompt, max_tokens: 5 })).body);
  const r = JSON.parse((await post(e.url, '/v1/completions', { prompt, max_tokens: 5, echo: true })).body);
  t.equal(r.choices[0].text, prompt + plain.choices[0].text);
  t.equal(r.usage.completion_tokens, 5, 'the echo is not completion');
  const s = await post(e.url, '/v1/completions', { prompt, max_tokens: 5, echo: true, stream: true });
  const chunks = sseData(s.body).slice(0, -1).map((d) => JSON.parse(d));
  t.equal(chunks[0].choices[0].text, prompt, 'the first chunk is the prompt');
  t.equal(chunks.map((c) => c.choices[0].text).join(''), prompt + plain.choices[0].text);
  const st = JSON.parse((await post(e.url, '/v1/completions', { prompt, max_tokens: 5, echo: true, stop: plain.choices[0].text.slice(6, 9) })).body);
  t.equal(st.choices[0].text, prompt + plain.choices[0].text.slice(0, plain.choices[0].text.indexOf(plain.choices[0].text.slice(6, 9))));
  t.equal((await post(e.url, '/v1/completions', { prompt, echo: 'yes' })).status, 400);
  t.equal((await post(e.url, '/v1/completions', { prompt: [1, 2, 3], echo: true })).status, 400);
  const off = JSON.parse((await post(e.url, '/v1/completions', { prompt, max_tokens: 5, echo: false })).body);
  t.equal(off.choices[0].text, plain.choices[0].text);
});

t.test('--reasoning: reasoning_content before content, streamed and not', async (t) => {
  const plain = await startEngine({ timeScale: 0 });
  const e = await startEngine({ timeScale: 0, reasoning: true });
  t.teardown(() => Promise.all([e.close(), plain.close()]));
  const body = { messages, max_tokens: 8 };
  const base = JSON.parse((await post(plain.url, '/v1/chat/completions', body)).body).choices[0].message;
  t.equal(base.reasoning_content, undefined, 'off by default');
  const m = JSON.parse((await post(e.url, '/v1/chat/completions', body)).body).choices[0].message;
  t.equal(m.reasoning_content, base.content.slice(0, 16), 'the first half thinks');
  t.equal(m.content, base.content.slice(16));
  const s = await post(e.url, '/v1/chat/completions', { ...body, stream: true });
  const deltas = sseData(s.body).slice(1, -1).map((d) => JSON.parse(d).choices[0].delta);
  t.equal(deltas.map((d) => d.reasoning_content ?? '').join(''), m.reasoning_content);
  t.equal(deltas.map((d) => d.content ?? '').join(''), m.content);
  t.ok(deltas.slice(0, 4).every((d) => d.reasoning_content !== undefined && d.content === undefined), 'reasoning deltas first');
  // a tool call does not think
  const tc = JSON.parse((await post(e.url, '/v1/chat/completions', { messages, tools: [lookup], tool_choice: 'required' })).body);
  t.equal(tc.choices[0].finish_reason, 'tool_calls');
});

t.test('logprobs: chat logprobs/top_logprobs and completions logprobs in vLLM shapes', async (t) => {
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const c = JSON.parse((await post(e.url, '/v1/chat/completions', { messages, max_tokens: 4, logprobs: true, top_logprobs: 3 })).body);
  const content = c.choices[0].logprobs.content;
  t.equal(content.length, 4);
  t.equal(content.map((x: any) => x.token).join(''), c.choices[0].message.content);
  for (const x of content) {
    t.ok(x.logprob <= 0 && x.logprob > -2);
    t.same(x.bytes, [...Buffer.from(x.token)]);
    t.equal(x.top_logprobs.length, 3);
    t.equal(x.top_logprobs[0].token, x.token, 'the sampled token first');
    t.ok(x.top_logprobs[1].logprob < x.logprob && x.top_logprobs[2].logprob < x.top_logprobs[1].logprob, 'in descending order');
    t.not(x.top_logprobs[1].token, x.token);
  }
  const only = JSON.parse((await post(e.url, '/v1/chat/completions', { messages, max_tokens: 2, logprobs: true })).body);
  t.same(only.choices[0].logprobs.content[0].top_logprobs, []);
  t.equal(JSON.parse((await post(e.url, '/v1/chat/completions', { messages, max_tokens: 2 })).body).choices[0].logprobs, null);
  const s = await post(e.url, '/v1/chat/completions', { messages, max_tokens: 4, logprobs: true, top_logprobs: 3, stream: true });
  const chunks = sseData(s.body).slice(1, -1).map((d) => JSON.parse(d));
  t.same(chunks.map((ch) => ch.choices[0].logprobs.content[0]), content, 'streamed: one entry per chunk, the same');

  const p = JSON.parse((await post(e.url, '/v1/completions', { prompt: 'once upon', max_tokens: 3, logprobs: 2 })).body);
  const lp = p.choices[0].logprobs;
  t.equal(lp.tokens.join(''), p.choices[0].text);
  t.same(lp.text_offset, [0, 4, 8]);
  t.equal(lp.token_logprobs.length, 3);
  t.equal(Object.keys(lp.top_logprobs[0]).length, 2);
  t.equal(lp.top_logprobs[0][lp.tokens[0]], lp.token_logprobs[0]);
  const echoed = JSON.parse((await post(e.url, '/v1/completions', { prompt: 'once upon', max_tokens: 3, logprobs: 0, echo: true })).body);
  t.same(echoed.choices[0].logprobs.text_offset, [9, 13, 17], 'offsets after the echoed prompt');
  for (const [path, body, param] of [
    ['/v1/chat/completions', { messages, logprobs: 3 }, 'logprobs'],
    ['/v1/chat/completions', { messages, top_logprobs: 2 }, 'top_logprobs'],
    ['/v1/chat/completions', { messages, logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
    ['/v1/completions', { prompt: 'x', logprobs: 21 }, 'logprobs'],
    ['/v1/completions', { prompt: 'x', logprobs: 'yes' }, 'logprobs'],
  ] as const) {
    const r = await post(e.url, path, body);
    t.equal(r.status, 400, JSON.stringify(body));
    t.equal(JSON.parse(r.body).error.param, param);
  }
});

t.test('n > 1: n choices with their own text, streamed and not; usage counts them all', async (t) => {
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const one = JSON.parse((await post(e.url, '/v1/chat/completions', { messages, max_tokens: 4 })).body);
  const r = JSON.parse((await post(e.url, '/v1/chat/completions', { messages, max_tokens: 4, n: 3 })).body);
  t.equal(r.choices.length, 3);
  t.same(r.choices.map((c: any) => c.index), [0, 1, 2]);
  t.equal(r.choices[0].message.content, one.choices[0].message.content, 'choice 0 is the n=1 text');
  t.equal(new Set(r.choices.map((c: any) => c.message.content)).size, 3, 'the choices differ');
  t.equal(r.usage.completion_tokens, 12);
  t.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
  const s = await post(e.url, '/v1/chat/completions', { messages, max_tokens: 4, n: 3, stream: true, stream_options: { include_usage: true } });
  const chunks = sseData(s.body).slice(0, -1).map((d) => JSON.parse(d));
  for (let j = 0; j < 3; j++) {
    const mine = chunks.filter((c) => c.choices.length > 0 && c.choices[0].index === j);
    t.same(mine[0].choices[0].delta, { role: 'assistant', content: '' });
    t.equal(mine.map((c) => c.choices[0].delta.content).join(''), r.choices[j].message.content, `choice ${j} streamed`);
    t.equal(mine.at(-1).choices[0].finish_reason, 'length');
  }
  t.equal(chunks.at(-1).usage.completion_tokens, 12);
  const c = JSON.parse((await post(e.url, '/v1/completions', { prompt: 'abc', max_tokens: 2, n: 2 })).body);
  t.equal(c.choices.length, 2);
  t.equal(c.choices[1].index, 1);
  for (const body of [{ n: 0 }, { n: 1.5 }, { n: 65 }, { n: 2, tools: [lookup], tool_choice: 'required' }, { n: 2, response_format: { type: 'json_object' } }]) {
    const bad = await post(e.url, '/v1/chat/completions', { messages, ...body });
    t.equal(bad.status, 400, JSON.stringify(body));
    t.equal(JSON.parse(bad.body).error.param, 'n');
  }
});
