// Tool calling through /v1/responses: the official openai SDK runs a five-turn
// tool loop (model → function_call → the client's function_call_output → ...,
// chained by previous_response_id), streamed and not, against the simulator
// and against a scripted raw engine (testkit/scripted-engine.ts), every
// Response and every event checked against OpenAI's shapes (testkit/openai-shapes.ts)
// and the stream's order rules; what the engine was sent (tools, tool_choice,
// the assistant's tool_calls and the tool messages with their tool_call_id)
// read back from the scripted engine. Then reasoning items, parallel calls,
// text.format, instructions as items, truncation, inline history, and an
// engine that answers malformed calls.
import t from 'tap';
import OpenAI from 'openai';
import { startTestRouter } from '../support/router-util.js';
import { startScriptedEngine, type ScriptedTurn } from '../../testkit/scripted-engine.js';
import { EngineModel } from '../../testkit/reference/engine-model.js';
import { check, checkStreamOrder, ERROR_BODY, INPUT_ITEM, list, RESPONSE, STREAM_EVENT } from '../../testkit/openai-shapes.js';

const tools: OpenAI.Responses.FunctionTool[] = [
  {
    type: 'function',
    name: 'get_weather',
    description: 'the weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city', 'days'] },
    strict: false,
  },
  { type: 'function', name: 'lookup', parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] }, strict: null as unknown as boolean },
];

async function simRouter(t: Tap.Test) {
  const r = await startTestRouter(t, { n: 2, fleet: { timeScale: 0 } });
  return { ...r, client: new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'sk-test', maxRetries: 0 }) };
}

async function scriptedRouter(t: Tap.Test, script: ScriptedTurn[] = []) {
  const eng = await startScriptedEngine('open-model', script);
  const r = await startTestRouter(t, { n: 1, pools: () => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 's0', url: eng.url }] }] });
  t.teardown(() => eng.close());
  return { ...r, eng, client: new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'sk-test', maxRetries: 0 }) };
}

function shapeOk(t: Tap.Test, shape: Parameters<typeof check>[0], v: unknown, what: string): void {
  // output_text is the SDK's own convenience property, not a field on the wire
  if (shape === RESPONSE && typeof v === 'object' && v !== null && 'output_text' in v) {
    const { output_text: _, ...wire } = v as Record<string, unknown>;
    v = wire;
  }
  const errs = check(shape, v);
  t.same(errs, [], `${what} conforms${errs.length ? ': ' + errs.slice(0, 5).join('; ') : ''}`);
}

/** Events of a streamed create, each checked against its shape. */
async function events(t: Tap.Test, stream: AsyncIterable<unknown>, what: string): Promise<Record<string, any>[]> {
  const evs: Record<string, any>[] = [];
  for await (const e of stream) evs.push(e as Record<string, any>);
  const bad = evs.flatMap((e, i) => check(STREAM_EVENT, e, `event[${i}]`));
  t.same(bad, [], `${what}: every event conforms${bad.length ? ': ' + bad.slice(0, 5).join('; ') : ''}`);
  const order = checkStreamOrder(evs);
  t.same(order, [], `${what}: events in the spec's order${order.length ? ': ' + order.join('; ') : ''}`);
  return evs;
}

/**
 * Five turns: four forced calls answered with function_call_output, then tool_choice none (text).
 * Returns the responses; checks each one and, streamed, each turn's event sequence.
 */
