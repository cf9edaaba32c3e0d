// Flow-aware shedding (docs/flow-control.md, "Shedding"): when a band must
// shed, the victim is the flow furthest over its fair share; a flow at or
// under its share is not shed while an over-share flow exists; the victim's
// oldest queued request makes room. Real FlowController over the native
// queues, with a utilisation the test sets and a seeded admission draw.
import t from 'tap';
import { FlowController, type AdmitResult } from '../../src/flow/controller.js';
import { validateFlowControl, type FlowControlConfig } from '../../src/flow/config.js';
import { FlowControlGate } from '../../src/flow/gate.js';
import { Registry } from '../../src/metrics/prom.js';
import { flush } from '../support/flow-util.js';

function config(raw: Record<string, unknown>): FlowControlConfig {
  const { value, errors } = validateFlowControl(raw);
  if (!value) throw new Error(errors.join('\n'));
  return value;
}

/** A controller whose utilisation the test sets (`u.value`); nothing is dispatched from the queue while u >= maxUtilisation. */
function harness(raw: Record<string, unknown>, rng: () => number = Math.random) {
  const u = { value: 0.9 };
  const ctl = new FlowController({ config: config(raw), utilisation: () => u.value, now: () => 0, sweepTimer: false, rng });
  t.teardown(() => ctl.close());
  return { ctl, u };
}

/** Admits and records how it ended: 'granted', 'queued' (still waiting), or the rejection reason. */
function submit(ctl: FlowController, flowId: string, band = 1) {
  const out = { state: 'queued' as string, id: flowId };
  const r = ctl.admit({ flowId, band, bytes: 10 });
  const settle = (x: AdmitResult) => {
    out.state = x.ok ? 'granted' : x.reason;
  };
  if (r instanceof Promise) r.then(settle);
  else settle(r);
  return out;
}

const STANDARD = (extra: Record<string, unknown> = {}) => ({ flows: [], admission: { mode: 'utilisation', maxUtilisation: 0.85 }, ...extra });

t.test('a flow under its share is not shed while a flooding flow of its band has requests queued; the flood gives up its oldest', async (t) => {
  const { ctl, u } = harness(STANDARD());
  // a floods while the pool is busy but admitting (u between maxUtilisation and 1: the draw may pass)
  u.value = 0.86;
  const a = Array.from({ length: 8 }, () => submit(ctl, 'tenant:a'));
  await flush();
  t.equal(a.filter((x) => x.state === 'queued').length + a.filter((x) => x.state === 'rejected-saturated').length, 8);
  const queuedA = a.filter((x) => x.state === 'queued');
  t.ok(queuedA.length >= 5, `a has requests queued (${queuedA.length})`);
  // saturated: every standard arrival must shed something
  u.value = 1;
  const b = Array.from({ length: 3 }, () => submit(ctl, 'tenant:b'));
  await flush();
  t.same(b.map((x) => x.state), ['queued', 'queued', 'queued'], 'b (under its share) is queued, not shed');
  // a's three oldest queued requests made room, in arrival order
  t.same(
    queuedA.map((x) => x.state),
    queuedA.map((_, i) => (i < 3 ? 'rejected-saturated' : 'queued')),
    "a's oldest queued requests were shed",
  );
  // a's own arrival: a is the flow furthest over its share: it is shed itself
  const a2 = submit(ctl, 'tenant:a');
  await flush();
  t.equal(a2.state, 'rejected-saturated', "a's new arrival is shed");
  t.equal(ctl.flowState('tenant:b', 1)!.queued, 3);
});

t.test('admission.shedding: arrival keeps the flow-blind behaviour (the arriving request is shed)', async (t) => {
  const { ctl, u } = harness(STANDARD({ admission: { mode: 'utilisation', shedding: 'arrival' } }));
  u.value = 0.86;
  const a = Array.from({ length: 8 }, () => submit(ctl, 'tenant:a'));
  await flush();
  const queuedBefore = a.filter((x) => x.state === 'queued').length;
  u.value = 1;
  const b = Array.from({ length: 3 }, () => submit(ctl, 'tenant:b'));
  await flush();
  t.same(b.map((x) => x.state), ['rejected-saturated', 'rejected-saturated', 'rejected-saturated']);
  t.equal(a.filter((x) => x.state === 'queued').length, queuedBefore, "a's queue is untouched");
});

t.test('requests in flight count: a flow whose requests hold the pool is over its share even with nothing queued', async (t) => {
  const { ctl, u } = harness(STANDARD());
  u.value = 0;
  const a = Array.from({ length: 6 }, () => submit(ctl, 'tenant:a'));
  await flush();
  t.same(a.map((x) => x.state), Array(6).fill('granted'), 'a holds six requests in flight');
  u.value = 1;
  const b = submit(ctl, 'tenant:b');
  await flush();
  t.equal(b.state, 'queued', 'b is not shed: a is over its share (nothing of it to shed, so nobody is)');
  // a flow alone in its band is at its share: the band sheds the arrival as before
  const lone = submit(ctl, 'tenant:lone', 2);
  await flush();
  t.equal(lone.state, 'rejected-saturated', 'alone in band best-effort: the arrival is shed');
});

