// The Responses API over real sockets: the official `openai` SDK against a
// router in front of simulated engines: create, stream (event order and
// sequence numbers), chains, branches, GET / DELETE / input_items, eviction,
// and every bad input.
import t from 'tap';
import OpenAI from 'openai';
import { startTestRouter } from '../support/router-util.js';

async function setup(t: Tap.Test, responses: Record<string, unknown> = {}, fleet: Record<string, unknown> = { timeScale: 0 }) {
  const r = await startTestRouter(t, { n: 2, fleet, extra: { responses } });
  const client = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'sk-test', maxRetries: 0 });
  return { ...r, client };
}

/** A raw POST returning status and parsed JSON. */
async function post(url: string, path: string, body: unknown): Promise<{ status: number; json: any; headers: Headers }> {
  const res = await fetch(url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await res.text();
  let json: any = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = text;
  }
  return { status: res.status, json, headers: res.headers };
}

t.test('create: a Response object with ids, output text and usage', async (t) => {
  const { client } = await setup(t);
  const r = await client.responses.create({ model: 'open-model', input: 'Tell me about routers.', max_output_tokens: 12, metadata: { run: 'a' }, user: 'u1' });
  t.match(r.id, /^resp_[0-9a-f]{48}$/);
  t.equal(r.object, 'response');
  t.equal(r.status, 'incomplete', 'max_output_tokens reached: incomplete');
  t.same(r.incomplete_details, { reason: 'max_output_tokens' });
  t.equal(r.output.length, 1);
  const item = r.output[0] as OpenAI.Responses.ResponseOutputMessage;
  t.equal(item.type, 'message');
  t.equal(item.role, 'assistant');
  t.match(item.id, /^msg_[0-9a-f]{48}$/);
  t.equal(item.content[0]!.type, 'output_text');
  t.ok(r.output_text.length > 0, 'SDK output_text helper sees the text');
  t.equal(r.usage!.output_tokens, 12);
  t.ok(r.usage!.input_tokens > 0);
  t.equal(r.usage!.total_tokens, r.usage!.input_tokens + 12);
  t.type(r.usage!.input_tokens_details.cached_tokens, 'number');
  t.same(r.metadata, { run: 'a' });
  t.equal(r.user, 'u1');
  t.equal(r.store, true);
  t.equal(r.previous_response_id, null);
  // without a bound the simulator stops on its own: completed
  const r2 = await client.responses.create({ model: 'open-model', input: [{ role: 'user', content: [{ type: 'input_text', text: 'hi' }] }] });
  t.ok(r2.status === 'completed' || r2.status === 'incomplete');
});

t.test('chain: the second turn carries the first turn as context, cached tokens grow, instructions are per request', async (t) => {
  const { client, fleet } = await setup(t);
  const long = 'The quick brown fox jumps over the lazy dog. '.repeat(60);
  const a = await client.responses.create({ model: 'open-model', input: long, instructions: 'Be brief.', max_output_tokens: 8 });
  const b = await client.responses.create({ model: 'open-model', input: 'And then?', previous_response_id: a.id, max_output_tokens: 8 });
  t.equal(b.previous_response_id, a.id);
  t.ok(b.usage!.input_tokens > a.usage!.input_tokens, `turn 2 prompt (${b.usage!.input_tokens}) holds turn 1 (${a.usage!.input_tokens})`);
  t.equal(b.instructions, null, 'instructions do not carry over');
  const c = await client.responses.create({ model: 'open-model', input: 'More.', previous_response_id: b.id, max_output_tokens: 8 });
  t.ok(c.usage!.input_tokens > b.usage!.input_tokens);
  // same endpoint for the whole chain (prefix scorer), so the engine's prefix cache hits
  t.ok(c.usage!.input_tokens_details.cached_tokens > 0, `cached tokens reported: ${c.usage!.input_tokens_details.cached_tokens}`);
  // the engine saw the rebuilt conversation: turn 1's input and output, then turn 2's
  const items = await client.responses.inputItems.list(c.id, { order: 'asc' });
  const data = items.data as any[];
  t.same(
    data.map((i) => i.role),
    ['user', 'assistant', 'user', 'assistant', 'user'],
    'input_items: earlier inputs and outputs, then this input',
  );
  t.equal(data[0].content[0].text, long);
  t.equal(data[1].content[0].text, (a.output[0] as any).content[0].text);
  t.equal(data[4].content[0].text, 'More.');
  t.ok(fleet);
});

