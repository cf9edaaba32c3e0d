// Conformance: real requests through the router (real sockets, simulated
// engines), each answer checked field by field against OpenAI's published
// shapes (testkit/openai-shapes.ts): the Response object (created,
// incomplete, with tools, reasoning, logprobs, JSON formats), every streamed
// event and the stream's order, GET / DELETE / input_items, and the Error
// object on every error path (the router's own, relayed engine errors, a
// stream's error event), on /v1/responses and /v1/chat/completions. Then the
// field echoes the issue found wrong (#33): parallel_tool_calls, tool_choice,
// reasoning, service_tier, top_logprobs, prompt_cache_key, safety_identifier,
// max_tool_calls, text.verbosity, cache_write_tokens, assistant logprobs in
// input_items, developer role, nulls left out.
import t from 'tap';
import { startTestRouter } from '../support/router-util.js';
import {
  check,
  checkStreamOrder,
  ERROR_BODY,
  ERROR_TYPES,
  INPUT_ITEM,
  list,
  RESPONSE,
  RESPONSE_DELETED,
  STREAM_EVENT,
  type Shape,
} from '../../testkit/openai-shapes.js';

async function router(t: Tap.Test, fleet: Record<string, unknown> = { timeScale: 0 }) {
  return startTestRouter(t, { n: 2, fleet });
}

async function call(url: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: any; text: string }> {
  const res = await fetch(url + path, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json: any = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = null;
  }
  return { status: res.status, json, text };
}

/** The events of a streamed answer (`event:` / `data:` blocks). */
function sse(text: string): Record<string, any>[] {
  const out: Record<string, any>[] = [];
  for (const block of text.split('\n\n')) {
    const data = block.split('\n').find((l) => l.startsWith('data: '));
    if (data === undefined) continue;
    const ev = JSON.parse(data.slice(6));
    const name = block.split('\n').find((l) => l.startsWith('event: '));
    if (name !== undefined && name.slice(7) !== ev.type) throw new Error(`event name ${name.slice(7)} and type ${ev.type} differ`);
    out.push(ev);
  }
  return out;
}

function conforms(t: Tap.Test, shape: Shape, v: unknown, what: string): void {
  const errs = check(shape, v);
  t.same(errs, [], `${what} conforms${errs.length > 0 ? ': ' + errs.slice(0, 6).join('; ') : ''}`);
}

function errorConforms(t: Tap.Test, r: { status: number; json: any; text: string }, status: number, what: string): void {
  t.equal(r.status, status, `${what}: ${status}`);
  conforms(t, ERROR_BODY, r.json, `${what}: error`);
  if (r.json?.error) t.ok(ERROR_TYPES.includes(r.json.error.type), `${what}: type ${r.json.error.type} in OpenAI's vocabulary`);
}

function streamConforms(t: Tap.Test, evs: Record<string, any>[], what: string): void {
  const bad = evs.flatMap((e, i) => check(STREAM_EVENT, e, `event[${i}]`));
  t.same(bad, [], `${what}: every event conforms${bad.length > 0 ? ': ' + bad.slice(0, 6).join('; ') : ''}`);
  const order = checkStreamOrder(evs);
  t.same(order, [], `${what}: order${order.length > 0 ? ': ' + order.join('; ') : ''}`);
}

const weather = { type: 'function', name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };

t.test('Response objects: plain, incomplete, with every optional field, with tools, JSON formats', async (t) => {
  const { url } = await router(t);
  const cases: [string, Record<string, unknown>][] = [
    ['plain', { model: 'open-model', input: 'Tell me about routers.' }],
    ['incomplete', { model: 'open-model', input: 'Tell me more.', max_output_tokens: 3 }],
    [
      'every optional field',
      {
        model: 'open-model',
        input: [{ role: 'user', content: [{ type: 'input_text', text: 'hi' }] }],
        instructions: 'Be brief.',
        temperature: 0.5,
        top_p: 0.9,
        metadata: { k: 'v' },
        user: 'u1',
        safety_identifier: 'sid',
        prompt_cache_key: 'pk',
        prompt_cache_retention: 'in-memory',
        service_tier: 'auto',
        max_tool_calls: 2,
        top_logprobs: 0,
        parallel_tool_calls: false,
        reasoning: { effort: 'low', summary: 'auto' },
        text: { format: { type: 'text' }, verbosity: 'medium' },
        truncation: 'disabled',
        store: true,
      },
    ],
    ['forced tool', { model: 'open-model', input: 'weather?', tools: [weather], tool_choice: { type: 'function', name: 'get_weather' } }],
    ['tools, none', { model: 'open-model', input: 'weather?', tools: [weather], tool_choice: 'none', max_output_tokens: 8 }],
    ['json_object', { model: 'open-model', input: 'json please', text: { format: { type: 'json_object' } } }],
    ['json_schema', { model: 'open-model', input: 'json please', text: { format: { type: 'json_schema', name: 'o', schema: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] } } } }],
    ['logprobs', { model: 'open-model', input: 'hi', top_logprobs: 2, include: ['message.output_text.logprobs'], max_output_tokens: 5 }],
  ];
  for (const [name, body] of cases) {
    const r = await call(url, 'POST', '/v1/responses', body);
    t.equal(r.status, 200, `${name}: 200 ${r.status === 200 ? '' : r.text}`);
    conforms(t, RESPONSE, r.json, name);
    const g = await call(url, 'GET', `/v1/responses/${r.json.id}`);
    conforms(t, RESPONSE, g.json, `${name} (GET)`);
    t.same(g.json, r.json, `${name}: GET returns the object as created`);
  }
  const inc = await call(url, 'POST', '/v1/responses', cases[1]![1]);
  t.equal(inc.json.status, 'incomplete');
  t.same(inc.json.incomplete_details, { reason: 'max_output_tokens' });
  t.equal(inc.json.output[0].status, 'incomplete');
  const json = await call(url, 'POST', '/v1/responses', cases[5]![1]);
  t.type(JSON.parse(json.json.output[0].content[0].text), 'object', 'json_object: the text is a JSON object');
  const lp = await call(url, 'POST', '/v1/responses', cases[7]![1]);
  const logprobs = lp.json.output[0].content[0].logprobs;
  t.equal(logprobs.length, 5, 'one logprob per token');
  t.equal(logprobs[0].top_logprobs.length, 2, 'top_logprobs: 2 alternatives');
});

