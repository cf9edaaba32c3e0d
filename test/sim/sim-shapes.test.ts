// Response shapes of every simulator endpoint, stream and non-stream, errors,
// request ids, health, models, metrics dialects, and the tokenizer contract.
import t from 'tap';
import { startEngine, startFleet, countTokens, renderChat } from '../../src/sim/index.js';
import { get, metric, parseProm, post, scrape, send, sseData } from '../support/sim-util.js';

t.test('tokenizer: ceil(utf8 bytes / 4), token ids count one each, fixed chat template', async (t) => {
  t.equal(countTokens(''), 0);
  t.equal(countTokens('abcd'), 1);
  t.equal(countTokens('abcde'), 2);
  t.equal(countTokens('é'), 1); // 2 bytes
  t.equal(countTokens('éé€'), 2); // 2+2+3 = 7 bytes
  t.equal(countTokens('😀😀'), 2); // 8 bytes
  t.equal(countTokens(new Uint8Array(9)), 3);
  t.equal(countTokens([1, 2, 3]), 3);
  const rendered = renderChat([
    { role: 'system', content: 'be brief' },
    { role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] },
  ]);
  t.equal(rendered, '<|system|>\nbe brief\n<|user|>\na\nb\n<|assistant|>\n');
});

t.test('completions and chat, non-stream and stream', async (t) => {
  const e = await startEngine({ timeScale: 0, models: ['m1', 'm1-alias'] });
  t.teardown(() => e.close());
  const prompt = 'The quick brown fox jumps over the lazy dog. '.repeat(3); // 135 bytes
  const pTok = countTokens(prompt);
  t.equal(pTok, 34);

  const c = await post(e.url, '/v1/completions', { model: 'm1', prompt, max_tokens: 7 }, { 'x-request-id': 'req-1' });
  t.equal(c.status, 200);
  t.match(c.headers['content-type'], /application\/json/);
  t.equal(c.headers['x-request-id'], 'req-1');
  const cj = JSON.parse(c.body);
  t.equal(cj.id, 'cmpl-req-1');
  t.equal(cj.object, 'text_completion');
  t.equal(cj.model, 'm1');
  t.type(cj.created, 'number');
  t.equal(cj.choices.length, 1);
  t.equal(cj.choices[0].index, 0);
  t.equal(cj.choices[0].finish_reason, 'length');
  t.equal(countTokens(cj.choices[0].text), 7, 'completion text has exactly completion_tokens tokens');
  t.same(cj.usage, { prompt_tokens: pTok, total_tokens: pTok + 7, completion_tokens: 7, prompt_tokens_details: { cached_tokens: 0 } });

  // Deterministic: the same prompt gives the same text; a different seed changes it.
  const c2 = JSON.parse((await post(e.url, '/v1/completions', { model: 'm1-alias', prompt, max_tokens: 7 })).body);
  t.equal(c2.choices[0].text, cj.choices[0].text);
  t.equal(c2.model, 'm1-alias');
  t.not(c2.id, cj.id);
  const c3 = JSON.parse((await post(e.url, '/v1/completions', { model: 'm1', prompt, max_tokens: 7, seed: 42 })).body);
  t.not(c3.choices[0].text, cj.choices[0].text);

  // Token-id prompt and prompt as a one-element list.
  const ids = JSON.parse((await post(e.url, '/v1/completions', { model: 'm1', prompt: [1, 2, 3, 4, 5], max_tokens: 2 })).body);
  t.equal(ids.usage.prompt_tokens, 5);
  const list = JSON.parse((await post(e.url, '/v1/completions', { model: 'm1', prompt: [prompt], max_tokens: 2 })).body);
  t.equal(list.usage.prompt_tokens, pTok);

  // No max_tokens: defaultMaxTokens with finish_reason stop; missing model: the first served one.
  const dflt = JSON.parse((await post(e.url, '/v1/completions', { prompt: 'x' })).body);
  t.equal(dflt.usage.completion_tokens, 16);
  t.equal(dflt.choices[0].finish_reason, 'stop');
  t.equal(dflt.model, 'm1');

  const messages = [{ role: 'user', content: 'hello there' }];
  const chatTok = countTokens(renderChat(messages));
  const ch = await post(e.url, '/v1/chat/completions', { model: 'm1', messages, max_completion_tokens: 5, max_tokens: 99 });
  t.equal(ch.status, 200);
  const chj = JSON.parse(ch.body);
  t.match(chj.id, /^chatcmpl-/);
  t.equal(chj.object, 'chat.completion');
  t.equal(chj.choices[0].message.role, 'assistant');
  t.equal(countTokens(chj.choices[0].message.content), 5, 'max_completion_tokens wins over max_tokens');
  t.equal(chj.choices[0].finish_reason, 'length');
  t.equal(chj.usage.prompt_tokens, chatTok);
  t.equal(chj.usage.completion_tokens, 5);
  t.equal(chj.usage.total_tokens, chatTok + 5);

  // Chat stream with usage.
  const s = await post(e.url, '/v1/chat/completions', { model: 'm1', messages, max_tokens: 4, stream: true, stream_options: { include_usage: true } }, { 'x-request-id': 'sr' });
  t.equal(s.status, 200);
  t.match(s.headers['content-type'], /^text\/event-stream/);
  t.equal(s.headers['x-request-id'], 'sr');
  t.ok(s.body.endsWith('data: [DONE]\n\n'));
  const ev = sseData(s.body);
  t.equal(ev.at(-1), '[DONE]');
  const chunks = ev.slice(0, -1).map((x) => JSON.parse(x));
  t.equal(chunks.length, 1 + 4 + 1, 'role chunk, 4 token chunks, usage chunk');
  for (const ch of chunks) {
    t.equal(ch.id, 'chatcmpl-sr');
    t.equal(ch.object, 'chat.completion.chunk');
    t.equal(ch.model, 'm1');
  }
  t.same(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
  const text = chunks.slice(1, 5).map((c) => c.choices[0].delta.content).join('');
  t.equal(countTokens(text), 4);
  t.same(chunks.slice(1, 4).map((c) => c.choices[0].finish_reason), [null, null, null]);
  t.equal(chunks[4].choices[0].finish_reason, 'length');
  t.same(chunks[5].choices, []);
  t.same(chunks[5].usage, { prompt_tokens: chatTok, total_tokens: chatTok + 4, completion_tokens: 4, prompt_tokens_details: { cached_tokens: 0 } });
  // The streamed text equals the non-streamed text of the same request.
  const ns = JSON.parse((await post(e.url, '/v1/chat/completions', { model: 'm1', messages, max_tokens: 4 })).body);
  t.equal(text, ns.choices[0].message.content);

  // Completions stream without usage: no usage chunk.
  const cs = await post(e.url, '/v1/completions', { model: 'm1', prompt, max_tokens: 3, stream: true });
  const cev = sseData(cs.body);
  t.equal(cev.length, 4);
  const cch = cev.slice(0, 3).map((x) => JSON.parse(x));
  t.equal(cch[0].object, 'text_completion');
  t.equal(cch.map((c) => c.choices[0].text).join(''), words3(cj.choices[0].text));
  t.equal(cch[2].choices[0].finish_reason, 'length');
  t.notOk(cch.some((c) => 'usage' in c));
});

function words3(text: string): string {
  return text.slice(0, 12);
}

t.test('errors have the OpenAI shape and the right status', async (t) => {
  const e = await startEngine({ timeScale: 0, maxModelLen: 100 });
  t.teardown(() => e.close());
  const cases: [string, unknown, number, string | null, RegExp][] = [
    ['/v1/completions', '{not json', 400, null, /Invalid JSON/],
    ['/v1/completions', [], 400, null, /JSON object/],
    ['/v1/completions', { model: 'open-model' }, 400, 'prompt', /prompt/],
    ['/v1/completions', { model: 'nope', prompt: 'x' }, 404, 'model', /does not exist/],
    ['/v1/completions', { model: 'open-model', prompt: 'x'.repeat(404) }, 400, 'prompt', /maximum context length is 100/],
    ['/v1/completions', { model: 'open-model', prompt: 'x'.repeat(40), max_tokens: 95 }, 400, 'prompt', /you requested 105 tokens/],
    ['/v1/completions', { model: 'open-model', prompt: 'x', max_tokens: 0 }, 400, 'max_tokens', /max_tokens/],
    ['/v1/completions', { model: 'open-model', prompt: 'x', max_tokens: 'a' }, 400, 'max_tokens', /integer/],
    ['/v1/completions', { model: 'open-model', prompt: 'x', stream: 'yes' }, 400, 'stream', /boolean/],
    ['/v1/completions', { model: 'open-model', prompt: 'x', stream_options: { include_usage: true } }, 400, 'stream_options', /stream=True/],
    ['/v1/completions', { model: 'open-model', prompt: ['a', 'b'] }, 400, 'prompt', /one prompt/],
    ['/v1/completions', { model: 'open-model', prompt: '' }, 400, 'prompt', /empty/],
    ['/v1/completions', { model: 'open-model', prompt: 'x', n: 0 }, 400, 'n', /'n'/],
    ['/v1/chat/completions', { model: 'open-model' }, 400, 'messages', /messages/],
    ['/v1/chat/completions', { model: 'open-model', messages: [] }, 400, 'messages', /non-empty/],
    ['/v1/chat/completions', { model: 'open-model', messages: [{ content: 'x' }] }, 400, 'messages', /role/],
    ['/v1/chat/completions', { model: 'open-model', messages: [{ role: 'user', content: 5 }] }, 400, 'messages', /content/],
    ['/v1/chat/completions', { model: 7, messages: [{ role: 'user', content: 'x' }] }, 400, 'model', /model/],
  ];
  for (const [path, body, status, param, msg] of cases) {
    const r = await post(e.url, path, body, { 'x-request-id': 'bad-1' });
    t.equal(r.status, status, `${path} ${JSON.stringify(body).slice(0, 60)} → ${status}`);
    t.equal(r.headers['x-request-id'], 'bad-1');
    const j = JSON.parse(r.body);
    t.same(Object.keys(j.error).sort(), ['code', 'message', 'param', 'type']);
    t.equal(j.error.code, status);
    t.equal(j.error.param, param);
    t.match(j.error.message, msg);
    t.equal(j.error.type, status === 404 ? 'NotFoundError' : 'BadRequestError');
  }
  const big = await startEngine({ timeScale: 0, maxBodyBytes: 1000 });
  t.teardown(() => big.close());
  const r = await post(big.url, '/v1/completions', { prompt: 'x'.repeat(5000) });
  t.equal(r.status, 413);
  t.equal(JSON.parse(r.body).error.code, 413);
  const nf = await get(e.url, '/v2/nothing');
  t.equal(nf.status, 404);
  t.equal(JSON.parse(nf.body).error.code, 404);
  const na = await get(e.url, '/v1/completions');
  t.equal(na.status, 405);
  // The engine still serves after all that.
  t.equal((await post(e.url, '/v1/completions', { prompt: 'ok', max_tokens: 1 })).status, 200);
});

t.test('/tokenize counts like countTokens', async (t) => {
  const e = await startEngine({ timeScale: 0, maxModelLen: 999 });
  t.teardown(() => e.close());
  const r = JSON.parse((await post(e.url, '/tokenize', { model: 'open-model', prompt: 'abcdefghi' })).body);
  t.same(r, { count: 3, max_model_len: 999, tokens: [0x64636261, 0x68676665, 0x69], token_strs: null });
  const messages = [{ role: 'user', content: 'héllo wörld' }];
  const c = JSON.parse((await post(e.url, '/tokenize', { messages })).body);
  t.equal(c.count, countTokens(renderChat(messages)));
  t.equal(JSON.parse((await post(e.url, '/tokenize', { prompt: [5, 6] })).body).count, 2);
  t.equal((await post(e.url, '/tokenize', { prompt: 5 })).status, 400);
  t.equal((await post(e.url, '/tokenize', { model: 'x', prompt: 'a' })).status, 404);
});

t.test('health, models, version, setHealthy', async (t) => {
  const e = await startEngine({ timeScale: 0, models: ['a', 'b'], revision: 'rev-7', role: 'decode', maxModelLen: 4096 });
  t.teardown(() => e.close());
  const h = await get(e.url, '/health');
  t.equal(h.status, 200);
  t.equal(h.body, '');
  e.setHealthy(false);
  t.equal((await get(e.url, '/health')).status, 503);
  e.setHealthy(true);
  t.equal((await get(e.url, '/health')).status, 200);
  const m = JSON.parse((await get(e.url, '/v1/models')).body);
  t.equal(m.object, 'list');
  t.same(m.data.map((d: { id: string }) => d.id), ['a', 'b']);
  t.equal(m.data[0].object, 'model');
  t.equal(m.data[0].max_model_len, 4096);
  const v = JSON.parse((await get(e.url, '/version')).body);
  t.same(v, { version: 'rev-7', engine: 'vllm', role: 'decode' });
  const ex = await scrape(e.url);
  t.equal(metric(ex, 'switchyard_sim_info', { revision: 'rev-7', role: 'decode', model_name: 'a' }), 1);
});

t.test('metrics: vLLM names with model_name, parsed by the Prometheus parser', async (t) => {
  const e = await startEngine({ timeScale: 0, models: ['llama'], kvCacheBlocks: 1234, blockSize: 32 });
  t.teardown(() => e.close());
  const prompt = 'p'.repeat(1000);
  await post(e.url, '/v1/completions', { prompt, max_tokens: 3 });
  await post(e.url, '/v1/completions', { prompt, max_tokens: 3 });
  const r = await get(e.url, '/metrics');
  t.match(r.headers['content-type'], /^text\/plain; version=0\.0\.4/);
  const ex = parseProm(r.body);
  for (const s of ex.samples) {
    t.equal(s.labels.model_name, 'llama', `${s.name} carries model_name`);
  }
  const L = { model_name: 'llama' };
  t.equal(metric(ex, 'vllm:num_requests_running', L), 0);
  t.equal(metric(ex, 'vllm:num_requests_waiting', L), 0);
  t.equal(metric(ex, 'vllm:kv_cache_usage_perc', L), 0);
  t.equal(ex.types.get('vllm:num_requests_waiting'), 'gauge');
  t.equal(ex.types.get('vllm:prefix_cache_queries_total'), 'counter');
  t.equal(metric(ex, 'vllm:prefix_cache_queries_total', L), 500);
  // 250 tokens, blocks of 32: 7 full blocks, all hit on the second request.
  t.equal(metric(ex, 'vllm:prefix_cache_hits_total', L), 7 * 32);
  const info = ex.samples.find((s) => s.name === 'vllm:cache_config_info')!;
  t.equal(info.labels.block_size, '32');
  t.equal(info.labels.num_gpu_blocks, '1234');
  t.equal(info.value, 1);
  t.equal(ex.types.get('vllm:time_to_first_token_seconds'), 'histogram');
  t.equal(metric(ex, 'vllm:time_to_first_token_seconds_count', L), 2);
  t.equal(metric(ex, 'vllm:time_to_first_token_seconds_bucket', { ...L, le: '+Inf' }), 2);
  t.equal(metric(ex, 'vllm:generation_tokens_total', L), 6);
  t.equal(metric(ex, 'vllm:request_success_total', { ...L, finished_reason: 'length' }), 2);
  // Buckets are cumulative and end at the count.
  const buckets = ex.samples.filter((s) => s.name === 'vllm:e2e_request_latency_seconds_bucket').map((s) => s.value);
  t.ok(buckets.every((v, i) => i === 0 || v >= buckets[i - 1]!));
  t.equal(buckets.at(-1), 2);
});

t.test('legacy: an older vLLM (gpu_cache_usage_perc, flat error bodies)', async (t) => {
  const e = await startEngine({ timeScale: 0, legacy: true });
  t.teardown(() => e.close());
  const ex = await scrape(e.url);
  t.equal(metric(ex, 'vllm:gpu_cache_usage_perc', { model_name: 'open-model' }), 0);
  t.notOk(ex.samples.some((s) => s.name === 'vllm:kv_cache_usage_perc'));
  t.notOk(ex.samples.some((s) => 'engine' in s.labels));
  const r = await post(e.url, '/v1/completions', { model: 'nope', prompt: 'x' });
  t.equal(r.status, 404);
  t.same(JSON.parse(r.body), { object: 'error', message: 'The model `nope` does not exist.', type: 'NotFoundError', param: 'model', code: 404 });
});

t.test('metrics: SGLang names', async (t) => {
  const e = await startEngine({ timeScale: 0, engine: 'sglang', models: ['qwen'], kvCacheBlocks: 500, blockSize: 8 });
  t.teardown(() => e.close());
  const prompt = 'q'.repeat(200); // 50 tokens: 6 full pages of 8
  await post(e.url, '/v1/chat/completions', { messages: [{ role: 'user', content: prompt }], max_tokens: 2 });
  await post(e.url, '/v1/chat/completions', { messages: [{ role: 'user', content: prompt }], max_tokens: 2 });
  const ex = await scrape(e.url);
  const L = { model_name: 'qwen' };
  t.equal(metric(ex, 'sglang:num_running_reqs', L), 0);
  t.equal(metric(ex, 'sglang:num_queue_reqs', L), 0);
  t.equal(metric(ex, 'sglang:token_usage', L), 0);
  const tokens = countTokens(renderChat([{ role: 'user', content: prompt }]));
  const full = Math.floor((tokens - 1) / 8) * 8;
  t.equal(metric(ex, 'sglang:cache_hit_rate', L), full / (2 * tokens));
  const info = ex.samples.find((s) => s.name === 'sglang:cache_config_info')!;
  t.equal(info.labels.page_size, '8');
  t.equal(info.labels.num_pages, '500');
  t.equal(metric(ex, 'sglang:time_to_first_token_seconds_count', L), 2);
  t.notOk(ex.samples.some((s) => s.name.startsWith('vllm:')));
});

t.test('fleet: N engines on distinct ports, closed together', async (t) => {
  const fleet = await startFleet(3, { timeScale: 0 });
  t.equal(fleet.engines.length, 3);
  t.equal(new Set(fleet.engines.map((e) => e.port)).size, 3);
  for (const url of fleet.urls) t.equal((await get(url, '/health')).status, 200);
  // Identical replicas: the same prompt gives the same text on every engine; another prompt of the same length differs.
  const texts = await Promise.all(fleet.urls.map(async (u) => JSON.parse((await post(u, '/v1/completions', { prompt: 'abcdef', max_tokens: 6 })).body).choices[0].text));
  t.equal(new Set(texts).size, 1);
  const other = JSON.parse((await post(fleet.urls[0]!, '/v1/completions', { prompt: 'abcdeg', max_tokens: 6 })).body).choices[0].text;
  t.not(other, texts[0]);
  await fleet.close();
  await t.rejects(send(fleet.urls[0]!, 'GET', '/health').done, 'closed engines refuse connections');
  await t.rejects(startFleet(0), RangeError);
  await t.rejects(startEngine({ maxNumSeqs: 0 }), /maxNumSeqs/);
});