t.test('branches: two continuations of one response are independent', async (t) => {
  const { client } = await setup(t);
  const root = await client.responses.create({ model: 'open-model', input: 'Root question', max_output_tokens: 4 });
  const [x, y] = await Promise.all([
    client.responses.create({ model: 'open-model', input: 'Branch X', previous_response_id: root.id, max_output_tokens: 4 }),
    client.responses.create({ model: 'open-model', input: 'Branch Y with more words', previous_response_id: root.id, max_output_tokens: 4 }),
  ]);
  t.not(x.id, y.id);
  const xi = (await client.responses.inputItems.list(x.id, { order: 'asc' })).data as any[];
  const yi = (await client.responses.inputItems.list(y.id, { order: 'asc' })).data as any[];
  t.equal(xi.length, 3);
  t.equal(yi.length, 3);
  t.equal(xi[0].id, yi[0].id, 'shared first input item');
  t.equal(xi[2].content[0].text, 'Branch X');
  t.equal(yi[2].content[0].text, 'Branch Y with more words');
  // continuing one branch does not see the other
  const x2 = await client.responses.create({ model: 'open-model', input: 'X again', previous_response_id: x.id, max_output_tokens: 4 });
  const x2i = (await client.responses.inputItems.list(x2.id, { order: 'asc' })).data as any[];
  t.notOk(x2i.some((i) => i.content[0].text === 'Branch Y with more words'));
});