async function toolLoop(t: Tap.Test, client: OpenAI, stream: boolean, result: (turn: number) => string) {
  const out: OpenAI.Responses.Response[] = [];
  let prev: string | undefined;
  let input: OpenAI.Responses.ResponseInput | string = 'Plan a three-day trip to Paris; check the weather first.';
  for (let turn = 0; turn < 5; turn++) {
    const body = { model: 'open-model', input, tools, tool_choice: turn < 4 ? ('required' as const) : ('none' as const), previous_response_id: prev, max_output_tokens: 200 };
    let r: OpenAI.Responses.Response;
    if (stream) {
      const evs = await events(t, await client.responses.create({ ...body, stream: true }), `turn ${turn}`);
      const types = evs.map((e) => e.type);
      if (turn < 4) {
        const at = evs.findIndex((e) => e.type === 'response.output_item.added' && e.item.type === 'function_call');
        t.same(types.slice(at, at + 2), ['response.output_item.added', 'response.function_call_arguments.delta'], `turn ${turn}: opens the call`);
        t.same(types.slice(-4), ['response.function_call_arguments.delta', 'response.function_call_arguments.done', 'response.output_item.done', 'response.completed'], `turn ${turn}: closes it`);
        const added = evs[at]!;
        t.equal(added.item.type, 'function_call');
        t.equal(added.item.arguments, '', 'added with empty arguments');
        t.equal(added.item.status, 'in_progress');
        const deltas = evs.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
        const doneEv = evs.find((e) => e.type === 'response.function_call_arguments.done')!;
        t.equal(doneEv.arguments, deltas, 'the deltas add up to the arguments');
        t.equal(doneEv.name, added.item.name);
      } else {
        t.same(types.slice(2, 5), ['response.output_item.added', 'response.content_part.added', 'response.output_text.delta'], 'turn 4: text');
      }
      r = evs[evs.length - 1]!.response;
      t.equal(evs[0]!.response.id, r.id);
      t.notOk('usage' in evs[0]!.response, 'the in-progress snapshot leaves usage out (not null)');
    } else {
      r = await client.responses.create(body);
    }
    shapeOk(t, RESPONSE, r, `turn ${turn} response`);
    if (turn < 4) t.equal(r.status, 'completed');
    else t.ok(r.status === 'completed' || r.status === 'incomplete', 'the text turn ends');
    t.equal(r.previous_response_id ?? null, prev ?? null);
    t.same(r.tool_choice, body.tool_choice, 'tool_choice echoed as asked');
    t.same(
      r.tools.map((x: any) => x.name),
      ['get_weather', 'lookup'],
    );
    t.equal((r.tools[0] as any).strict, false);
    if (turn < 4) {
      const calls = r.output.filter((o) => o.type === 'function_call') as OpenAI.Responses.ResponseFunctionToolCall[];
      t.equal(calls.length, 1, `turn ${turn}: one function_call item`);
      const c = calls[0]!;
      t.match(c.id, /^fc_[0-9a-f]{48}$/);
      t.ok(c.call_id.length > 0);
      t.ok(['get_weather', 'lookup'].includes(c.name));
      t.type(JSON.parse(c.arguments), 'object', 'arguments are a JSON object');
      t.equal(c.status, 'completed');
      input = [{ type: 'function_call_output', call_id: c.call_id, output: result(turn) }];
    } else {
      t.equal(r.output.filter((o) => o.type === 'function_call').length, 0, 'tool_choice none: no call');
      t.ok(r.output.some((o: any) => o.type === 'message' && o.content[0]?.text.length > 0), 'the final answer is text');
    }
    out.push(r);
    prev = r.id;
  }
  // the chain as the store keeps it: input_items of the last response lists every turn's items
  const items = await client.responses.inputItems.list(out[4]!.id, { order: 'asc', limit: 100 });
  shapeOk(t, list(INPUT_ITEM), { object: 'list', data: items.data, first_id: items.data[0]?.id ?? null, last_id: items.data.at(-1)?.id ?? null, has_more: false }, 'input_items');
  const data = items.data as any[];
  const expected = ['message'];
  for (let k = 0; k < 4; k++) expected.push(...out[k]!.output.map((o) => o.type), 'function_call_output');
  t.same(
    data.map((i) => i.type),
    expected,
    'input_items: the user message, then each turn\'s output items and the call\'s output',
  );
  const calls = data.filter((i) => i.type === 'function_call');
  const outputs = data.filter((i) => i.type === 'function_call_output');
  t.same(
    data.filter((i) => i.type === 'message' && i.role === 'assistant').map((i) => i.id),
    out.slice(0, 4).flatMap((r) => r.output.filter((o) => o.type === 'message').map((o) => o.id)),
    'assistant text items keep their ids',
  );
  for (let k = 0; k < 4; k++) {
    const call = calls[k];
    const res = outputs[k];
    const orig = out[k]!.output.find((o) => o.type === 'function_call') as OpenAI.Responses.ResponseFunctionToolCall;
    t.equal(call.id, orig.id, `call ${k}: the output item's id`);
    t.equal(call.call_id, orig.call_id);
    t.equal(call.arguments, orig.arguments);
    t.equal(res.call_id, orig.call_id, `output ${k} answers call ${k}`);
    t.equal(res.output, result(k));
  }
  // descending pages of 3 walk the same list backwards
  const page = await client.responses.inputItems.list(out[4]!.id, { limit: 3 });
  t.same(
    (page.data as any[]).map((i) => i.id),
    data.slice(-3).reverse().map((i) => i.id),
  );
  const again = await client.responses.retrieve(out[3]!.id);
  t.same(again.output, out[3]!.output, 'GET returns the stored output');
  return out;
}

