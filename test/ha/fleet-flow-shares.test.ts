// Flow-control shares across active-active replicas (ha.shareFlows,
// src/flow/fleet-flows.ts), over a real redis-server, two real routers and a
// real simulated engine: a tenant whose requests all reach one replica gets
// its fleet share, not the share that replica's dispatches give it, and a
// premium request queued at one replica is served before the standard ones
// queued at another. Then the exchange itself: a peer's malformed report is
// skipped and counted, and a peer that stops reporting never holds a
// replica's capacity past ha.flowHoldMs.
import t from 'tap';
import { startRedis } from '../support/redis-util.js';
import { validatePlugin } from '../support/router-util.js';
import { startEngine } from '../../src/sim/index.js';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { FleetFlows } from '../../src/flow/fleet-flows.js';
import { FlowController } from '../../src/flow/controller.js';
import { validateFlowControl } from '../../src/flow/config.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Load {
  ok: Map<string, number>;
  failed: number;
}

/** `clients` closed loops of `flow` (x-tenant-id, x-priority) against `url` until `stop`, counting answers 200 by tag. */
async function loop(url: string, tag: string, headers: Record<string, string>, maxTokens: number, stop: { done: boolean }, load: Load): Promise<void> {
  while (!stop.done) {
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify({ model: 'open-model', prompt: `request of ${tag}`, max_tokens: maxTokens }),
    });
    await res.arrayBuffer();
    if (res.status === 200) load.ok.set(tag, (load.ok.get(tag) ?? 0) + 1);
    else load.failed++;
  }
}

function config(redisUrl: string, engineUrl: string, key: string, shareFlows: boolean): Record<string, unknown> {
  return {
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', engine: 'vllm', models: ['open-model'], endpoints: [{ name: 'e0', url: engineUrl }] }],
    logging: { level: 'silent' },
    // 4 requests in flight fleet-wide, the rest held in the routers (the engine could run more)
    flowControl: { admission: { mode: 'off' }, saturation: { maxConcurrency: 4 }, ttl: '30s', flows: [{ id: 'tenant:p', priority: 'premium' }] },
    ha: { redis: redisUrl, key, deltaFlushMs: 30, peerTtlMs: 600, shareFlows },
  };
}

async function twoReplicas(t: Tap.Test, key: string, shareFlows = process.env.SWY_NO_SHARE === undefined) {
  const redis = await startRedis(t);
  // 10 ms a token: a request of 6 tokens holds its slot ~60 ms
  const engine = await startEngine({ itlMs: 10, prefillOverheadMs: 1, prefillUsPerToken: 0, maxNumSeqs: 16, seed: 7 });
  t.teardown(() => engine.close());
  const cfg = validateConfig(config(redis.url, engine.url, key, shareFlows), validatePlugin);
  const a = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => a.close(100));
  const b = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => b.close(100));
  // both see each other before the load starts
  for (let i = 0; i < 200 && (a.fleet!.peers < 1 || b.fleet!.peers < 1); i++) await sleep(10);
  return { a, b };
}

t.test('a tenant whose requests all reach one replica gets its fleet share (tenant a on both replicas, tenant b on B only)', async (t) => {
  const { a, b } = await twoReplicas(t, 'swy-ff-share');
  t.equal(a.fleet!.peers, 1, 'A sees B');
  const load: Load = { ok: new Map(), failed: 0 };
  const stop = { done: false };
  const runs: Promise<void>[] = [];
  for (let i = 0; i < 6; i++) runs.push(loop(a.url, 'a@A', { 'x-tenant-id': 'a' }, 6, stop, load));
  for (let i = 0; i < 6; i++) runs.push(loop(b.url, 'a@B', { 'x-tenant-id': 'a' }, 6, stop, load));
  for (let i = 0; i < 6; i++) runs.push(loop(b.url, 'b', { 'x-tenant-id': 'b' }, 6, stop, load));
  await sleep(3000);
  stop.done = true;
  await Promise.all(runs);
  const atA = load.ok.get('a@A') ?? 0;
  const atB = load.ok.get('a@B') ?? 0;
  const na = atA + atB;
  const nb = load.ok.get('b') ?? 0;
  t.equal(load.failed, 0, 'no request failed');
  t.ok(na + nb > 60, `the fleet served (${na} of a, ${nb} of b)`);
  // alone, B would give b half of B's dispatches and A none: about a quarter of the fleet's
  const share = nb / (na + nb);
  t.ok(share >= 0.4, `tenant b, queued only at B, got ${(100 * share).toFixed(1)} % of the fleet's answers (fair: 50 %; B alone would give it ~25 %)`);
  // inside tenant a, the fleet's oldest request goes first: its clients at A are not starved by those at B
  t.ok(Math.min(atA, atB) >= 0.5 * Math.max(atA, atB), `tenant a's answers through A and through B: ${atA} / ${atB}`);
  const metrics = await (await fetch(`${a.url}/metrics`)).text();
  if (process.env.SWY_DEBUG) for (const r of [a, b]) t.comment((await (await fetch(`${r.url}/metrics`)).text()).split('\n').filter((l) => (l.includes('fleet_holds') || l.includes('flow_dispatched_total{')) && !l.startsWith('#') && !l.includes('overflow')).join('\n'));
  t.match(metrics, /switchyard_flow_fleet_holds_total\{pool="open-model",band="[a-z]+",outcome="taken"\} [1-9]/, 'A held capacity for B');
});

