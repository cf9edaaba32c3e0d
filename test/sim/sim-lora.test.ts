// The simulator's LoRA adapters as vLLM serves them: GPU slots (--max-loras)
// with a load cost, the runtime load/unload API, /v1/models with parent and
// root, the 404 of an adapter it does not hold.
import t from 'tap';
import { startEngine } from '../../src/sim/index.js';
import { metric, post, scrape, send } from '../support/sim-util.js';

const ttft = async (url: string) => metric(await scrape(url), 'vllm:time_to_first_token_seconds_sum');

t.test('an adapter not in a GPU slot costs loraLoadMs; one in a slot does not; the LRU idle one gives way', async (t) => {
  const e = await startEngine({ timeScale: 0.02, loras: ['a', 'b', 'c'], loraPaths: { a: '/adapters/a' }, maxLoras: 2, loraLoadMs: 500, prefillOverheadMs: 0, prefillUsPerToken: 0, itlMs: 1 });
  t.teardown(() => e.close());
  const models = JSON.parse((await send(e.url, 'GET', '/v1/models').done).body).data as { id: string; root: string; parent: string | null }[];
  t.same(models.map((m) => [m.id, m.root, m.parent]), [['open-model', 'open-model', null], ['a', '/adapters/a', 'open-model'], ['b', 'b', 'open-model'], ['c', 'c', 'open-model']]);
  const go = async (model: string) => {
    const before = await ttft(e.url);
    const r = await post(e.url, '/v1/completions', { model, prompt: 'x', max_tokens: 1 });
    t.equal(r.status, 200);
    return (await ttft(e.url)) - before;
  };
  t.ok((await go('a')) >= 0.5, 'a: loaded (0.5 s of model time)');
  t.ok((await go('b')) >= 0.5, 'b: loaded into the second slot');
  t.ok((await go('a')) < 0.1, 'a: in its slot');
  t.ok((await go('c')) >= 0.5, 'c: loaded over b (the least recently used)');
  t.ok((await go('a')) < 0.1, 'a kept its slot');
  t.ok((await go('b')) >= 0.5, 'b: loaded again');
  t.equal(e.stats().loraLoads, 4);
  t.ok((await go('open-model')) < 0.1, 'the base model needs no slot');
});

t.test('runtime load and unload: /v1/models follows, an unknown adapter is the 404 vLLM gives', async (t) => {
  const e = await startEngine({ timeScale: 0, enableLora: true, maxLoras: 2 });
  t.teardown(() => e.close());
  const ex0 = await scrape(e.url);
  t.ok(ex0.samples.some((s) => s.name === 'vllm:lora_requests_info' && s.labels.max_lora === '2'), 'lora_requests_info with --enable-lora alone');
  const miss = await post(e.url, '/v1/completions', { model: 'sql', prompt: 'x', max_tokens: 1 });
  t.equal(miss.status, 404);
  t.same(JSON.parse(miss.body).error, { message: 'The model `sql` does not exist.', type: 'NotFoundError', param: 'model', code: 404 });
  const load = await post(e.url, '/v1/load_lora_adapter', { lora_name: 'sql', lora_path: '/adapters/sql' });
  t.equal(load.status, 200);
  t.equal(load.body, "Success: LoRA adapter 'sql' added successfully.");
  const again = await post(e.url, '/v1/load_lora_adapter', { lora_name: 'sql', lora_path: '/adapters/sql' });
  t.equal(again.status, 400, 'already loaded');
  t.match(JSON.parse(again.body).error.message, /already been loaded/);
  t.equal((await post(e.url, '/v1/load_lora_adapter', { lora_name: 'x' })).status, 400, 'no path');
  const models = JSON.parse((await send(e.url, 'GET', '/v1/models').done).body).data as { id: string; root: string; parent: string | null }[];
  t.same(models.at(-1), { ...models.at(-1), id: 'sql', root: '/adapters/sql', parent: 'open-model' });
  t.equal((await post(e.url, '/v1/completions', { model: 'sql', prompt: 'x', max_tokens: 1 })).status, 200);
  const un = await post(e.url, '/v1/unload_lora_adapter', { lora_name: 'sql' });
  t.equal(un.status, 200);
  t.equal(un.body, "Success: LoRA adapter 'sql' removed successfully.");
  t.equal((await post(e.url, '/v1/unload_lora_adapter', { lora_name: 'sql' })).status, 404, 'not loaded');
  t.equal((await post(e.url, '/v1/completions', { model: 'sql', prompt: 'x', max_tokens: 1 })).status, 404, 'unloaded: 404 again');
});

t.test('a refused load answers 500; LoRA off answers 400', async (t) => {
  const e = await startEngine({ timeScale: 0, enableLora: true, loraLoadFail: true });
  const off = await startEngine({ timeScale: 0 });
  t.teardown(() => Promise.all([e.close(), off.close()]));
  t.equal((await post(e.url, '/v1/load_lora_adapter', { lora_name: 'a', lora_path: '/p' })).status, 500);
  t.equal((await post(e.url, '/v1/completions', { model: 'a', prompt: 'x', max_tokens: 1 })).status, 404);
  t.equal((await post(off.url, '/v1/load_lora_adapter', { lora_name: 'a', lora_path: '/p' })).status, 400);
  t.notOk((await scrape(off.url)).samples.some((s) => s.name === 'vllm:lora_requests_info'), 'no lora_requests_info without LoRA');
});
