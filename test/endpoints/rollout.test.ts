// `switchyard rollout` against a running router under load: a P/D pool moves
// from revision A to B (prefill and decode both replaced) and back, with
// streamed requests flowing all the time: none fails, none pairs a prefill
// with a decode of another revision.
import t from 'tap';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { rollout, type RolloutProgress } from '../../src/server/rollout.js';
import { post } from '../support/sim-util.js';
import { validatePlugin } from '../support/router-util.js';

const LONG = 'an eight kilobyte prompt stands in here. '.repeat(60);

for (const engine of ['vllm', 'sglang'] as const)
t.test(`rollout A → B → A under streamed load (${engine}): 0 failed, 0 mixed pairs`, async (t) => {
  // SGLang: the decode engines refuse a request without a bootstrap room, as real SGLang does, so while a
  // revision has no ready prefill endpoint its decode endpoints get nothing (the other revision pairs)
  const sim = { timeScale: 0.05, itlMs: 5, prefillOverheadMs: 2, engine };
  const start = (role: 'prefill' | 'decode', revision: string, loadingMs = 0) => startEngine({ ...sim, role, revision, loadingMs });
  // the simulator's bootstrap server is its HTTP port
  const boot = (e: SimEngine) => (engine === 'sglang' ? { bootstrapPort: e.port } : {});
  const a: SimEngine[] = [await start('prefill', 'a'), await start('decode', 'a')];
  const b: SimEngine[] = [await start('prefill', 'b', 300), await start('decode', 'b', 300)];
  const a2: SimEngine[] = [await start('prefill', 'a'), await start('decode', 'a')];
  t.teardown(() => Promise.all([...a, ...b, ...a2].map((e) => e.close())));
  const router = await startRouter(
    validateConfig(
      {
        apiVersion: API_VERSION,
        kind: 'Router',
        pools: [
          {
            name: 'pd',
            engine,
            models: ['open-model'],
            endpoints: [
              { name: 'a-p0', url: a[0]!.url, role: 'prefill', revision: 'a', ...boot(a[0]!) },
              { name: 'a-d0', url: a[1]!.url, role: 'decode', revision: 'a' },
            ],
          },
        ],
        logging: { level: 'silent' },
        dataLayer: { healthIntervalMs: 50 },
        admin: { drainGraceMs: 10_000 },
        disaggregation: { thresholdTokens: 64 },
      },
      validatePlugin,
    ),
    { port: 0, host: '127.0.0.1', adminPort: 0 },
  );
  t.teardown(() => router.close(500));
  const rev = (name: string) => name.split('-')[0];
  let failed = 0;
  let mixed = 0;
  let ok = 0;
  let pd = 0;
  let stop = false;
  const worker = async (w: number) => {
    for (let i = 0; !stop; i++) {
      const r = await post(router.url, '/v1/chat/completions', {
        model: 'open-model',
        messages: [{ role: 'user', content: `${w}-${i} ${LONG}` }],
        max_tokens: 8,
        stream: true,
      });
      if (r.status !== 200 || !r.body.endsWith('data: [DONE]\n\n') || r.body.includes('"error"')) {
        failed++;
        continue;
      }
      ok++;
      const p = r.headers['x-switchyard-prefill-endpoint'] as string | undefined;
      if (p !== undefined) {
        pd++;
        if (rev(p) !== rev(r.headers['x-switchyard-endpoint'] as string)) mixed++;
      }
    }
  };
  const load = Promise.all([0, 1, 2, 3].map(worker));
  const steps: RolloutProgress['step'][] = [];
  const opts = { admin: router.admin!.url, token: '', pool: 'pd', pollMs: 50 };
  await new Promise((r) => setTimeout(r, 300));
  const ms1 = await rollout(
    { ...opts, to: 'b', endpoints: [{ name: 'b-p0', url: b[0]!.url, role: 'prefill', ...boot(b[0]!) }, { name: 'b-d0', url: b[1]!.url, role: 'decode' }] },
    (p) => steps.push(p.step),
  );
  const names = () => router.core.endpoints.all.map((e) => e.name).sort();
  t.same(names(), ['b-p0', 'b-d0'].sort(), 'the pool is on revision b');
  await new Promise((r) => setTimeout(r, 200));
  const ms2 = await rollout({ ...opts, to: 'a', from: 'b', endpoints: [{ name: 'a2-p0', url: a2[0]!.url, role: 'prefill', ...boot(a2[0]!) }, { name: 'a2-d0', url: a2[1]!.url, role: 'decode' }] });
  stop = true;
  await load;
  t.same(names(), ['a2-d0', 'a2-p0']);
  t.equal(failed, 0, 'no request failed');
  t.equal(mixed, 0, 'no prefill/decode pair mixed revisions');
  t.ok(ok > 5, `requests served (${ok}, ${pd} disaggregated)`);
  t.ok(pd > 0);
  t.ok(steps.includes('wait-ready') && steps.at(-1) === 'done');
  t.ok(ms1 > 0 && ms2 > 0);
  if (engine === 'sglang') {
    // every request was paired: the decode engines refuse anything else
    t.equal(pd, ok, 'every request served by a pair');
  }
});

t.test('rollout refuses what it cannot do, and the old revision keeps serving', async (t) => {
  const e = await startEngine({ timeScale: 0 });
  t.teardown(() => e.close());
  const router = await startRouter(
    validateConfig(
      {
        apiVersion: API_VERSION,
        kind: 'Router',
        pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'old', url: e.url, revision: 'a' }] }],
        logging: { level: 'silent' },
        admin: { token: 'tok' },
      },
      validatePlugin,
    ),
    { port: 0, host: '127.0.0.1', adminPort: 0 },
  );
  t.teardown(() => router.close(100));
  const base = { admin: router.admin!.url, pool: 'p', to: 'b', endpoints: [{ name: 'new', url: 'http://127.0.0.1:1', role: 'both' as const }] };
  await t.rejects(rollout({ ...base, token: 'wrong' }), /HTTP 401/);
  await t.rejects(rollout({ ...base, token: 'tok', readyTimeoutMs: 300, pollMs: 50 }), /was not ready within 300 ms/);
  t.ok(router.core.endpoints.byName('old'), 'nothing of the old revision was removed');
  t.ok(await new Promise((r) => setTimeout(() => r(router.core.endpoints.byName('new') === undefined), 100)), 'the added endpoint was rolled back');
});
