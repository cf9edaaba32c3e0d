// The prefix-cache scorer's spill at a full batch (issue 32): a hot prefix
// stays on its engine until that engine's batch (its learned max-num-seqs) is
// full, then the next request of the prefix goes to an engine with a free slot
// instead of waiting behind the full batch, and the prefix's later requests
// follow the copy that has room. Before the rule the prefix held until the
// engine's queue estimate was `saturatedQueue` (16) longer than the other's,
// so it waited for a slot. Real simulated engines over loopback (4 slots each,
// long decodes so the batch stays full), the router in-process with the
// default scheduling; the batch limit is learned from the engines' metrics,
// not configured.
import t from 'tap';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { validatePlugin } from '../support/router-util.js';
import type { Endpoint } from '../../src/endpoints/endpoint.js';
import { send, until, type Pending } from '../support/sim-util.js';

const SLOTS = 4;
const PREFIX = 'system: you are a careful assistant. ' + 'context words repeated for a long shared prefix. '.repeat(160); // ~8 KB, ~2,000 tokens

async function setup(t: Tap.Test, prefixParams: Record<string, unknown> = {}, count = 2) {
  const engines: SimEngine[] = [];
  // 20 ms a token: a request of 300 tokens holds its slot for ~6 s, far longer than the test's steps
  for (let i = 0; i < count; i++) engines.push(await startEngine({ maxNumSeqs: SLOTS, itlMs: 20, kvCacheBlocks: 65536 }));
  t.teardown(() => Promise.all(engines.map((e) => e.close())));
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      logging: { level: 'silent' },
      pools: [{ name: 'p', models: ['open-model'], endpoints: engines.map((e, i) => ({ name: `e${i}`, url: e.url })) }],
      ...(Object.keys(prefixParams).length > 0
        ? {
            scheduling: {
              scorers: [
                { type: 'prefix-cache', weight: 3, params: prefixParams },
                { type: 'queue', weight: 2 },
                { type: 'kv-cache-utilization', weight: 2 },
              ],
            },
          }
        : {}),
    },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  const out: Pending[] = [];
  t.teardown(async () => {
    for (const p of out) p.destroy();
    await router.close(200);
  });
  let n = 0;
  const ask = (maxTokens = 300, prefix = PREFIX): Pending => {
    const p = send(router.url, 'POST', '/v1/completions', { model: 'open-model', prompt: `${prefix}\nQ${n++}: what now?`, max_tokens: maxTokens, stream: true, stream_options: { include_usage: true } });
    out.push(p);
    return p;
  };
  const eps = engines.map((_, i) => router.core.endpoints.byName(`e${i}`)!);
  return { router, ask, eps };
}

/** Fills the prefix's engine past its batch (SLOTS running, 2 waiting) and waits until the router has learned the limit; returns the holder. */
async function fillHolder(t: Tap.Test, ask: (n?: number) => Pending, eps: Endpoint[]) {
  const first = ask();
  await first.first; // placed, prefilled, recorded in the prefix index
  const holder = eps.find((e) => e.inFlight === 1)!;
  t.ok(holder, `the first request went to ${holder?.name}`);
  for (let i = 0; i < SLOTS + 1; i++) ask();
  t.ok(await until(() => holder.inFlight === SLOTS + 2, 10_000), `the prefix's next ${SLOTS + 1} requests followed it there (in flight ${holder.inFlight})`);
  t.ok(await until(() => holder.batch.learned > 0, 15_000), `the router learned ${holder.name}'s batch limit from its metrics: ${holder.batch.learned}`);
  t.equal(holder.batch.learned, SLOTS, 'the learned limit is the engine\'s max-num-seqs');
  return holder;
}

t.test('a hot prefix spills to an engine with a free slot once its engine\'s batch is full', async (t) => {
  const { ask, eps } = await setup(t);
  const holder = await fillHolder(t, ask, eps);
  const other = eps.find((e) => e !== holder)!;
  t.equal(other.inFlight, 0, 'nothing on the other engine yet');
  const spilled = ask();
  t.ok(await until(() => other.inFlight === 1, 10_000), `the next request of the prefix went to ${other.name}, which has free slots (holder in flight ${holder.inFlight}, other ${other.inFlight})`);
  t.equal(holder.inFlight, SLOTS + 2, 'not to the full holder');
  await spilled.first;
  // the prefix now sits on both; the holder is still full, so the next one is a hit on the copy with room
  const next = ask(4);
  const r = await next.done;
  t.equal(r.headers['x-switchyard-endpoint'], other.name, 'the following request goes to the copy with room');
  const usage = r.body.match(/"cached_tokens":(\d+)/);
  t.ok(usage && Number(usage[1]) > 1000, `and hits its cache there (cached tokens ${usage?.[1]})`);
});

t.test('spillAtBatchLimit: false keeps the prefix on its full engine (the rule before)', async (t) => {
  const { ask, eps } = await setup(t, { spillAtBatchLimit: false });
  const holder = await fillHolder(t, ask, eps);
  const other = eps.find((e) => e !== holder)!;
  ask();
  t.ok(await until(() => holder.inFlight === SLOTS + 3, 10_000), `the next request of the prefix waits at ${holder.name} behind its full batch (in flight ${holder.inFlight})`);
  t.equal(other.inFlight, 0, 'nothing went to the other engine');
});

t.test('an engine that never queued spills at the batch limit its pool\'s other engine learned', async (t) => {
  const { ask, eps } = await setup(t, {}, 3);
  const full = await fillHolder(t, ask, eps);
  // a second hot prefix: its first request goes to an idle engine, which has never queued (its limit not learned)
  const other = 'system: a different deployment of tools and rules. ' + 'another long shared context, unlike the first one. '.repeat(160);
  await ask(300, other).first;
  const holder = eps.find((e) => e !== full && e.inFlight === 1)!;
  t.ok(holder, `the second prefix went to ${holder?.name}`);
  for (let i = 0; i < SLOTS - 1; i++) ask(300, other);
  t.ok(await until(() => holder.inFlight === SLOTS, 10_000), `its next ${SLOTS - 1} requests followed it there, up to the batch (in flight ${holder.inFlight})`);
  t.equal(holder.batch.learned, 0, `${holder.name} has not queued: its own limit is not learned`);
  const third = eps.find((e) => e !== full && e !== holder)!;
  ask(300, other);
  t.ok(await until(() => third.inFlight === 1, 10_000), `the next request of the second prefix went to ${third.name}, with free slots (in flight: ${eps.map((e) => `${e.name} ${e.inFlight}`).join(', ')})`);
  t.equal(holder.inFlight, SLOTS, `not past ${holder.name}'s batch, at the limit ${full.name} taught`);
});