t.test('premium queued at B is served ahead of standard queued at A', async (t) => {
  const { a, b } = await twoReplicas(t, 'swy-ff-band');
  const load: Load = { ok: new Map(), failed: 0 };
  const stop = { done: false };
  const runs: Promise<void>[] = [];
  for (let i = 0; i < 10; i++) runs.push(loop(a.url, 'standard', { 'x-tenant-id': 's' }, 6, stop, load));
  // premium's demand is all four slots
  for (let i = 0; i < 4; i++) runs.push(loop(b.url, 'premium', { 'x-tenant-id': 'p' }, 6, stop, load));
  await sleep(3000);
  stop.done = true;
  await Promise.all(runs);
  const ns = load.ok.get('standard') ?? 0;
  const np = load.ok.get('premium') ?? 0;
  t.equal(load.failed, 0, 'no request failed');
  const share = np / (np + ns);
  t.ok(share >= 0.6, `premium, queued only at B, got ${(100 * share).toFixed(1)} % of the answers (its demand: all 4 slots; A alone keeps refilling its own with standard)`);
});

/**
 * One replica's flow controller of pool m with its FleetFlows exchange (holds of 40 ms), no router around it;
 * its utilisation is `load.inFlight / 2`.
 */
function replica(t: Tap.Test, inFlight: number) {
  // the hold's timer is unref'd (a router's listeners keep its loop alive): the test keeps its own
  const alive = setInterval(() => {}, 1000);
  t.teardown(() => clearInterval(alive));
  const flows = new FleetFlows(40);
  const fc = validateFlowControl({ admission: { mode: 'off' } }).value!;
  const load = { inFlight };
  const ctl = new FlowController({ config: fc, utilisation: () => load.inFlight / 2, sweepTimer: false, pool: 'm' });
  t.teardown(() => ctl.close());
  ctl.attachFleet(flows.view('m', fc.bands));
  return { flows, fc, load, ctl, band: fc.bands.indexOf('standard') };
}