const result = (turn: number) => JSON.stringify({ turn, temperature_c: 18 + turn });

for (const stream of [false, true]) {
  t.test(`the openai SDK runs a five-turn tool loop against the simulator (${stream ? 'streamed' : 'not streamed'})`, async (t) => {
    const { client } = await simRouter(t);
    await toolLoop(t, client, stream, result);
  });

  t.test(`the openai SDK runs a five-turn tool loop against a scripted engine (${stream ? 'streamed' : 'not streamed'})`, async (t) => {
    const script: ScriptedTurn[] = [
      { toolCalls: [{ id: 'call_a1', name: 'get_weather', arguments: '{"city":"Paris","days":3}' }] },
      { toolCalls: [{ name: 'lookup', arguments: '{"q":"Louvre opening hours"}' }] },
      { content: 'Checking one more thing.', toolCalls: [{ id: 'call_a3', name: 'lookup', arguments: '{"q":"metro pass"}' }] },
      { toolCalls: [{ id: 'call_a4', name: 'get_weather', arguments: '{"city":"Versailles","days":1}' }], fragments: 7 },
      { content: 'Day 1: Louvre. Day 2: Versailles. Day 3: Montmartre.' },
    ];
    const { client, eng } = await scriptedRouter(t, script);
    const out = await toolLoop(t, client, stream, result);
    t.equal(eng.bodies.length, 5, 'five chat completions');
    const b0 = eng.bodies[0]!;
    t.same(
      b0.tools,
      [
        { type: 'function', function: { name: 'get_weather', description: 'the weather in a city', parameters: tools[0]!.parameters, strict: false } },
        { type: 'function', function: { name: 'lookup', parameters: tools[1]!.parameters } },
      ],
      'tools in chat form',
    );
    t.equal(b0.tool_choice, 'required');
    t.equal(eng.bodies[4]!.tool_choice, 'none');
    t.equal(out[0]!.output.find((o) => o.type === 'function_call')!.call_id, 'call_a1', "the engine's call id is the call_id");
    t.same(
      out[2]!.output.map((o) => o.type),
      ['message', 'function_call'],
      'text and a call in one turn: two items',
    );
    for (let k = 1; k < 5; k++) {
      const msgs = eng.bodies[k]!.messages as any[];
      t.equal(msgs.length, 1 + 2 * k, `turn ${k}: the whole chain was sent`);
      const last = msgs[msgs.length - 1];
      const asst = msgs[msgs.length - 2];
      const call = out[k - 1]!.output.find((o) => o.type === 'function_call') as OpenAI.Responses.ResponseFunctionToolCall;
      t.equal(last.role, 'tool');
      t.equal(last.tool_call_id, call.call_id, `turn ${k}: the tool message answers the call`);
      t.equal(last.content, result(k - 1));
      t.equal(asst.role, 'assistant');
      t.equal(asst.tool_calls[0].id, call.call_id);
      t.equal(asst.tool_calls[0].function.name, call.name);
      t.equal(asst.tool_calls[0].function.arguments, call.arguments);
    }
    t.equal((eng.bodies[3]!.messages as any[])[5].content, 'Checking one more thing.', "the assistant's text is kept beside its call");
  });
}