t.test('streaming: the Responses event sequence with sequence numbers, then a stored, retrievable response', async (t) => {
  const { client } = await setup(t, {}, { timeScale: 0.01 });
  const stream = await client.responses.create({ model: 'open-model', input: 'Stream me a story.', max_output_tokens: 10, stream: true });
  const events: any[] = [];
  for await (const e of stream) events.push(e);
  const types = events.map((e) => e.type);
  t.same(types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
  const deltas = events.filter((e) => e.type === 'response.output_text.delta');
  t.equal(deltas.length, 10, 'one delta per engine token');
  t.same(types.slice(4 + deltas.length), [
    'response.output_text.done',
    'response.content_part.done',
    'response.output_item.done',
    'response.incomplete',
  ]);
  t.same(
    events.map((e) => e.sequence_number),
    events.map((_, i) => i),
    'sequence numbers 0, 1, 2, ... in order',
  );
  const text = deltas.map((d) => d.delta).join('');
  const done = events.find((e) => e.type === 'response.output_text.done');
  t.equal(done.text, text);
  const last = events[events.length - 1].response;
  t.equal(last.usage.output_tokens, 10, 'usage from the engine (stream_options.include_usage)');
  t.equal(events[0].response.status, 'in_progress');
  const got = await client.responses.retrieve(last.id);
  t.equal(got.output_text, text, 'GET returns the streamed response');
  // the SDK's stream helper accumulates the same
  const s2 = client.responses.stream({ model: 'open-model', input: 'again', previous_response_id: last.id });
  const final = await s2.finalResponse();
  t.ok(((final.output[0] as any).content[0].text as string).length > 0, 'the SDK stream helper accumulates the text');
  t.equal(final.previous_response_id, last.id);
  t.equal(final.status, 'completed');
});

t.test('GET, DELETE and input_items; a deleted response cannot be continued', async (t) => {
  const { client, url } = await setup(t);
  const a = await client.responses.create({ model: 'open-model', input: [{ role: 'developer', content: 'rules' }, { role: 'user', content: 'q1' }], max_output_tokens: 3 });
  const got = await client.responses.retrieve(a.id);
  t.same(got, a, 'GET returns the created object');
  const page = await client.responses.inputItems.list(a.id, { limit: 1 });
  t.equal(page.data.length, 1);
  t.equal((page.data[0] as any).content[0].text, 'q1', 'newest first by default');
  t.equal((page as any).has_more, true);
  const raw = await fetch(`${url}/v1/responses/${a.id}/input_items?limit=1&after=${page.data[0]!.id}`).then((r) => r.json());
  t.equal(raw.data[0].content[0].text, 'rules');
  t.equal(raw.has_more, false);
  const bad = await fetch(`${url}/v1/responses/${a.id}/input_items?limit=500`);
  t.equal(bad.status, 400);
  await client.responses.delete(a.id);
  await t.rejects(client.responses.retrieve(a.id), { status: 404 });
  const delAgain = await fetch(`${url}/v1/responses/${a.id}`, { method: 'DELETE' });
  t.equal(delAgain.status, 404);
  const cont = await post(url, '/v1/responses', { model: 'open-model', input: 'next', previous_response_id: a.id });
  t.equal(cont.status, 404);
  t.equal(cont.json.error.code, 'previous_response_not_found');
  t.equal(cont.json.error.param, 'previous_response_id');
});

t.test('store: false responses are answered but cannot be retrieved or continued', async (t) => {
  const { client, url } = await setup(t);
  const a = await client.responses.create({ model: 'open-model', input: 'ephemeral', store: false, max_output_tokens: 3 });
  t.equal(a.store, false);
  await t.rejects(client.responses.retrieve(a.id), { status: 404 });
  const cont = await post(url, '/v1/responses', { model: 'open-model', input: 'next', previous_response_id: a.id });
  t.equal(cont.status, 404);
  t.equal(cont.json.error.code, 'previous_response_not_found');
  t.match(cont.json.error.message, /store: false/);
  // the SDK surfaces the code
  await t.rejects(client.responses.create({ model: 'open-model', input: 'x', previous_response_id: a.id }), { status: 404, code: 'previous_response_not_found' });
});

t.test('eviction: the least recently used response goes first; its continuation is a clean 404, every other chain stays whole', async (t) => {
  const { client, url, router } = await setup(t, { maxResponses: 3 });
  const a = await client.responses.create({ model: 'open-model', input: 'a', max_output_tokens: 2 });
  const b = await client.responses.create({ model: 'open-model', input: 'b', previous_response_id: a.id, max_output_tokens: 2 });
  const c = await client.responses.create({ model: 'open-model', input: 'c', previous_response_id: b.id, max_output_tokens: 2 });
  await client.responses.retrieve(a.id); // a is now the most recently used; b is the least
  const d = await client.responses.create({ model: 'open-model', input: 'd', previous_response_id: c.id, max_output_tokens: 2 });
  t.equal(router.core.responses!.store!.size(), 3);
  const cont = await post(url, '/v1/responses', { model: 'open-model', input: 'x', previous_response_id: b.id });
  t.equal(cont.status, 404, 'continuing the evicted response: 404');
  t.equal(cont.json.error.code, 'previous_response_not_found');
  // d's chain runs through the evicted b: still whole, because each record holds its conversation
  const e = await client.responses.create({ model: 'open-model', input: 'e', previous_response_id: d.id, max_output_tokens: 2 });
  const items = (await client.responses.inputItems.list(e.id, { order: 'asc', limit: 100 })).data as any[];
  t.same(
    items.filter((i) => i.role === 'user').map((i) => i.content[0].text),
    ['a', 'b', 'c', 'd', 'e'],
  );
  // and by bytes
  const small = await setup(t, { maxBytes: 10_000 });
  const big = await small.client.responses.create({ model: 'open-model', input: 'y'.repeat(4000), max_output_tokens: 2 });
  const big2 = await small.client.responses.create({ model: 'open-model', input: 'z'.repeat(4000), max_output_tokens: 2 });
  await t.rejects(small.client.responses.retrieve(big.id), { status: 404 }, 'over maxBytes: the older one went');
  t.equal((await small.client.responses.retrieve(big2.id)).id, big2.id);
});

t.test('TTL: an expired response is a 404', async (t) => {
  const { client, url } = await setup(t, { ttlSeconds: 1 });
  const a = await client.responses.create({ model: 'open-model', input: 'soon gone', max_output_tokens: 2 });
  await new Promise((r) => setTimeout(r, 1100));
  const cont = await post(url, '/v1/responses', { model: 'open-model', input: 'x', previous_response_id: a.id });
  t.equal(cont.status, 404);
  t.equal(cont.json.error.code, 'previous_response_not_found');
});

t.test('bad input: 400 naming the field, 404, 413', async (t) => {
  const { url } = await setup(t, { maxInputBytes: 2000 });
  const cases: [string, unknown, number, string | null][] = [
    ['not JSON', '{"model":', 400, null],
    ['no model', { input: 'x' }, 400, 'model'],
    ['no input', { model: 'open-model' }, 400, 'input'],
    ['empty input list', { model: 'open-model', input: [] }, 400, 'input'],
    ['function call with arguments not JSON', { model: 'open-model', input: [{ role: 'user', content: 'a' }, { role: 'user', content: 'b' }, { type: 'function_call', call_id: 'c', name: 'f', arguments: '{oops' }] }, 400, 'input[2].arguments'],
    ['function call output answering no call', { model: 'open-model', input: [{ type: 'function_call_output', call_id: 'c', output: 'x' }] }, 400, 'input[0].call_id'],
    ['item reference', { model: 'open-model', input: [{ type: 'item_reference', id: 'msg_1' }] }, 400, 'input[0].type'],
    ['unknown input item', { model: 'open-model', input: [{ type: 'computer_call_output', call_id: 'c' }] }, 400, 'input[0].type'],
    ['image part', { model: 'open-model', input: [{ role: 'user', content: [{ type: 'input_text', text: 'see' }, { type: 'input_image', image_url: 'http://x/y.png' }] }] }, 400, 'input[0].content[1].type'],
    ['file part', { model: 'open-model', input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'f' }] }] }, 400, 'input[0].content[0].type'],
    ['built-in tool', { model: 'open-model', input: 'x', tools: [{ type: 'web_search' }] }, 400, 'tools[0].type'],
    ['tool schema with a bad type', { model: 'open-model', input: 'x', tools: [{ type: 'function', name: 'f', parameters: { type: 'object', properties: { a: { type: 'strng' } } } }] }, 400, 'tools[0].parameters.properties.a.type'],
    ['tool with a bad name', { model: 'open-model', input: 'x', tools: [{ type: 'function', name: 'a b' }] }, 400, 'tools[0].name'],
    ['tool_choice naming no tool', { model: 'open-model', input: 'x', tools: [{ type: 'function', name: 'f' }], tool_choice: { type: 'function', name: 'g' } }, 400, 'tool_choice.name'],
    ['tool_choice required without tools', { model: 'open-model', input: 'x', tool_choice: 'required' }, 400, 'tool_choice'],
    ['hosted tool_choice', { model: 'open-model', input: 'x', tool_choice: { type: 'file_search' } }, 400, 'tool_choice.type'],
    ['unknown field', { model: 'open-model', input: 'x', frobnicate: 1 }, 400, 'frobnicate'],
    ['bad reasoning effort', { model: 'open-model', input: 'x', reasoning: { effort: 'max' } }, 400, 'reasoning.effort'],
    ['verbosity', { model: 'open-model', input: 'x', text: { verbosity: 'low' } }, 400, 'text.verbosity'],
    ['service tier', { model: 'open-model', input: 'x', service_tier: 'flex' }, 400, 'service_tier'],
    ['include', { model: 'open-model', input: 'x', include: ['reasoning.encrypted_content'] }, 400, 'include[0]'],
    ['background', { model: 'open-model', input: 'x', background: true }, 400, 'background'],
    ['bad role', { model: 'open-model', input: [{ role: 'tool', content: 'x' }] }, 400, 'input[0].role'],
    ['bad temperature', { model: 'open-model', input: 'x', temperature: 3 }, 400, 'temperature'],
    ['bad max_output_tokens', { model: 'open-model', input: 'x', max_output_tokens: 0 }, 400, 'max_output_tokens'],
    ['bad store', { model: 'open-model', input: 'x', store: 'yes' }, 400, 'store'],
    ['json_schema format without a schema', { model: 'open-model', input: 'x', text: { format: { type: 'json_schema', name: 'n' } } }, 400, 'text.format.schema'],
    ['unknown text format', { model: 'open-model', input: 'x', text: { format: { type: 'grammar' } } }, 400, 'text.format.type'],
    ['unknown previous', { model: 'open-model', input: 'x', previous_response_id: 'resp_nope' }, 404, 'previous_response_id'],
    ['unknown model', { model: 'nope', input: 'x' }, 404, 'model'],
    ['oversized input', { model: 'open-model', input: 'x'.repeat(3000) }, 413, 'input'],
  ];
  for (const [name, body, status, param] of cases) {
    const r = await post(url, '/v1/responses', body);
    t.equal(r.status, status, `${name}: ${status}`);
    t.type(r.json?.error?.message, 'string', `${name}: OpenAI error shape`);
    if (param !== null) t.equal(r.json.error.param, param, `${name}: param ${param}`);
  }
  const unknown = await post(url, '/v1/responses', { model: 'open-model', input: 'x', previous_response_id: 'resp_nope' });
  t.equal(unknown.json.error.code, 'previous_response_not_found');
  // oversized through a chain: each turn small, the conversation too large
  let prev: string | null = null;
  let last = 0;
  for (let i = 0; i < 5; i++) {
    const r = await post(url, '/v1/responses', { model: 'open-model', input: 'w'.repeat(500), previous_response_id: prev, max_output_tokens: 2 });
    last = r.status;
    if (r.status !== 200) break;
    prev = r.json.id;
  }
  t.equal(last, 413, 'the rebuilt conversation is bounded too');
  // the router still serves
  const ok = await post(url, '/v1/responses', { model: 'open-model', input: 'fine', max_output_tokens: 2 });
  t.equal(ok.status, 200);
  const g = await fetch(`${url}/v1/responses`, { method: 'GET' });
  t.equal(g.status, 405, 'GET /v1/responses: 405');
});

