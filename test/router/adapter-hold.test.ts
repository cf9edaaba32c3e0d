// The router-side hold of LoRA adapter requests (config adapterQueue), over
// real simulated engines with one GPU adapter slot each (--max-loras 1): a
// request for an adapter no engine has a slot for waits in the router (the
// engines' queues stay empty, as their own metrics show) and is served once a
// slot frees; the oldest held request takes a freed slot first; the wait is
// bounded (503 with Retry-After); a client that leaves while held is removed
// and never reaches an engine; a bound on held requests answers 503 at once.
import t from 'tap';
import { performance } from 'node:perf_hooks';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfigFile } from '../../src/config/load.js';
import { validatePlugin } from '../support/router-util.js';
import { get, metric, post, scrape, send, until } from '../support/sim-util.js';

const ADAPTERS = ['a0', 'a1', 'a2', 'a3'];
// itlMs 40 at timeScale 0.05: 2 ms of wall time a token
const ENGINE = { timeScale: 0.05, loras: ADAPTERS, maxLoras: 1, itlMs: 40, prefillOverheadMs: 0, prefillUsPerToken: 0 };

async function fleet(t: Tap.Test, n: number): Promise<SimEngine[]> {
  const engines = await Promise.all(Array.from({ length: n }, () => startEngine(ENGINE)));
  t.teardown(() => Promise.all(engines.map((e) => e.close())));
  return engines;
}

async function route(t: Tap.Test, engines: SimEngine[], adapterQueue: Record<string, unknown> = {}): Promise<RunningRouter> {
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: engines.map((e, i) => ({ name: `e${i}`, url: e.url })) }],
      scheduling: { scorers: [{ type: 'lora-affinity', weight: 10 }, { type: 'queue', weight: 1 }] },
      logging: { level: 'silent' },
      dataLayer: { modelCheckIntervalMs: 500, scrapeIntervalMs: 20 },
      adapterQueue,
    },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const listed = async () => {
    const ids = (JSON.parse((await get(router.url, '/v1/models')).body).data as { id: string }[]).map((m) => m.id);
    return ADAPTERS.every((a) => ids.includes(a));
  };
  t.ok(await until(listed, 20_000), "the engines' adapters are known");
  return router;
}

const gen = (url: string, model: string, tokens: number) => post(url, '/v1/completions', { model, prompt: `for ${model}`, max_tokens: tokens });

/** Router metrics of the hold. */
async function holdState(url: string): Promise<{ held: number; dispatched: number; timeout: number; cancelled: number; full: number }> {
  const ex = await scrape(url);
  const out = (o: string) => metric(ex, 'switchyard_adapter_queue_total', { outcome: o });
  return { held: metric(ex, 'switchyard_adapter_queue_requests'), dispatched: out('dispatched'), timeout: out('timeout'), cancelled: out('cancelled'), full: out('full') };
}

/** Requests waiting in an engine's own queue, from its /metrics (vLLM's gauge). */
async function engineWaiting(e: SimEngine): Promise<number> {
  return metric(await scrape(e.url), 'vllm:num_requests_waiting');
}

/** Every request an engine has seen (running, waiting, finished, aborted). */
function seen(e: SimEngine): number {
  const s = e.stats();
  return s.running + s.waiting + s.finished + s.aborted;
}

/** Both engines run one long request each (a0 on one, a1 on the other): every adapter slot is taken. */
async function fillSlots(t: Tap.Test, router: RunningRouter, engines: SimEngine[], tokens: number, tokens1 = tokens): Promise<Promise<{ status: number; at: number; endpoint: string }>[]> {
  const timed = (model: string, n = tokens) => gen(router.url, model, n).then((r) => ({ status: r.status, at: performance.now(), endpoint: String(r.headers['x-switchyard-endpoint']) }));
  const first = timed('a0');
  t.ok(await until(() => engines.some((e) => e.stats().running === 1), 5000), 'a0 runs');
  const second = timed('a1', tokens1);
  t.ok(await until(() => engines.every((e) => e.stats().running === 1), 5000), 'a1 runs on the other engine (its free slot)');
  // the router has seen both engines' lora_requests_info with the slot taken
  await new Promise((r) => setTimeout(r, 60));
  return [first, second];
}

