// Flow control's prefill-backlog signal (flowControl.saturation.prefillBacklogTokens)
// over real sockets: a simulated engine that prefills one request after another
// (serial prefill, 400 µs per uncached token), the router in front of it.
//
// With the signal on, an endpoint with more than the threshold of uncached
// prompt tokens dispatched and not yet answered (and at least two requests:
// one prefilling, one queued behind it) is saturated: a cold request that
// arrives then waits in the router, and a continuation of an active
// conversation that arrives after it is dispatched first (turn priority), so
// it is prefilled before the cold one. With it off, both go to the engine at
// once and the continuation waits behind the cold prefill there. The backlog
// is released on every path: first byte, client abort, engine error.
import t from 'tap';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import { parseConfig } from '../../src/config/load.js';
import { ConfigError } from '../../src/errors.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';
import { SaturationDetector } from '../../src/flow/saturation.js';
import { validateFlowControl } from '../../src/flow/config.js';
import { routerOverEngine, validatePlugin } from '../support/router-util.js';
import { parseProm, send } from '../support/sim-util.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** ~1,500 tokens of the simulator's 4-byte tokens: 600 ms of prefill at 400 µs/token. */
const cold = (tag: string) => `${tag} ` + 'lorem ipsum dolor sit amet '.repeat(222);

async function setup(
  t: Tap.Test,
  backlogTokens: number,
  engineOpts: Partial<Parameters<typeof startEngine>[0]> = {},
  admission = 'admission: { mode: "off" }',
): Promise<{ router: RunningRouter; engine: SimEngine }> {
  return routerOverEngine(
    t,
    { itlMs: 5, prefillOverheadMs: 1, prefillUsPerToken: 400, maxNumSeqs: 64, seed: 5, ...engineOpts },
    `flowControl:
  ${admission}
  saturation: { prefillBacklogTokens: ${backlogTokens} }
  turnPriority: { enabled: true, maxColdWait: 30s }
`,
    'prefill-backlog',
  );
}

function chat(url: string, content: string, headers: Record<string, string> = {}, maxTokens = 2) {
  return send(url, 'POST', '/v1/chat/completions', { model: 'open-model', messages: [{ role: 'user', content }], max_tokens: maxTokens, stream: true }, headers);
}

/** performance.now() when the request's first body byte arrived, and its status. */
async function firstByteAt(p: ReturnType<typeof chat>): Promise<{ at: number; status: number }> {
  await p.first;
  const at = performance.now();
  const r = await p.done;
  return { at, status: r.status };
}

async function metrics(url: string) {
  return parseProm(await (await fetch(`${url}/metrics`)).text());
}

async function backlog(url: string): Promise<number> {
  const m = await metrics(url);
  return m.samples.filter((s) => s.name === 'switchyard_endpoint_prefill_backlog_tokens').reduce((a, s) => a + s.value, 0);
}

/**
 * One agent turn, then cold requests A and B (A prefills, B queues behind it
 * at the engine: the backlog is full), a cold request C, and the agent's next
 * turn. Returns whether the agent's turn had its first byte before C's.
 */
async function race(t: Tap.Test, backlogTokens: number) {
  const { router } = await setup(t, backlogTokens);
  const url = router.url;
  const first = await chat(url, 'agent turn 1', { 'x-session-id': 'agent' }).done;
  t.equal(first.status, 200);
  const a = firstByteAt(chat(url, cold('A')));
  await sleep(30);
  const b = firstByteAt(chat(url, cold('B')));
  await sleep(30);
  const during = await backlog(url);
  const c = firstByteAt(chat(url, cold('C')));
  await sleep(40);
  const agent = firstByteAt(chat(url, 'agent turn 2', { 'x-session-id': 'agent' }));
  const [ra, rb, rc, rAgent] = await Promise.all([a, b, c, agent]);
  t.ok(ra.status === 200 && rb.status === 200 && rc.status === 200 && rAgent.status === 200, 'everything is served');
  const m = await metrics(url);
  const fromQueue = m.samples.filter((s) => s.name === 'switchyard_flow_continuations_total').reduce((x, s) => x + s.value, 0);
  return { during, agentBeforeC: rAgent.at < rc.at, gapMs: rc.at - rAgent.at, fromQueue, after: await backlog(url) };
}

t.test('on: the cold request waits in the router and the continuation is prefilled first', async (t) => {
  const r = await race(t, 1000);
  t.ok(r.during >= 3000, `while A prefills, A and B are the backlog (${r.during})`);
  t.ok(r.agentBeforeC, `the agent's next turn has its first byte before the cold request C queued before it (by ${r.gapMs.toFixed(0)} ms)`);
  t.ok(r.gapMs > 300, 'by about a whole cold prefill');
  t.equal(r.fromQueue, 1, 'the continuation was dispatched from the flow-control queue');
  t.equal(r.after, 0, 'the backlog is back to 0 when everything ended');
});