t.test('engine errors come back in OpenAI shape; a stream that fails mid-way ends with response.failed', async (t) => {
  const { client, url } = await setup(t, {}, { timeScale: 0, failureRate: 1, failureKinds: ['500'] });
  const r = await post(url, '/v1/responses', { model: 'open-model', input: 'x' });
  t.ok(r.status >= 500, `status ${r.status}`);
  t.type(r.json.error.message, 'string');
  await t.rejects(client.responses.create({ model: 'open-model', input: 'x', stream: true }), { status: r.status });
  const mid = await setup(t, {}, { timeScale: 0.01, failureRate: 1, failureKinds: ['error-mid-stream'] });
  const stream = await mid.client.responses.create({ model: 'open-model', input: 'x', stream: true, max_output_tokens: 20 });
  const types: string[] = [];
  const seqs: number[] = [];
  for await (const e of stream) {
    types.push(e.type);
    seqs.push(e.sequence_number);
  }
  t.equal(types[0], 'response.created');
  t.equal(types[types.length - 1], 'response.failed', `ends failed: ${types.join(',')}`);
  t.same(seqs, seqs.map((_, i) => i));
});

/** Every event of a streamed turn through the SDK's iterator (it yields `error` and `response.failed`; neither throws). */
async function events(client: OpenAI, body: Record<string, unknown>): Promise<any[]> {
  const stream = await client.responses.create({ model: 'open-model', input: 'x', stream: true, max_output_tokens: 20, ...body } as any);
  const out: any[] = [];
  for await (const e of stream as any) out.push(e);
  return out;
}