t.test('no engine has a slot: the request waits in the router, not in an engine queue, and is served once a slot frees', async (t) => {
  const engines = await fleet(t, 2);
  const router = await route(t, engines);
  // a1 runs twice as long as a0: which slot frees first is not a race between two equal requests
  const [first, second] = await fillSlots(t, router, engines, 400, 800); // ~800 ms and ~1.6 s
  const t0 = performance.now();
  const third = gen(router.url, 'a2', 2).then((r) => ({ r, at: performance.now() }));
  t.ok(await until(async () => (await holdState(router.url)).held === 1, 3000), 'a2 is held in the router');
  // while it is held (checked before and after), no engine has it: their own queues are empty
  const running = engines.map((e) => e.stats().running);
  const waiting = await Promise.all(engines.map(engineWaiting));
  t.equal((await holdState(router.url)).held, 1, 'still held after the engines were read');
  t.same(running, [1, 1], 'each engine runs its one request');
  t.same(waiting, [0, 0], "the engines' own queues are empty (vllm:num_requests_waiting)");
  t.same(engines.map((e) => e.stats().waiting), [0, 0]);
  const [r0, r1, r2] = await Promise.all([first, second, third]);
  t.equal(r0.status, 200);
  t.equal(r1.status, 200);
  t.equal(r2.r.status, 200, r2.r.body);
  t.equal(JSON.parse(r2.r.body).model, 'a2');
  const freed = Math.min(r0.at, r1.at);
  t.ok(r2.at >= freed, `a2 ended after the first slot freed (${(r2.at - t0).toFixed(0)} ms after it was sent)`);
  const servedBy = r0.at <= r1.at ? r0.endpoint : r1.endpoint;
  t.equal(r2.r.headers['x-switchyard-endpoint'], servedBy, 'a2 went to the engine whose slot freed first');
  const s = await holdState(router.url);
  t.same(s, { held: 0, dispatched: 1, timeout: 0, cancelled: 0, full: 0 });
  const ex = await scrape(router.url);
  t.equal(metric(ex, 'switchyard_adapter_held_total', { adapter: 'a2' }), 1);
  t.ok(metric(ex, 'switchyard_adapter_queue_wait_seconds_total') > 0.1, 'the wait is counted');
});

t.test('the oldest held request takes the freed slot; the next one waits for the next slot', async (t) => {
  const engines = await fleet(t, 2);
  const router = await route(t, engines);
  // a0 short (~500 ms), a1 long (~1.8 s)
  const timed = (model: string, tokens: number) => gen(router.url, model, tokens).then((r) => ({ r, at: performance.now() }));
  const short = timed('a0', 250);
  t.ok(await until(() => engines.some((e) => e.stats().running === 1), 5000));
  const long = timed('a1', 900);
  t.ok(await until(() => engines.every((e) => e.stats().running === 1), 5000));
  await new Promise((r) => setTimeout(r, 60));
  const older = timed('a2', 150); // ~300 ms: ends well before a1
  t.ok(await until(async () => (await holdState(router.url)).held === 1, 3000));
  const newer = timed('a3', 2);
  t.ok(await until(async () => (await holdState(router.url)).held === 2, 3000), 'both held');
  const [s, l, o, n] = await Promise.all([short, long, older, newer]);
  for (const x of [s, l, o, n]) t.equal(x.r.status, 200, x.r.body);
  t.equal(o.r.headers['x-switchyard-endpoint'], s.r.headers['x-switchyard-endpoint'], 'a2 (older) took the slot a0 freed');
  t.ok(n.at > o.at, `a3 (newer) went only once a2 had freed the slot again (a3 ended ${n.at.toFixed(0)}, a2 ${o.at.toFixed(0)}, a1 ${l.at.toFixed(0)})`);
  t.equal(n.r.headers['x-switchyard-endpoint'], s.r.headers['x-switchyard-endpoint'], 'a3 took the slot a2 freed (a1 still ran)');
  t.equal((await holdState(router.url)).dispatched, 2);
});

t.test('the hold is bounded in time: 503 with Retry-After, and the engine never got it', async (t) => {
  const engines = await fleet(t, 2);
  const router = await route(t, engines, { maxWaitMs: 300, retryAfterSeconds: 2 });
  const fill = await fillSlots(t, router, engines, 600); // ~1.2 s each
  const before = engines.map(seen);
  const t0 = performance.now();
  const r = await gen(router.url, 'a2', 2);
  const waited = performance.now() - t0;
  t.equal(r.status, 503, r.body);
  t.equal(r.headers['retry-after'], '2');
  t.equal(r.headers['x-switchyard-dropped-reason'], 'adapter-queue-timeout');
  const err = JSON.parse(r.body).error;
  t.equal(err.type, 'server_error');
  t.match(err.message, /No replica had a free adapter slot for `a2` within \d+ ms \(adapterQueue\.maxWaitMs\)/);
  t.ok(waited >= 290 && waited < 1100, `answered after the bound, before a slot freed (${waited.toFixed(0)} ms)`);
  t.same(engines.map(seen), before, 'no engine got a2');
  t.equal((await holdState(router.url)).timeout, 1);
  for (const f of await Promise.all(fill)) t.equal(f.status, 200);
});

t.test('a client that leaves while held is removed: it never reaches an engine', async (t) => {
  const engines = await fleet(t, 2);
  const router = await route(t, engines);
  const fill = await fillSlots(t, router, engines, 200);
  const before = engines.map(seen);
  const p = send(router.url, 'POST', '/v1/completions', { model: 'a2', prompt: 'gone', max_tokens: 2 });
  t.ok(await until(async () => (await holdState(router.url)).held === 1, 3000), 'held');
  p.destroy();
  await p.done;
  t.ok(await until(async () => (await holdState(router.url)).held === 0, 3000), 'removed from the hold');
  for (const f of await Promise.all(fill)) t.equal(f.status, 200);
  await new Promise((r) => setTimeout(r, 100)); // slots free: a request left in the hold would go now
  t.same(engines.map(seen), before, 'no engine got the request of the client that left');
  const s = await holdState(router.url);
  t.equal(s.cancelled, 1);
  t.equal(s.dispatched, 0);
  // the router still serves that adapter at once now that slots are free
  t.equal((await gen(router.url, 'a2', 2)).status, 200);
});