t.test('shares follow minShare: the flow furthest over its weighted share is the victim', async (t) => {
  const { ctl, u } = harness(
    STANDARD({ flows: [{ id: 'tenant:big', priority: 'standard', minShare: 0.6 }, { id: 'tenant:small', priority: 'standard' }] }),
    // every draw admits while u < 1: a random shed during the fill would take a request from big (over its
    // share while small is still filling) and leave the set-up one short
    () => 0,
  );
  u.value = 0.86;
  const rng = { n: 0 };
  // fill: big 6 queued, small 3 queued (u between maxUtilisation and 1: queued, nothing dispatched)
  const big: { state: string }[] = [];
  const small: { state: string }[] = [];
  while (big.filter((x) => x.state === 'queued').length < 6 && rng.n++ < 200) {
    big.push(submit(ctl, 'tenant:big'));
    await flush();
  }
  while (small.filter((x) => x.state === 'queued').length < 3 && rng.n++ < 400) {
    small.push(submit(ctl, 'tenant:small'));
    await flush();
  }
  t.equal(ctl.flowState('tenant:big', 1)!.queued, 6);
  t.equal(ctl.flowState('tenant:small', 1)!.queued, 3);
  u.value = 1;
  // c arrives: total 10; weights big 0.6, small 0.2, c 0.2: small (3 > 2) is over, big (6 = 6) is not
  const c = submit(ctl, 'tenant:c');
  await flush();
  t.equal(c.state, 'queued');
  t.equal(ctl.flowState('tenant:big', 1)!.queued, 6, 'big, at its 60% share, is not shed');
  t.equal(ctl.flowState('tenant:small', 1)!.queued, 2, 'small, over its share, gave up a request');
});

t.test('a full band queue makes room by shedding the over-share flow (rejected-capacity), not the newcomer', async (t) => {
  const { ctl, u } = harness({ flows: [], admission: { mode: 'off' }, limits: { bands: { standard: { maxRequests: 4 } } } });
  u.value = 0.9; // nothing dispatched from the queue
  const a = Array.from({ length: 5 }, () => submit(ctl, 'tenant:a'));
  await flush();
  t.same(a.map((x) => x.state), ['queued', 'queued', 'queued', 'queued', 'rejected-capacity'], 'a alone: the limit sheds its arrival');
  const b = [submit(ctl, 'tenant:b'), submit(ctl, 'tenant:b')];
  await flush();
  t.same(b.map((x) => x.state), ['queued', 'queued'], 'b takes the room');
  t.same(a.slice(0, 4).map((x) => x.state), ['rejected-capacity', 'rejected-capacity', 'queued', 'queued'], "a's two oldest made room");
  // now a 2, b 2: equal; a third b would put b over its share: b's arrival is shed
  const b3 = submit(ctl, 'tenant:b');
  await flush();
  t.equal(b3.state, 'rejected-capacity');
});

t.test('the top band is never shed by admission, whatever the flows', async (t) => {
  const { ctl, u } = harness(STANDARD());
  u.value = 0.99;
  const xs = Array.from({ length: 20 }, (_, i) => submit(ctl, i % 2 ? 'tenant:a' : 'tenant:b', 0));
  await flush();
  t.notOk(xs.some((x) => x.state.startsWith('rejected')), 'premium requests are granted or held, never shed');
});

t.test('per-flow shed counts in /metrics, with bounded labels', async (t) => {
  const cfg = config(STANDARD({ maxFlows: 2 }));
  const u = { value: 0.86 };
  const gate = new FlowControlGate({ config: cfg, utilisation: () => u.value, now: () => 0, rng: () => 0 });
  t.teardown(() => gate.close());
  const registry = new Registry();
  gate.registerMetrics(registry);
  const sig = () => ({ aborted: false, onabort: null });
  const info = (tenant: string, priority = '') => ({ model: 'm', headers: { 'x-tenant-id': tenant, 'x-priority': priority }, bodyBytes: 10 });
  const held: Promise<unknown>[] = [];
  for (let i = 0; i < 8; i++) held.push(Promise.resolve(gate.admit(info('a'), sig())));
  u.value = 1;
  for (let i = 0; i < 3; i++) held.push(Promise.resolve(gate.admit(info('b'), sig())));
  await flush();
  // many distinct flows in another band, each shed at arrival (beyond maxFlows they share the overflow queue)
  for (let i = 0; i < 40; i++) held.push(Promise.resolve(gate.admit(info(`x${i}`, 'batch'), sig())));
  await flush();
  const text = await registry.metrics();
  const shed = text.split('\n').filter((l) => l.startsWith('switchyard_flow_shed_total{'));
  const a = shed.find((l) => l.includes('flow="tenant:a"'));
  t.ok(a, 'a series for the flooding flow');
  t.equal(Number(a!.split(' ').pop()), 3, `a was shed to make room for b: ${a}`);
  t.notOk(shed.some((l) => l.includes('flow="tenant:b"')), 'b was never shed');
  t.ok(shed.length <= 4 * 2 + 2, `series bounded by 4 × maxFlows per band (+ overflow, other): ${shed.length}`);
  gate.close();
  await Promise.allSettled(held);
});