t.test('off (prefillBacklogTokens: 0): both go to the engine at once; the continuation waits behind the cold prefill', async (t) => {
  const r = await race(t, 0);
  t.ok(r.during >= 3000, `the backlog is still counted (${r.during})`);
  t.notOk(r.agentBeforeC, `the agent's next turn waits behind the cold request C (by ${(-r.gapMs).toFixed(0)} ms)`);
  t.equal(r.fromQueue, 0, 'nothing was held');
  t.equal(r.after, 0);
});

t.test('probabilistic admission (the default) does not shed for a backlog: the request waits and is served', async (t) => {
  const { router } = await setup(t, 1000, {}, '# admission: the default (probabilistic, maxUtilisation 0.85)');
  const url = router.url;
  const a = firstByteAt(chat(url, cold('A')));
  await sleep(30);
  const b0 = firstByteAt(chat(url, cold('B')));
  await sleep(30);
  t.ok((await backlog(url)) >= 3000, 'every endpoint has a full backlog');
  const b = await firstByteAt(chat(url, cold('C')));
  const ra = await a;
  await b0;
  t.equal(b.status, 200, 'the standard-band request is served, not shed');
  t.ok(b.at > ra.at, 'after the backlog drained (it was held)');
  const m = await metrics(url);
  t.equal(m.samples.filter((s) => s.name === 'switchyard_flow_rejected_total').reduce((x, s) => x + s.value, 0), 0, 'nothing rejected');
});

t.test('a client that leaves during its prefill releases the backlog (and the held request it blocked goes)', async (t) => {
  const { router } = await setup(t, 1000);
  const url = router.url;
  const a = chat(url, cold('A'));
  await sleep(30);
  const b = firstByteAt(chat(url, cold('B')));
  await sleep(30);
  const full = await backlog(url);
  t.ok(full >= 3000, `A and B are the backlog (${full})`);
  const c = firstByteAt(chat(url, 'small request'));
  await sleep(40);
  t.equal(await backlog(url), full, 'the small request is held (the backlog is full)');
  a.destroy();
  await a.done;
  await sleep(40);
  const left = await backlog(url);
  t.ok(left < full - 1400 && left > 1400, `A's tokens left at once; B and the released small request remain (${left})`);
  const [rb, rc] = await Promise.all([b, c]);
  t.ok(rb.status === 200 && rc.status === 200, 'the others are served');
  await sleep(20);
  t.equal(await backlog(url), 0, 'nothing is left in the backlog');
});

t.test('an engine error before the first byte releases the backlog', async (t) => {
  const { router } = await setup(t, 1000, { failureRate: 1, failureKinds: ['500'] });
  const url = router.url;
  const r = await chat(url, cold('A')).done;
  t.ok(r.status >= 500, `the engine's failure reaches the client (${r.status})`);
  t.equal(await backlog(url), 0, 'nothing is left in the backlog');
  // and the next request is not held behind a stale estimate
  const t0 = performance.now();
  const again = await chat(url, 'small').done;
  t.ok(again.status >= 500 && performance.now() - t0 < 2000, 'the next request goes at once');
  t.equal(await backlog(url), 0);
});

t.test('the detector: the backlog term, weighed by the pool prefill cost, 0 = off', async (t) => {
  const ep = (pending: number, factor = 1) => ({
    inFlight: 1,
    metrics: { waiting: 0, kvUsage: NaN },
    fresh: () => false,
    occupancy: () => 1,
    batchLimit: 16,
    prefillPending: pending,
    prefillCostFactor: factor,
  });
  const on = new SaturationDetector({ queueDepthThreshold: 5, kvThreshold: 0.9, maxConcurrency: 64, prefillBacklogTokens: 2048 });
  t.equal(on.load(ep(1024), 0), 0.5);
  t.ok(on.saturated(ep(2048), 0));
  t.ok(on.saturated(ep(1024, 2)), 'a pool twice as slow at prefill saturates at half the tokens');
  t.equal(on.load(ep(0), 0), 1 / 16, 'no backlog: the other terms');
  const counted = (pending: number, requests: number) => ({ ...ep(pending), prefillRequests: requests });
  t.equal(on.load(counted(8192, 1), 0), 1 / 16, 'one request alone (prefilling, nothing queued behind it) does not saturate');
  t.equal(on.load(counted(8192, 2), 0), 4, 'two: the term applies');
  const off = new SaturationDetector({ queueDepthThreshold: 5, kvThreshold: 0.9, maxConcurrency: 64, prefillBacklogTokens: 0 });
  t.equal(off.load(ep(1e6), 0), 1 / 16, 'off: the backlog is not read');
});