t.test('the echoed fields are what was asked; unset optional fields are left out, not null', async (t) => {
  const { url } = await router(t);
  const r = (await call(url, 'POST', '/v1/responses', { model: 'open-model', input: 'hi', parallel_tool_calls: false, tools: [weather], tool_choice: 'none', reasoning: { effort: 'high', summary: 'concise' }, top_logprobs: 3, max_tool_calls: 4, prompt_cache_key: 'k1', safety_identifier: 's1', service_tier: 'default', text: { verbosity: 'medium' }, max_output_tokens: 4 })).json;
  t.equal(r.parallel_tool_calls, false, 'parallel_tool_calls false echoed false');
  t.equal(r.tool_choice, 'none', 'tool_choice none echoed none');
  t.same(r.reasoning, { effort: 'high', summary: 'concise' }, 'reasoning echoed');
  t.equal(r.top_logprobs, 3);
  t.equal(r.max_tool_calls, 4);
  t.equal(r.prompt_cache_key, 'k1');
  t.equal(r.safety_identifier, 's1');
  t.equal(r.service_tier, 'default');
  t.same(r.text, { format: { type: 'text' }, verbosity: 'medium' });
  t.same(r.tools, [{ type: 'function', name: 'get_weather', description: null, parameters: weather.parameters, strict: null }]);
  t.type(r.usage.input_tokens_details.cache_write_tokens, 'number', 'usage.input_tokens_details.cache_write_tokens');
  t.equal(r.usage.input_tokens_details.cached_tokens + r.usage.input_tokens_details.cache_write_tokens, r.usage.input_tokens);
  const bare = (await call(url, 'POST', '/v1/responses', { model: 'open-model', input: 'hi' })).json;
  for (const k of ['user', 'safety_identifier', 'prompt_cache_key']) t.notOk(k in bare, `${k} left out when unset`);
  t.equal(bare.parallel_tool_calls, true);
  t.equal(bare.tool_choice, 'auto');
  t.same(bare.reasoning, { effort: null, summary: null });
  // input_items: the developer role kept, assistant items with logprobs
  const two = (await call(url, 'POST', '/v1/responses', { model: 'open-model', input: [{ role: 'developer', content: 'Be terse.' }, { role: 'user', content: 'hi' }], previous_response_id: bare.id })).json;
  const items = (await call(url, 'GET', `/v1/responses/${two.id}/input_items?order=asc`)).json;
  conforms(t, list(INPUT_ITEM), items, 'input_items');
  t.same(
    items.data.map((i: any) => i.role),
    ['user', 'assistant', 'developer', 'user'],
  );
  t.same(items.data[1].content[0].logprobs, [], 'assistant output_text has logprobs');
  t.same(items.data[1].id, bare.output[0].id, "the assistant item keeps its output item's id");
});