t.test('upstream failure mid-stream: an error event, then response.failed (the last event), sequence numbers in order, counted as failed', async (t) => {
  for (const kind of ['error-mid-stream', 'reset-mid-stream']) {
    const { client, url } = await setup(t, {}, { timeScale: 0.01, failureRate: 1, failureKinds: [kind] });
    const evs = await events(client, {});
    const types = evs.map((e) => e.type);
    t.ok(types.includes('response.output_text.delta'), `${kind}: text was streamed before the failure (${types.join(',')})`);
    t.same(types.slice(-2), ['error', 'response.failed'], `${kind}: error, then response.failed last`);
    t.same(evs.map((e) => e.sequence_number), evs.map((_, i) => i), `${kind}: sequence numbers 0..n-1`);
    const err = evs[evs.length - 2];
    t.equal(err.code, 'server_error');
    t.type(err.message, 'string');
    t.ok(err.message.length > 0, `${kind}: the error says what happened: ${err.message}`);
    t.equal(err.param, null);
    const failed = evs[evs.length - 1].response;
    t.equal(failed.status, 'failed');
    t.same(failed.error, { code: 'server_error', message: err.message }, `${kind}: the same error on the failed response`);
    // a failed turn is not stored: it cannot be continued
    const cont = await post(url, '/v1/responses', { model: 'open-model', input: 'y', previous_response_id: failed.id });
    t.equal(cont.json.error.code, 'previous_response_not_found');
    const metrics = await (await fetch(`${url}/metrics`)).text();
    t.match(metrics, /switchyard_responses_total\{result="failed"\} 1\n/, `${kind}: counted as failed`);
  }
});

