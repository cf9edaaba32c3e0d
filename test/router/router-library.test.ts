// Library use: startRouter(parseConfig(yaml)) behaves as `switchyard serve`
// with the same file. A flowControl block applies flow control (before, the
// library silently got first-come-first-served: only the CLI built the gate).
import t from 'tap';
import { startEngine } from '../../src/sim/index.js';
import { parseConfig } from '../../src/config/load.js';
import { startRouter } from '../../src/server/router.js';
import { validatePlugin } from '../support/router-util.js';

t.test('startRouter(parseConfig(yaml with flowControl)) holds requests above saturation and sheds with a reason', async (t) => {
  // one engine, 20 ms per output token: a 40-token request runs ~0.8 s
  const engine = await startEngine({ itlMs: 20, prefillOverheadMs: 1, prefillUsPerToken: 0, seed: 1 });
  t.teardown(() => engine.close());
  const yaml = `apiVersion: switchyard/v1
kind: Router
pools:
  - name: p
    models: [open-model]
    endpoints:
      - { name: e0, url: "${engine.url}" }
logging: { level: silent }
flowControl:
  enabled: true
  saturation: { maxConcurrency: 1 }
  admission: { mode: off }
  limits: { maxRequests: 1 }
`;
  const router = await startRouter(parseConfig(yaml, validatePlugin, 'library'), { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const post = (tokens: number) =>
    fetch(`${router.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'open-model', prompt: 'hello there', max_tokens: tokens }),
    }).then(async (r) => ({ status: r.status, reason: r.headers.get('x-switchyard-dropped-reason'), body: await r.text() }));
  // the first runs, the second waits in the router's queue (limit 1), the third finds the queue full
  const first = post(40);
  await new Promise((r) => setTimeout(r, 100));
  const second = post(2);
  await new Promise((r) => setTimeout(r, 50));
  const third = await post(2);
  t.equal(third.status, 429, `a third request finds the queue full (got ${third.status} ${third.body})`);
  t.equal(third.reason, 'rejected-capacity', 'with the reason header');
  t.match(JSON.parse(third.body), { error: { code: 'rate_limit_exceeded' } }, 'OpenAI error shape');
  t.equal((await first).status, 200);
  t.equal((await second).status, 200, 'the held request is served once the first ends');
  const m = await (await fetch(`${router.url}/metrics`)).text();
  t.match(m, /switchyard_flow_/, 'flow-control metrics in /metrics');
});

t.test('a gate passed by the caller replaces the config one', async (t) => {
  const engine = await startEngine({ timeScale: 0 });
  t.teardown(() => engine.close());
  const yaml = `apiVersion: switchyard/v1
kind: Router
pools: [{ name: p, models: [open-model], endpoints: [{ name: e0, url: "${engine.url}" }] }]
logging: { level: silent }
flowControl: { enabled: true, limits: { maxRequests: 1 } }
`;
  let admitted = 0;
  const router = await startRouter(parseConfig(yaml, validatePlugin, 'library'), {
    port: 0,
    host: '127.0.0.1',
    gate: { headerNames: [], admit: () => (admitted++, { admitted: true, ticket: null }), release: () => {} },
  });
  t.teardown(() => router.close(200));
  const r = await fetch(`${router.url}/v1/completions`, { method: 'POST', body: '{"model":"open-model","prompt":"x","max_tokens":1}' });
  t.equal(r.status, 200);
  t.equal(admitted, 1, 'the caller\'s gate admitted it');
});