t.test('config: default, and errors name the field', async (t) => {
  t.equal(validateFlowControl({}).value?.saturation.prefillBacklogTokens, 2048, 'on by default with flow control');
  t.equal(validateFlowControl({ saturation: { prefillBacklogTokens: 0 } }).value?.saturation.prefillBacklogTokens, 0);
  for (const bad of [-1, 1.5, 'lots', 2e9]) {
    const { errors } = validateFlowControl({ saturation: { prefillBacklogTokens: bad } });
    t.match(errors[0], /^flowControl\.saturation\.prefillBacklogTokens: /, `${JSON.stringify(bad)}: ${errors[0]}`);
  }
  const { errors } = validateFlowControl({ saturation: { prefillBacklog: 10 } });
  t.match(errors.join('\n'), /flowControl\.saturation\.prefillBacklog: .*prefillBacklogTokens/, 'an unknown field lists the known ones');
  let err: unknown;
  try {
    parseConfig(
      `apiVersion: switchyard/v1\nkind: Router\npools: [{ name: p, engine: vllm, models: [m], endpoints: [{ name: e, url: "http://127.0.0.1:1" }] }]\nflowControl: { saturation: { prefillBacklogTokens: -5 } }\n`,
      validatePlugin,
      'x',
    );
  } catch (e) {
    err = e;
  }
  t.ok(err instanceof ConfigError, 'the router config is refused');
  t.match((err as Error).message, /flowControl\.saturation\.prefillBacklogTokens/, 'naming the path');
});

t.test('P/D: the prefill leg is counted on its prefill endpoint, not on the decode endpoint', async (t) => {
  const p0 = await startEngine({ role: 'prefill', prefillOverheadMs: 1, prefillUsPerToken: 400, itlMs: 5 });
  const d0 = await startEngine({ role: 'decode', prefillOverheadMs: 1, prefillUsPerToken: 400, itlMs: 5 });
  const cfg = parseConfig(
    `apiVersion: switchyard/v1
kind: Router
pools:
  - name: p
    engine: vllm
    models: [open-model]
    endpoints:
      - { name: p0, url: "${p0.url}", role: prefill }
      - { name: d0, url: "${d0.url}", role: decode }
logging: { level: silent }
disaggregation: { thresholdTokens: 256, prefillTimeoutMs: 5000 }
flowControl: { admission: { mode: "off" } }
`,
    validatePlugin,
    'prefill-backlog-pd',
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(async () => {
    await router.close(200);
    await p0.close();
    await d0.close();
  });
  const per = async () => {
    const m = await metrics(router.url);
    const v = (ep: string) => m.samples.find((s) => s.name === 'switchyard_endpoint_prefill_backlog_tokens' && s.labels.endpoint === ep)?.value ?? -1;
    return { p0: v('p0'), d0: v('d0') };
  };
  const r = chat(router.url, cold('long'));
  await sleep(150);
  const during = await per();
  t.ok(during.p0 >= 1000, `the prefill endpoint holds the prompt's tokens while its leg runs (${during.p0})`);
  t.equal(during.d0, 0, 'the decode endpoint is not charged for a prefill it does not run');
  const done = await r.done;
  t.equal(done.status, 200);
  t.equal(done.headers['x-switchyard-prefill-endpoint'], 'p0', 'it was disaggregated');
  t.same(await per(), { p0: 0, d0: 0 }, 'both are back to 0');
});

t.test('a non-streamed answer is not in the backlog: its only chunk comes after the decode, the engine gets the next prefill at once', async (t) => {
  const { router, engine } = await setup(t, 1000);
  const url = router.url;
  // three cold prompts of ~600 ms of prefill each, 200 output tokens (~1 s of decode), answered whole
  const whole = (tag: string, maxTokens: number) =>
    send(url, 'POST', '/v1/chat/completions', { model: 'open-model', messages: [{ role: 'user', content: cold(tag) }], max_tokens: maxTokens });
  const reqs = [whole('A', 200)];
  await sleep(30);
  reqs.push(whole('B', 200));
  await sleep(30);
  reqs.push(whole('C', 200));
  await sleep(100);
  const s = engine.stats();
  t.equal(await backlog(url), 0, 'nothing counted: the router cannot see these prefills end');
  t.equal(s.running + s.waiting, 3, `all three are at the engine, none held in the router (running ${s.running}, waiting ${s.waiting})`);
  for (const r of await Promise.all(reqs.map((p) => p.done))) t.equal(r.status, 200);
  // a non-streamed request for one token answers right after its prefill: still counted
  const one = [whole('D', 1)];
  await sleep(30);
  one.push(whole('E', 1));
  await sleep(30);
  t.ok((await backlog(url)) >= 3000, 'max_tokens 1: its answer is its first token, so it is in the backlog');
  for (const r of await Promise.all(one.map((p) => p.done))) t.equal(r.status, 200);
  t.equal(await backlog(url), 0, 'and released');
});