t.test('a bound on held requests: the one past maxPerAdapter is 503 at once; off, the request waits in an engine', async (t) => {
  const engines = await fleet(t, 2);
  const router = await route(t, engines, { maxPerAdapter: 2, retryAfterSeconds: 1 });
  const fill = await fillSlots(t, router, engines, 200);
  const held = [gen(router.url, 'a2', 2), gen(router.url, 'a2', 2)];
  t.ok(await until(async () => (await holdState(router.url)).held === 2, 3000));
  const over = await gen(router.url, 'a2', 2);
  t.equal(over.status, 503);
  t.equal(over.headers['x-switchyard-dropped-reason'], 'adapter-queue-full');
  t.equal(over.headers['retry-after'], '1');
  t.match(JSON.parse(over.body).error.message, /2 requests for adapter `a2` wait for a GPU adapter slot \(adapterQueue\.maxPerAdapter\)/);
  for (const r of await Promise.all([...held, ...fill])) t.equal(r.status, 200);
  t.equal((await holdState(router.url)).full, 1);

  const e2 = await fleet(t, 2);
  const plain = await route(t, e2, { enabled: false });
  const fill2 = await fillSlots(t, plain, e2, 200);
  const waits = gen(plain.url, 'a2', 2);
  t.ok(await until(async () => (await engineWaiting(e2[0]!)) + (await engineWaiting(e2[1]!)) === 1, 3000), 'with the hold off, a2 waits in an engine queue');
  t.equal((await waits).status, 200);
  for (const f of await Promise.all(fill2)) t.equal(f.status, 200);
});

t.test('a reload applies new bounds; turning the hold off lets the held requests go at once', async (t) => {
  const engines = await fleet(t, 2);
  const dir = await mkdtemp(join(tmpdir(), 'swy-hold-'));
  const file = join(dir, 'router.json');
  const doc = (adapterQueue: Record<string, unknown>) =>
    JSON.stringify({
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: engines.map((e, i) => ({ name: `e${i}`, url: e.url })) }],
      scheduling: { scorers: [{ type: 'lora-affinity', weight: 10 }, { type: 'queue', weight: 1 }] },
      logging: { level: 'silent' },
      dataLayer: { modelCheckIntervalMs: 500, scrapeIntervalMs: 20 },
      adapterQueue,
    });
  await writeFile(file, doc({ maxWaitMs: 60_000 }));
  const router = await startRouter(await loadConfigFile(file, validatePlugin), { port: 0, host: '127.0.0.1', configFile: file, validatePlugin });
  t.teardown(() => router.close(200));
  t.ok(await until(async () => (await get(router.url, '/v1/models')).body.includes('"a3"'), 20_000), "the engines' adapters are known");
  const fill = await fillSlots(t, router, engines, 600); // ~1.2 s each
  const held = gen(router.url, 'a2', 2).then((r) => ({ r, at: performance.now() }));
  t.ok(await until(async () => (await holdState(router.url)).held === 1, 3000), 'held');
  // a bound lowered by a reload applies to the next request
  await writeFile(file, doc({ maxWaitMs: 60_000, maxPerAdapter: 1 }));
  t.ok((await router.reload!()).ok);
  const over = await gen(router.url, 'a2', 2);
  t.equal(over.status, 503, 'maxPerAdapter 1 after the reload: the second is refused');
  // off: the held one goes now, to an engine queue, before any slot frees
  await writeFile(file, doc({ enabled: false }));
  const t0 = performance.now();
  t.ok((await router.reload!()).ok);
  t.ok(await until(async () => (await engineWaiting(engines[0]!)) + (await engineWaiting(engines[1]!)) === 1, 3000), 'it waits in an engine queue now');
  t.equal((await holdState(router.url)).held, 0);
  const [h, ...f] = await Promise.all([held, ...fill]);
  t.equal(h.r.status, 200);
  t.ok(performance.now() - t0 < 5000);
  for (const x of f) t.equal(x.status, 200);
});

t.test('config errors name the field', async (t) => {
  const bad = (aq: unknown) => {
    try {
      validateConfig({ apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:1' }] }], adapterQueue: aq }, validatePlugin);
      return '';
    } catch (err) {
      return (err as Error).message;
    }
  };
  t.match(bad({ maxWaitMs: 0 }), /adapterQueue\.maxWaitMs/);
  t.match(bad({ maxPerAdapter: 'many' }), /adapterQueue\.maxPerAdapter/);
  t.match(bad({ nope: 1 }), /adapterQueue\.nope/);
  t.match(bad(5), /adapterQueue: must be a mapping/);
  t.equal(bad({ enabled: false }), '');
});