t.test("the exchange: a peer's malformed flows are skipped and counted; a silent peer holds capacity at most flowHoldMs", async (t) => {
  const { flows, fc, load, ctl, band } = replica(t, 0);
  t.ok(band >= 0);
  let changed = 0;
  flows.attach({ fleetReport: (out, max) => ctl.fleetReport(out, max, fc.bands) }, () => {
    changed++;
    ctl.onCapacity();
  });
  // garbage of every kind: wrong types, a name too long, a count that is not a number, a ragged tail
  flows.setPeer('r1', ['m', 'standard', 'x'.repeat(600), 1, 1, 0, 0, 'm', 7, 'y', 1, 1, 0, 0, 'm', 'standard', 'z', 'NaN', 1, 0, 0, 'm', 'standard', 'w', 1, 1, -3, 0, 'm', 'standard', 'v', 1, 1, 0, 1e12, 'm', 'standard']);
  t.equal(flows.peers, 0, 'nothing of it was taken');
  t.ok(flows.malformed >= 6, `each bad tuple counted (${flows.malformed})`);
  flows.setPeer('r1', { not: 'an array' });
  flows.setPeer('r1', 'nope');
  t.equal(flows.peers, 0);
  // a well-formed report over the cap is cut at MAX_FLOW_TUPLES
  const big: unknown[] = [];
  for (let i = 0; i < 5000; i++) big.push('m', 'standard', `f${i}`, 0, 1, 0, 0);
  flows.setPeer('r2', big);
  t.equal(flows.band('m', 'standard')!.flows.size, 1024, 'at most 1,024 flows of one peer');
  flows.dropPeer('r2');
  t.equal(flows.band('m', 'standard'), undefined, 'dropped whole');

  // another replica's flow "b" is queued and under its share; ours ("a") would be over it
  load.inFlight = 1;
  const first = ctl.admit({ flowId: 'a', band, bytes: 1 });
  t.ok(!(first instanceof Promise) && first.ok, 'a is let through while nobody queues');
  flows.setPeer('r3', ['m', 'standard', 'b', 0, 5, 0, 10]);
  t.ok(changed > 0, 'a change pumps the controller');
  const t0 = performance.now();
  const held = ctl.admit({ flowId: 'a', band, bytes: 1 });
  t.ok(held instanceof Promise, 'with another replica queueing, a new request queues here');
  const r = await held;
  const waited = performance.now() - t0;
  t.ok(r.ok, 'and is dispatched');
  // r3 never reports again: the hold ran out, and the capacity was used here
  t.ok(waited >= 35, `it waited the hold out (${waited.toFixed(0)} ms of 40)`);
  t.ok(waited < 1000, `but not longer than the hold and a turn of the loop (${waited.toFixed(0)} ms)`);
  t.equal(ctl.bandStats[band]!.fleetHoldsExpired, 1, 'counted as a hold that expired');
  // until r3 reports something new, no other hold: the next request goes at once (through the queue)
  load.inFlight = 1;
  const t1 = performance.now();
  const next = await ctl.admit({ flowId: 'a', band, bytes: 1 });
  t.ok(next.ok && performance.now() - t1 < 30, 'no second hold for the same silent peer');
  // another replica queues in this pool: our report names each flow's requests in flight and queued
  const mine = flows.report()!;
  t.same(mine.slice(0, 5), ['m', 'standard', 'a', 3, 0], "this replica's flows, for r3's shares");
  t.equal(mine[6], 0, 'nothing queued: no age');
  t.ok((mine[5] as number) > 2 && (mine[5] as number) <= 3, `with its recent dispatches (${mine[5]}: three, decaying)`);
  flows.dropPeer('r3');
  t.equal(flows.report(), undefined, 'nobody queues anywhere: nothing to report');
});

t.test('a peer stuck with the same queue costs one hold, not one per report; arrivals dispatched at once send no nudges', async (t) => {
  const { flows, fc, load, ctl, band } = replica(t, 1);
  let nudges = 0;
  flows.onNudge(() => nudges++);
  flows.attach({ fleetReport: (out, max) => ctl.fleetReport(out, max, fc.bands) }, () => ctl.onCapacity());
  // one of ours in flight (never released here): "a" is over the fleet share of a flow with none
  const first = ctl.admit({ flowId: 'a', band, bytes: 1 });
  t.ok(!(first instanceof Promise) && first.ok, 'a is let through while nobody queues');
  const v0 = flows.version('m');
  // r3 queues 5 of flow "b" and never dispatches them: it reports the same counts every 10 ms, its ages growing and its dispatch count decaying
  let age = 10;
  let served = 3;
  const report = () => flows.setPeer('r3', ['m', 'standard', 'b', 0, 5, served, age]);
  report();
  t.equal(flows.version('m'), v0 + 1, 'a new peer moves the version');
  const stuck = setInterval(() => {
    age += 10;
    served *= 0.99;
    report();
  }, 10);
  t.teardown(() => clearInterval(stuck));
  const v1 = flows.version('m');
  await sleep(25);
  t.equal(flows.version('m'), v1, 'the same counts with older ages and a decayed dispatch count do not move it');
  t.equal(flows.version('other'), 0, 'a pool with no view has none');
  nudges = 0;
  const t0 = performance.now();
  const r1 = await ctl.admit({ flowId: 'a', band, bytes: 1 });
  t.ok(r1.ok && performance.now() - t0 >= 35, 'the first request waits one hold out');
  t.equal(ctl.bandStats[band]!.fleetHolds, 1);
  t.equal(nudges, 1, 'the hold announced itself once');
  // ten more while r3 keeps reporting the same: none of them is held, none sends a message
  nudges = 0;
  for (let i = 0; i < 10; i++) {
    const t1 = performance.now();
    const r = await ctl.admit({ flowId: 'a', band, bytes: 1 });
    t.ok(r.ok && performance.now() - t1 < 30, `request ${i} goes at once`);
    await sleep(5);
  }
  t.equal(ctl.bandStats[band]!.fleetHolds, 1, 'still one hold in all (before the fix: one per report)');
  t.equal(nudges, 0, 'requests queued and dispatched in one loop send nothing (before: one each)');
  // r3's queue moves (one dispatched): that is new, and a hold may start again
  clearInterval(stuck);
  flows.setPeer('r3', ['m', 'standard', 'b', 1, 4, served, age]);
  t.ok(flows.version('m') > v1, 'a changed count moves the version');
  const r2 = await ctl.admit({ flowId: 'a', band, bytes: 1 });
  t.ok(r2.ok);
  t.equal(ctl.bandStats[band]!.fleetHolds, 2, 'a second hold, for the new report');
  // no capacity here: a request that stays queued is announced once for the episode
  flows.dropPeer('r3');
  nudges = 0;
  load.inFlight = 2;
  const q1 = ctl.admit({ flowId: 'a', band, bytes: 1 });
  const q2 = ctl.admit({ flowId: 'a', band, bytes: 1 });
  t.ok(q1 instanceof Promise && q2 instanceof Promise, 'both queue (the pool is full)');
  await sleep(5);
  t.equal(nudges, 1, 'one nudge for the queue episode, not one per request');
  // a higher band starts to wait in the same episode: the others hold their lower bands for it, so they hear of it now
  const top = fc.bands.indexOf('premium');
  t.ok(top >= 0 && top < band);
  const q3 = ctl.admit({ flowId: 'p', band: top, bytes: 1 });
  const q4 = ctl.admit({ flowId: 'p', band: top, bytes: 1 });
  t.ok(q3 instanceof Promise && q4 instanceof Promise);
  await sleep(5);
  t.equal(nudges, 2, 'one more for the higher band, and only one');
  load.inFlight = 1;
  for (const q of [q3, q4, q1, q2]) {
    ctl.onCapacity();
    t.ok((await q).ok);
  }
});