t.test('the tool loop on the reference engine model (the agent benchmark\'s second engine): its prefix cache hits grow turn by turn', async (t) => {
  const engines = [new EngineModel({ port: 0, timeScale: 0, blockChars: 64 }), new EngineModel({ port: 0, timeScale: 0, blockChars: 64 })];
  const urls = await Promise.all(engines.map((e) => e.listen()));
  t.teardown(() => Promise.all(engines.map((e) => e.close())));
  const r = await startTestRouter(t, { n: 1, pools: () => [{ name: 'p', models: ['open-model'], endpoints: urls.map((url, i) => ({ name: `m${i}`, url })) }] });
  const client = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'sk-test', maxRetries: 0 });
  for (const stream of [false, true]) {
    const out = await toolLoop(t, client, stream, result);
    const cached = out.map((x) => x.usage!.input_tokens_details.cached_tokens);
    t.ok(cached[4]! > cached[2]! && cached[2]! > 0, `cached tokens grow along the chain (${cached.join(', ')}): the session stays on one engine`);
  }
});

t.test('reasoning, text and two parallel calls in one streamed turn: four items opened and closed in order', async (t) => {
  const turn: ScriptedTurn = {
    reasoning: 'The user wants weather for two cities, so two calls.',
    content: 'Looking both up.',
    toolCalls: [
      { id: 'call_p1', name: 'get_weather', arguments: '{"city":"Paris","days":2}' },
      { id: 'call_p2', name: 'get_weather', arguments: '{"city":"Lyon","days":2}' },
    ],
  };
  const { client, eng } = await scriptedRouter(t, [turn, turn, turn]);
  const evs = await events(t, await client.responses.create({ model: 'open-model', input: 'Weather in Paris and Lyon?', tools, reasoning: { effort: 'low' }, stream: true }), 'parallel');
  const added = evs.filter((e) => e.type === 'response.output_item.added').map((e) => e.item.type);
  t.same(added, ['reasoning', 'message', 'function_call', 'function_call']);
  t.ok(evs.some((e) => e.type === 'response.reasoning_text.delta'));
  const r = evs.at(-1)!.response as OpenAI.Responses.Response;
  t.same((r.output[0] as any).content, [{ type: 'reasoning_text', text: turn.reasoning }], 'the reasoning item holds the reasoning text');
  t.same((r.output[0] as any).summary, []);
  t.same(r.reasoning, { effort: 'low', summary: null }, 'reasoning echoed');
  t.equal(eng.bodies[0]!.reasoning_effort, 'low', 'effort forwarded');
  // the next turn answers both calls; the engine gets one assistant message with both, then two tool messages
  const next = await client.responses.create({
    model: 'open-model',
    previous_response_id: r.id,
    tools,
    input: [
      { type: 'function_call_output', call_id: 'call_p1', output: 'sunny' },
      { type: 'function_call_output', call_id: 'call_p2', output: 'rain' },
    ],
  });
  shapeOk(t, RESPONSE, next, 'second turn');
  const msgs = eng.bodies[1]!.messages as any[];
  t.same(
    msgs.map((m) => m.role),
    ['user', 'assistant', 'tool', 'tool'],
  );
  t.equal(msgs[1].reasoning_content, turn.reasoning, 'the reasoning goes back with its turn');
  t.same(
    msgs[1].tool_calls.map((c: any) => c.id),
    ['call_p1', 'call_p2'],
  );
  const items = (await client.responses.inputItems.list(next.id, { order: 'asc' })).data as any[];
  t.same(
    items.map((i) => i.type),
    ['message', 'reasoning', 'message', 'function_call', 'function_call', 'function_call_output', 'function_call_output'],
  );
  // parallel_tool_calls false: the engine is told, and only the first call is kept
  const one = await client.responses.create({ model: 'open-model', input: 'Weather?', tools, parallel_tool_calls: false });
  t.equal(eng.bodies[2]!.parallel_tool_calls, false);
  t.equal(one.parallel_tool_calls, false, 'echoed false');
  t.equal(one.output.filter((o) => o.type === 'function_call').length, 1);
});