t.test('Responses metrics: created, continued, store operations and latency by store type, chain length, evictions', async (t) => {
  const { client, url } = await setup(t, { maxResponses: 2 });
  const r1 = await client.responses.create({ model: 'open-model', input: 'one', max_output_tokens: 2 });
  const r2 = await client.responses.create({ model: 'open-model', input: 'two', previous_response_id: r1.id, max_output_tokens: 2 });
  const r3 = await client.responses.create({ model: 'open-model', input: 'three', previous_response_id: r2.id, max_output_tokens: 2 }); // evicts r1
  await client.responses.create({ model: 'open-model', input: 'four', max_output_tokens: 2 }); // evicts r2
  await client.responses.retrieve(r3.id);
  const missing = await post(url, '/v1/responses', { model: 'open-model', input: 'x', previous_response_id: r1.id });
  t.equal(missing.status, 404);
  const m = await (await fetch(`${url}/metrics`)).text();
  t.match(m, /switchyard_responses_total\{result="created"\} 2\n/);
  t.match(m, /switchyard_responses_total\{result="continued"\} 2\n/);
  t.match(m, /switchyard_responses_total\{result="failed"\} 0\n/, 'a 404 for an evicted previous response is not a failed turn');
  t.match(m, /switchyard_responses_store_operations_total\{store="memory",op="put"\} 4\n/);
  t.match(m, /switchyard_responses_store_operations_total\{store="memory",op="get"\} 4\n/, 'two continuations, one retrieve, one miss');
  t.match(m, /switchyard_responses_store_errors_total\{store="memory",op="get"\} 0\n/);
  t.match(m, /switchyard_responses_store_seconds_count\{store="memory",op="put"\} 4\n/);
  t.match(m, /switchyard_responses_chain_messages_bucket\{le="2"\} 2\n/, 'two one-turn conversations (input + answer)');
  t.match(m, /switchyard_responses_chain_messages_bucket\{le="4"\} 3\n/);
  t.match(m, /switchyard_responses_chain_messages_bucket\{le="8"\} 4\n/);
  t.match(m, /switchyard_responses_evictions_total\{store="memory"\} 2\n/);
  t.match(m, /switchyard_responses_stored\{store="memory"\} 2\n/);
});

t.test('responses.enabled: false leaves /v1/responses a 404', async (t) => {
  const { url } = await setup(t, { enabled: false });
  const r = await post(url, '/v1/responses', { model: 'open-model', input: 'x' });
  t.equal(r.status, 404);
});