t.test('progress, not change: a peer stuck in one pool and busy in another, or whose queue only wobbles, costs one hold; a queue emptied mid-hold leaves no stale hold', async (t) => {
  const { flows, fc, ctl, band } = replica(t, 1);
  flows.view('n', fc.bands); // this replica serves pool n too (its own controller is not needed here)
  flows.attach({ fleetReport: (out, max) => ctl.fleetReport(out, max, fc.bands) }, () => ctl.onCapacity());
  const first = ctl.admit({ flowId: 'a', band, bytes: 1 });
  t.ok(!(first instanceof Promise) && first.ok, 'one of ours in flight: "a" is over the share of a flow with none');

  // r3 is stuck in m (flow b: 5 or 6 queued as arrivals come and expire, none dispatched) and busy in n
  let k = 0;
  let age = 10;
  const report = () => {
    k++;
    age += 10;
    flows.setPeer('r3', ['m', 'standard', 'b', 0, 5 + (k % 2), 0, age, 'n', 'standard', 'x', k % 7, 3, k, 5]);
  };
  report();
  const vm = flows.version('m');
  const vn = flows.version('n');
  const tick = setInterval(report, 10);
  t.teardown(() => clearInterval(tick));
  await sleep(35);
  t.equal(flows.version('m'), vm, "m's version stays: a wobbling queue and another pool's work are not progress in m");
  t.ok(flows.version('n') > vn, "n's moves with r3's dispatches there");
  for (let i = 0; i < 6; i++) {
    const r = await ctl.admit({ flowId: 'a', band, bytes: 1 });
    t.ok(r.ok, `request ${i} dispatched`);
    await sleep(10);
  }
  t.equal(ctl.bandStats[band]!.fleetHolds, 1, 'one hold for six requests (before: one per report)');
  t.equal(ctl.bandStats[band]!.fleetHoldsExpired, 1);
  clearInterval(tick);

  // r3 dispatches one of b (in flight 0 → 1): progress, so a hold may start again; the request it holds is cancelled mid-hold
  flows.setPeer('r3', ['m', 'standard', 'b', 1, 4, 1, 5]);
  let abort: (() => void) | null = null;
  const signal = {
    aborted: false,
    set onabort(f: (() => void) | null) {
      abort = f;
    },
  };
  const held = ctl.admit({ flowId: 'a', band, bytes: 1 }, signal);
  t.ok(held instanceof Promise, 'queued behind r3');
  await sleep(10);
  t.equal(ctl.bandStats[band]!.fleetHolds, 2, 'a second hold started');
  abort!();
  const gone = await held;
  t.notOk(gone.ok, 'the cancelled request leaves');
  await sleep(50);
  // r3 progresses again: the next request gets a whole hold, not one left over from the cancelled one
  flows.setPeer('r3', ['m', 'standard', 'b', 2, 3, 2, 5]);
  const t0 = performance.now();
  const next = await ctl.admit({ flowId: 'a', band, bytes: 1 });
  const waited = performance.now() - t0;
  t.ok(next.ok);
  t.equal(ctl.bandStats[band]!.fleetHolds, 3, 'a third hold, counted');
  t.ok(waited >= 35, `and held its whole flowHoldMs (${waited.toFixed(1)} ms of 40; before: a stale start ran it out at once)`);
});
