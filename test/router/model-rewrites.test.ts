// Model rewrites over real simulated engines: fixed shares of a model name's
// traffic to weighted targets (measured from the answers' `model`), sticky
// per conversation, the default rule for requests that name no model, a live
// change of the weights by a reload (running conversations keep their
// target), the per-rule metrics, and the config errors.
import t from 'tap';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { loadConfigFile } from '../../src/config/load.js';
import { startRouter } from '../../src/server/router.js';
import { validatePlugin } from '../support/router-util.js';
import { metric, post, scrape } from '../support/sim-util.js';

const doc = (url: string, rewrites: unknown) => ({
  apiVersion: API_VERSION,
  kind: 'Router',
  pools: [{ name: 'p', models: ['v1', 'v2'], endpoints: [{ name: 'e0', url }] }],
  logging: { level: 'silent' },
  modelRewrites: rewrites,
});

const served = async (url: string, model: string | undefined, session?: string) => {
  const r = await post(url, '/v1/chat/completions', { ...(model !== undefined ? { model } : {}), messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 }, session ? { 'x-session-id': session } : {});
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${r.body}`);
  return JSON.parse(r.body).model as string;
};

/** n requests, 16 at a time; the count per answered model. */
async function shares(n: number, one: (i: number) => Promise<string>): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  let next = 0;
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (next < n) {
        const m = await one(next++);
        out.set(m, (out.get(m) ?? 0) + 1);
      }
    }),
  );
  return out;
}

t.test('weighted targets: the shares hold over N requests, a conversation never changes target, the answer names the target', async (t) => {
  const e = await startEngine({ timeScale: 0, models: ['v1', 'v2'] });
  t.teardown(() => e.close());
  const router = await startRouter(validateConfig(doc(e.url, [{ model: 'chat', targets: [{ model: 'v2', weight: 10 }, { model: 'v1', weight: 90 }] }]), validatePlugin), { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const free = await shares(500, () => served(router.url, 'chat'));
  t.ok(Math.abs((free.get('v2') ?? 0) / 500 - 0.1) <= 0.01, `v2 share without sessions: ${free.get('v2')} of 500`);
  t.equal((free.get('v1') ?? 0) + (free.get('v2') ?? 0), 500, 'every answer names a target');
  // conversations of 1 to 7 turns
  const seen = new Map<string, Set<string>>();
  const turns = (i: number) => 1 + (i % 7);
  const keys: string[] = [];
  for (let s = 0; keys.length < 800; s++) for (let k = 0; k < turns(s); k++) keys.push(`conv-${s}`);
  const sticky = await shares(keys.length, async (i) => {
    const m = await served(router.url, 'chat', keys[i]);
    (seen.get(keys[i]!) ?? seen.set(keys[i]!, new Set()).get(keys[i]!)!).add(m);
    return m;
  });
  t.equal([...seen.values()].filter((s) => s.size > 1).length, 0, `no conversation split (${seen.size} conversations)`);
  t.ok(Math.abs((sticky.get('v2') ?? 0) / keys.length - 0.1) <= 0.02, `v2 share with sessions: ${sticky.get('v2')} of ${keys.length}`);
  t.equal(await served(router.url, 'v1'), 'v1', 'a model without a rule is untouched');
  const ex = await scrape(router.url);
  t.equal(metric(ex, 'switchyard_model_rewrites_total', { rule: 'chat', target: 'v2' }) + metric(ex, 'switchyard_model_rewrites_total', { rule: 'chat', target: 'v1' }), 500 + keys.length);
});

t.test('the default rule takes requests without a model; a reload moves the weights live, running conversations keep their target', async (t) => {
  const e = await startEngine({ timeScale: 0, models: ['v1', 'v2'] });
  t.teardown(() => e.close());
  const dir = await mkdtemp(join(tmpdir(), 'swy-rewrites-'));
  const file = join(dir, 'router.json');
  await writeFile(file, JSON.stringify(doc(e.url, [{ default: true, targets: [{ model: 'v1', weight: 1 }] }, { model: 'chat', targets: [{ model: 'v1', weight: 99 }, { model: 'v2', weight: 1 }] }])));
  const router = await startRouter(await loadConfigFile(file, validatePlugin), { port: 0, host: '127.0.0.1', configFile: file, validatePlugin });
  t.teardown(() => router.close(200));
  t.equal(await served(router.url, undefined), 'v1', 'no model: the default rule');
  // conversations begun at 1 %
  const before = new Map<string, string>();
  for (let s = 0; s < 50; s++) before.set(`old-${s}`, await served(router.url, 'chat', `old-${s}`));
  // 1 % -> 100 % on v2
  await writeFile(file, JSON.stringify(doc(e.url, [{ default: true, targets: [{ model: 'v2', weight: 1 }] }, { model: 'chat', targets: [{ model: 'v1', weight: 0 }, { model: 'v2', weight: 100 }] }])));
  const r = await router.reload!();
  t.ok(r.ok, JSON.stringify(r));
  t.equal(await served(router.url, undefined), 'v2', 'the default rule changed live');
  for (let s = 0; s < 20; s++) t.equal(await served(router.url, 'chat', `new-${s}`), 'v2', 'new conversations: v2');
  // weight 0 takes v1 out: its conversations move (a target with no weight serves nothing)
  for (const [k] of before) t.equal(await served(router.url, 'chat', k), 'v2');
  // back to 90/10: v2's conversations stay on v2
  await writeFile(file, JSON.stringify(doc(e.url, [{ model: 'chat', targets: [{ model: 'v1', weight: 90 }, { model: 'v2', weight: 10 }] }])));
  t.ok((await router.reload!()).ok);
  for (let s = 0; s < 20; s++) t.equal(await served(router.url, 'chat', `new-${s}`), 'v2', 'a running conversation keeps its target when the weights change');
  const missing = await post(router.url, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 });
  t.equal(missing.status, 400, 'no default rule any more: a model is required again');
});

t.test('config errors name the field', async (t) => {
  const bad = (rewrites: unknown) => {
    try {
      validateConfig(doc('http://127.0.0.1:1', rewrites), validatePlugin);
      return '';
    } catch (err) {
      return (err as Error).message;
    }
  };
  t.match(bad([{ model: 'chat', targets: [{ model: 'v1', weight: 0 }, { model: 'v2', weight: 0 }] }]), /modelRewrites\[0\]\.targets: the weights must sum to a positive number/);
  t.match(bad([{ model: 'v1', targets: [{ model: 'v1', weight: 1 }] }]), /modelRewrites\[0\]\.targets: rewrites "v1" to itself only/);
  t.match(bad([{ model: 'a', targets: [{ model: 'v1', weight: 1 }] }, { model: 'v1', targets: [{ model: 'v2', weight: 1 }] }]), /modelRewrites\[0\]\.targets\[0\]\.model: "v1" is rewritten by modelRewrites\[1\]/);
  t.match(bad([{ model: 'v1', targets: [{ model: 'v2', weight: 1 }] }, { model: 'v2', targets: [{ model: 'v1', weight: 1 }] }]), /loop is refused/);
  t.match(bad([{ model: 'chat', targets: [{ model: 'v9', weight: 1 }] }]), /modelRewrites\[0\]\.targets\[0\]\.model: no pool serves "v9"/);
  t.match(bad([{ targets: [{ model: 'v1', weight: 1 }] }]), /give either model/);
  t.match(bad([{ model: 'chat', targets: [{ model: 'v1', weight: -1 }] }]), /modelRewrites\[0\]\.targets\[0\]\.weight/);
  t.match(bad([{ model: 'chat', targets: [{ model: 'v1', weight: 1 }] }, { model: 'chat', targets: [{ model: 'v2', weight: 1 }] }]), /modelRewrites\[1\]\.model: a second rule for "chat"/);
});