t.test('streams: plain, incomplete, tool call, logprobs, reasoning: every event and the order', async (t) => {
  const { url } = await router(t);
  const bodies: [string, Record<string, unknown>][] = [
    ['plain', { model: 'open-model', input: 'Tell me a story.', stream: true }],
    ['incomplete', { model: 'open-model', input: 'Tell me a story.', stream: true, max_output_tokens: 4 }],
    ['tool call', { model: 'open-model', input: 'weather?', stream: true, tools: [weather], tool_choice: 'required' }],
    ['logprobs', { model: 'open-model', input: 'hi', stream: true, top_logprobs: 1, max_output_tokens: 6 }],
    ['stream_options', { model: 'open-model', input: 'hi', stream: true, stream_options: { include_obfuscation: false }, max_output_tokens: 3 }],
  ];
  for (const [name, body] of bodies) {
    const r = await call(url, 'POST', '/v1/responses', body);
    t.equal(r.status, 200, name);
    const evs = sse(r.text);
    streamConforms(t, evs, name);
    conforms(t, RESPONSE, evs.at(-1)!.response, `${name}: final response`);
  }
  const lp = sse((await call(url, 'POST', '/v1/responses', bodies[3]![1])).text);
  const deltas = lp.filter((e) => e.type === 'response.output_text.delta');
  t.ok(deltas.every((d) => d.logprobs.length === 1 && d.logprobs[0].top_logprobs.length === 1), 'each text delta carries its token logprob');
  const { url: rurl } = await router(t, { timeScale: 0, reasoning: true });
  const rs = await call(rurl, 'POST', '/v1/responses', { model: 'open-model', input: 'Think, then answer.', stream: true, max_output_tokens: 12 });
  const evs = sse(rs.text);
  streamConforms(t, evs, 'reasoning');
  t.same(
    evs.filter((e) => e.type === 'response.output_item.added').map((e) => e.item.type),
    ['reasoning', 'message'],
    'the engine reasoning_content as a reasoning item, then the message',
  );
  const whole = await call(rurl, 'POST', '/v1/responses', { model: 'open-model', input: 'Think, then answer.', max_output_tokens: 12 });
  conforms(t, RESPONSE, whole.json, 'reasoning (JSON)');
  t.equal(whole.json.output[0].type, 'reasoning');
  t.ok(whole.json.output[0].content[0].text.length > 0);
});

t.test('a failed stream: error event and response.failed conform, the partial output kept', async (t) => {
  const { url } = await router(t, { timeScale: 0.01, failureRate: 1, failureKinds: ['error-mid-stream'] });
  const r = await call(url, 'POST', '/v1/responses', { model: 'open-model', input: 'Tell me a long story.', stream: true, max_output_tokens: 40 });
  const evs = sse(r.text);
  streamConforms(t, evs, 'failed');
  const failed = evs.at(-1)!;
  t.equal(failed.type, 'response.failed');
  const text = evs.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  if (text.length > 0) t.equal(failed.response.output[0]?.content[0]?.text, text, 'the failed response holds the text streamed');
  t.ok(failed.response.error.message.length > 0);
});

t.test('GET / DELETE / input_items objects', async (t) => {
  const { url } = await router(t);
  const a = (await call(url, 'POST', '/v1/responses', { model: 'open-model', input: 'one', max_output_tokens: 3 })).json;
  const b = (await call(url, 'POST', '/v1/responses', { model: 'open-model', input: 'two', previous_response_id: a.id, max_output_tokens: 3 })).json;
  const items = await call(url, 'GET', `/v1/responses/${b.id}/input_items`);
  conforms(t, list(INPUT_ITEM), items.json, 'input_items');
  const del = await call(url, 'DELETE', `/v1/responses/${a.id}`);
  conforms(t, RESPONSE_DELETED, del.json, 'deleted');
  errorConforms(t, await call(url, 'GET', `/v1/responses/${a.id}`), 404, 'GET deleted');
  errorConforms(t, await call(url, 'DELETE', `/v1/responses/${a.id}`), 404, 'DELETE deleted');
  errorConforms(t, await call(url, 'GET', `/v1/responses/${b.id}/input_items?limit=0`), 400, 'input_items bad limit');
});

t.test('errors everywhere: the router, relayed engine errors, chat completions', async (t) => {
  const { url } = await router(t);
  const cases: [string, string, unknown, number][] = [
    ['responses: not JSON', '/v1/responses', '{"model":', 400],
    ['responses: no model', '/v1/responses', { input: 'x' }, 400],
    ['responses: unknown field', '/v1/responses', { model: 'open-model', input: 'x', nope: 1 }, 400],
    ['responses: built-in tool', '/v1/responses', { model: 'open-model', input: 'x', tools: [{ type: 'file_search' }] }, 400],
    ['responses: bad schema', '/v1/responses', { model: 'open-model', input: 'x', tools: [{ type: 'function', name: 'f', parameters: { type: 'object', required: 'a' } }] }, 400],
    ['responses: unknown previous', '/v1/responses', { model: 'open-model', input: 'x', previous_response_id: 'resp_x' }, 404],
    ['responses: unknown model', '/v1/responses', { model: 'nope', input: 'x' }, 404],
    ['responses: engine context error', '/v1/responses', { model: 'open-model', input: 'x', max_output_tokens: 10_000_000 }, 400],
    ['chat: not JSON', '/v1/chat/completions', '{"model":', 400],
    ['chat: unknown model', '/v1/chat/completions', { model: 'nope', messages: [{ role: 'user', content: 'x' }] }, 404],
    ['chat: engine error', '/v1/chat/completions', { model: 'open-model', messages: [{ role: 'user', content: 'x' }], max_tokens: 10_000_000 }, 400],
    ['completions: engine error', '/v1/completions', { model: 'open-model', prompt: 'x', max_tokens: 10_000_000 }, 400],
  ];
  for (const [name, path, body, status] of cases) {
    const r = await call(url, 'POST', path, body);
    errorConforms(t, r, status, name);
  }
  const ctx = await call(url, 'POST', '/v1/responses', cases[7]![2]);
  t.type(ctx.json.error.code, 'string', 'a relayed engine error: code a string');
});