t.test('text.format, instructions as items, developer role, prompt_cache_key and the other echoed fields', async (t) => {
  const { client, eng } = await scriptedRouter(t, [{ content: '{"a":1}' }, { content: '{}' }]);
  const schema = { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] };
  const r = await client.responses.create({
    model: 'open-model',
    instructions: 'Answer in JSON.',
    input: [
      { role: 'developer', content: 'Be terse.' },
      { role: 'user', content: 'Give me a.' },
    ],
    text: { format: { type: 'json_schema', name: 'thing', schema, strict: true } },
    prompt_cache_key: 'agent-7',
    safety_identifier: 'user-hash-1',
    service_tier: 'auto',
    max_tool_calls: 3,
  } as any);
  shapeOk(t, RESPONSE, r, 'response');
  t.same(eng.bodies[0]!.response_format, { type: 'json_schema', json_schema: { name: 'thing', schema, strict: true } });
  t.same(
    (eng.bodies[0]!.messages as any[]).map((m) => m.role),
    ['system', 'system', 'user'],
    'instructions and the developer message go to the engine as system',
  );
  t.same(r.text, { format: { type: 'json_schema', name: 'thing', schema, strict: true }, verbosity: 'medium' });
  t.equal(r.prompt_cache_key, 'agent-7');
  t.equal(r.safety_identifier, 'user-hash-1');
  t.equal((r as any).max_tool_calls, 3);
  t.notOk('user' in r, 'user left out when unset');
  const items = (await client.responses.inputItems.list(r.id, { order: 'asc' })).data as any[];
  t.same(
    items.map((i) => i.role),
    ['developer', 'user'],
    'input_items keep the developer role',
  );
  const r2 = await client.responses.create({
    model: 'open-model',
    instructions: [{ role: 'system', content: 'From items.' }] as any,
    input: 'x',
    text: { format: { type: 'json_object' } },
  });
  t.same(eng.bodies[1]!.response_format, { type: 'json_object' });
  t.same((eng.bodies[1]!.messages as any[])[0], { role: 'system', content: 'From items.' });
  t.same(r2.instructions, [{ role: 'system', content: 'From items.' }], 'instructions echoed as given');
});

t.test('store: false with the whole history inline: function_call and function_call_output items become the chat turn', async (t) => {
  const { client, eng } = await scriptedRouter(t, [{ content: 'It is sunny.' }]);
  const r = await client.responses.create({
    model: 'open-model',
    store: false,
    tools,
    input: [
      { role: 'user', content: 'Weather in Paris?' },
      { type: 'function_call', id: 'fc_client1', call_id: 'call_x', name: 'get_weather', arguments: '{"city":"Paris","days":1}' },
      { type: 'function_call_output', call_id: 'call_x', output: '{"sky":"clear"}' },
    ],
  });
  t.equal(r.output_text, 'It is sunny.');
  t.same(eng.bodies[0]!.messages, [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_x', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris","days":1}' } }] },
    { role: 'tool', content: '{"sky":"clear"}', tool_call_id: 'call_x' },
  ]);
});

t.test('a function_call_output answering no call of the chain: 400 naming its call_id', async (t) => {
  const { client, url } = await scriptedRouter(t, [{ toolCalls: [{ id: 'call_real', name: 'lookup', arguments: '{"q":"x"}' }] }]);
  const r = await client.responses.create({ model: 'open-model', input: 'x', tools });
  const res = await fetch(`${url}/v1/responses`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'open-model', previous_response_id: r.id, input: [{ type: 'function_call_output', call_id: 'call_fake', output: 'x' }] }),
  });
  t.equal(res.status, 400);
  const j = await res.json();
  shapeOk(t, ERROR_BODY, j, 'error');
  t.equal(j.error.param, 'input[0].call_id');
  t.match(j.error.message, /call_fake/);
});

