// The passthrough routes (embeddings, vLLM's score/rerank/tokenize/detokenize)
// over real sockets: router in front of simulated engines. Each is relayed to
// an endpoint of the model (load-aware, no prefix recorded, no session),
// answered in the engine's shape, with the router's error shapes and metrics.
import t from 'tap';
import { startTestRouter } from '../support/router-util.js';
import { metric, parseProm } from '../support/sim-util.js';

async function post(url: string, body: string, headers: Record<string, string> = {}) {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  const text = await res.text();
  let json: any;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, endpoint: res.headers.get('x-switchyard-endpoint'), json, text };
}

function isOpenAIError(t: Tap.Test, r: { status: number; json: any }, status: number, param?: string) {
  t.equal(r.status, status, `HTTP ${status}`);
  t.type(r.json?.error?.message, 'string', 'error.message');
  t.type(r.json?.error?.type, 'string', 'error.type');
  const code = r.json?.error?.code;
  t.ok(code === null || typeof code === 'string', `error.code a string or null (got ${JSON.stringify(code)})`);
  t.equal(r.json?.error?.type, status >= 500 ? 'server_error' : status === 429 ? 'requests' : 'invalid_request_error', "error.type in OpenAI's vocabulary");
  if (param !== undefined) t.equal(r.json?.error?.param, param, `error.param = ${param}`);
}

t.test('every passthrough route reaches an engine and answers its shape', async (t) => {
  const { url } = await startTestRouter(t, { n: 2 });
  const emb = await post(`${url}/v1/embeddings`, JSON.stringify({ model: 'open-model', input: ['hello', 'world'] }));
  t.equal(emb.status, 200);
  t.match(emb.endpoint, /^e[01]$/, 'served by an endpoint of the model');
  t.equal(emb.json.object, 'list');
  t.equal(emb.json.data.length, 2);
  t.equal(emb.json.data[0].embedding.length, 64, 'fixed dimension');
  const again = await post(`${url}/v1/embeddings`, JSON.stringify({ model: 'open-model', input: 'hello', dimensions: 8 }));
  t.equal(again.json.data[0].embedding.length, 8, 'dimensions honoured');
  const same = await post(`${url}/v1/embeddings`, JSON.stringify({ model: 'open-model', input: 'hello' }));
  t.same(same.json.data[0].embedding, emb.json.data[0].embedding, 'deterministic: the same text, the same vector, whichever engine');

  for (const path of ['/v1/score', '/score']) {
    const r = await post(`${url}${path}`, JSON.stringify({ model: 'open-model', text_1: 'what is a cat', text_2: ['a cat is an animal', 'stocks fell'] }));
    t.equal(r.status, 200, path);
    t.equal(r.json.data.length, 2);
    t.ok(r.json.data.every((d: any) => d.object === 'score' && d.score >= 0 && d.score <= 1), `${path}: scores in [0, 1]`);
  }
  for (const path of ['/v1/rerank', '/rerank', '/v2/rerank']) {
    const r = await post(`${url}${path}`, JSON.stringify({ model: 'open-model', query: 'cat', documents: ['a', 'b', 'c'], top_n: 2 }));
    t.equal(r.status, 200, path);
    t.equal(r.json.results.length, 2, `${path}: top_n`);
    t.ok(r.json.results[0].relevance_score >= r.json.results[1].relevance_score, 'ordered by relevance');
  }
  const tok = await post(`${url}/tokenize`, JSON.stringify({ model: 'open-model', prompt: 'hello world!' }));
  t.equal(tok.status, 200);
  t.equal(tok.json.count, 3, '12 bytes: 3 simulated tokens');
  const detok = await post(`${url}/detokenize`, JSON.stringify({ model: 'open-model', tokens: tok.json.tokens }));
  t.equal(detok.status, 200);
  t.equal(detok.json.prompt, 'hello world!', 'detokenize inverts tokenize');
  const noModel = await post(`${url}/tokenize`, JSON.stringify({ prompt: 'abcd' }));
  t.equal(noModel.status, 200, 'no model: the router\'s only model (as an engine defaults to its own)');

  const m = parseProm(await (await fetch(`${url}/metrics`)).text());
  t.equal(metric(m, 'switchyard_prefix_blocks_total'), 0, 'no prefix hashed or recorded for passthrough requests');
  const served = m.samples.filter((s) => s.name === 'switchyard_requests_total' && s.labels.model === 'open-model' && s.labels.status === '200');
  t.equal(served.reduce((a, s) => a + s.value, 0), 11, 'counted in switchyard_requests_total like inference');
  t.equal(metric(m, 'switchyard_sessions_pinned'), 0, 'no session pinned by a passthrough request');
});

t.test('passthrough requests are spread by load', async (t) => {
  const { url, router } = await startTestRouter(t, { n: 2 });
  const eps = new Set<string>();
  // hold one in flight per endpoint through the router's own count: the queue scorer sends the next elsewhere
  const results = await Promise.all(Array.from({ length: 8 }, (_, i) => post(`${url}/v1/embeddings`, JSON.stringify({ model: 'open-model', input: `text ${i}` }))));
  for (const r of results) eps.add(r.endpoint!);
  t.equal(eps.size, 2, 'both endpoints served');
  t.same(router.core.endpoints.all.map((e) => e.inFlight), [0, 0], 'in-flight released');
});

t.test('passthrough errors: unknown model 404, bad JSON 400, the engine\'s 400 relayed in the current shape, wrong method 405', async (t) => {
  const { url } = await startTestRouter(t, { n: 1, fleet: { timeScale: 0, legacy: true } });
  for (const path of ['/v1/embeddings', '/v1/score', '/score', '/v1/rerank', '/rerank', '/v2/rerank', '/tokenize', '/detokenize']) {
    isOpenAIError(t, await post(`${url}${path}`, JSON.stringify({ model: 'nope', input: 'x' })), 404, 'model');
    isOpenAIError(t, await post(`${url}${path}`, '{"model": "open-model", '), 400);
    isOpenAIError(t, await post(`${url}${path}`, '[1]'), 400);
    isOpenAIError(t, await post(`${url}${path}`, JSON.stringify({ model: 7 })), 400, 'model');
  }
  // the engine's own 400 (a legacy flat body here) comes back in the current OpenAI shape
  const bad = await post(`${url}/v1/embeddings`, JSON.stringify({ model: 'open-model', input: 42 }));
  isOpenAIError(t, bad, 400, 'input');
  const badRerank = await post(`${url}/v1/rerank`, JSON.stringify({ model: 'open-model', documents: ['a'] }));
  isOpenAIError(t, badRerank, 400, 'query');
  const get = await fetch(`${url}/v1/embeddings`);
  t.equal(get.status, 405, 'GET on a POST route');
  t.equal(get.headers.get('allow'), 'POST');
});

t.test('a router serving several models needs `model` on a passthrough request', async (t) => {
  const { url } = await startTestRouter(t, {
    n: 2,
    fleet: { timeScale: 0, models: ['open-model', 'other-model'] },
    pools: (urls) => [
      { name: 'a', models: ['open-model'], endpoints: [{ name: 'e0', url: urls[0] }] },
      { name: 'b', models: ['other-model'], endpoints: [{ name: 'e1', url: urls[1] }] },
    ],
  });
  isOpenAIError(t, await post(`${url}/tokenize`, JSON.stringify({ prompt: 'abcd' })), 400, 'model');
  const r = await post(`${url}/tokenize`, JSON.stringify({ model: 'other-model', prompt: 'abcd' }));
  t.equal(r.status, 200);
  t.equal(r.endpoint, 'e1', 'routed to the pool of its model');
});