t.test('an engine that answers malformed calls: 502 (JSON) or error + response.failed keeping the streamed items', async (t) => {
  const bad: ScriptedTurn = { content: 'Let me check.', toolCalls: [{ name: 'get_weather', arguments: '{"city": "Par' }] };
  const undeclared: ScriptedTurn = { toolCalls: [{ name: 'rm_rf', arguments: '{}' }] };
  const { client, url } = await scriptedRouter(t, [bad, bad, undeclared]);
  const res = await fetch(`${url}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'open-model', input: 'x', tools }) });
  t.equal(res.status, 502);
  const j = await res.json();
  shapeOk(t, ERROR_BODY, j, 'error');
  t.match(j.error.message, /not JSON/);
  t.equal(j.error.type, 'server_error');
  const evs = await events(t, await client.responses.create({ model: 'open-model', input: 'x', tools, stream: true }), 'malformed stream');
  const types = evs.map((e) => e.type);
  t.same(types.slice(-2), ['error', 'response.failed']);
  const failed = evs.at(-1)!.response;
  t.equal(failed.status, 'failed');
  t.same(
    failed.output.map((o: any) => [o.type, o.status]),
    [
      ['message', 'completed'],
      ['function_call', 'incomplete'],
    ],
    'the failed response keeps what was streamed',
  );
  t.equal(failed.output[0].content[0].text, 'Let me check.');
  const res3 = await fetch(`${url}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'open-model', input: 'x', tools }) });
  t.equal(res3.status, 502);
  t.match((await res3.json()).error.message, /rm_rf/, 'a call to an undeclared function');
});

t.test('a stream that fails after text: response.failed carries the partial text', async (t) => {
  const { client } = await scriptedRouter(t, [{ content: 'Partial answer here', streamError: 'engine died' }]);
  const evs = await events(t, await client.responses.create({ model: 'open-model', input: 'x', stream: true }), 'failed stream');
  const failed = evs.at(-1)!;
  t.equal(failed.type, 'response.failed');
  t.equal(failed.response.output[0].content[0].text, 'Partial answer here');
  t.equal(failed.response.error.message, 'engine died');
});

t.test('truncation: auto drops the oldest turns when the engine says the context is full; disabled answers its error', async (t) => {
  const ctx = (n: number) => ({
    status: 400,
    body: { error: { message: `This model's maximum context length is 100 tokens. However, your request has ${n} input tokens. Please reduce the length of the input messages.`, type: 'BadRequestError', param: null, code: 400 } },
  });
  const { client, eng, url } = await scriptedRouter(t, [{ content: 'a'.repeat(200) }, { content: 'b'.repeat(200) }, { error: ctx(180) }, { content: 'fits now' }, { error: ctx(180) }]);
  const a = await client.responses.create({ model: 'open-model', input: 'q'.repeat(200) });
  const b = await client.responses.create({ model: 'open-model', input: 'r'.repeat(200), previous_response_id: a.id });
  const c = await client.responses.create({ model: 'open-model', input: 'last question', previous_response_id: b.id, truncation: 'auto' });
  t.equal(c.output_text, 'fits now');
  t.equal(c.truncation, 'auto');
  const sent = eng.bodies[3]!.messages as any[];
  t.ok(sent.length < (eng.bodies[2]!.messages as any[]).length, `fewer messages resent (${sent.length} < ${(eng.bodies[2]!.messages as any[]).length})`);
  t.same(sent.at(-1), { role: 'user', content: 'last question' }, "this turn's input is kept");
  t.not(sent[0].role, 'tool');
  const items = (await client.responses.inputItems.list(c.id, { order: 'asc' })).data as any[];
  t.equal(items.length, sent.length, 'the stored chain is what was sent');
  const d = await fetch(`${url}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'open-model', input: 'again', previous_response_id: b.id }) });
  t.equal(d.status, 400, 'disabled: the context error');
  const j = await d.json();
  shapeOk(t, ERROR_BODY, j, 'context error');
  t.match(j.error.message, /maximum context length/);
  t.equal(j.error.code, 'context_length_exceeded');
  // an engine that answers the context error whatever it is sent: a bounded number of resends, then its error
  let chain = b.id;
  for (let i = 0; i < 8; i++) {
    eng.push({ content: 'x'.repeat(100) });
    chain = (await client.responses.create({ model: 'open-model', input: `turn ${i} ` + 'y'.repeat(100), previous_response_id: chain })).id;
  }
  eng.push(...Array.from({ length: 20 }, () => ({ error: ctx(105) })));
  const before = eng.bodies.length;
  const e = await fetch(`${url}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'open-model', input: 'q', previous_response_id: chain, truncation: 'auto' }) });
  t.equal(e.status, 400, 'the error stands after the resends');
  t.equal(eng.bodies.length - before, 5, 'the first try and at most four resends');
});
