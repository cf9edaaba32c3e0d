// Admission mode probabilistic (docs/flow-control.md, "Admission"): a lower
// band's request is held while the backlog can drain within its TTL at the
// measured drain rate, and shed only under sustained overload (the band's
// oldest queued request above admission.target for admission.interval), about
// the excess; 429s carry a Retry-After derived from the drain rate.
//
// The real FlowController over the native queues, with a virtual clock and a
// pool of `slots` requests of `serviceMs` each (utilisation = in flight /
// slots); the sweep tick runs every 250 ms of virtual time as its timer would.
// The same rules through the real router and simulated engines are in
// flow-drain-e2e.test.ts.
import t from 'tap';
import { FlowController, type AdmitResult } from '../../src/flow/controller.js';
import { validateFlowControl, type FlowControlConfig } from '../../src/flow/config.js';
import { excessProbability, seededRng, WindowedRate } from '../../src/flow/admission.js';
import { flush } from '../support/flow-util.js';

function config(raw: Record<string, unknown>): FlowControlConfig {
  const { value, errors } = validateFlowControl(raw);
  if (!value) throw new Error(errors.join('\n'));
  return value;
}

interface Load {
  /** Band index, flow id and arrivals per second as a function of virtual time (ms). */
  band: number;
  flow: string;
  rate: (ms: number) => number;
}

interface Outcome {
  sent: number[];
  granted: number[];
  shed: number[];
  expired: number[];
  /** Longest wait from admit to grant, ms, per band. */
  maxWait: number[];
  maxQueued: number;
  retryAfter: number[];
  /** Requests still waiting when the run ended. */
  waiting: number;
}

/**
 * Runs `loads` against a pool of `slots` × `serviceMs` for `durationMs` of
 * virtual time in steps of `stepMs`, then lets the queue drain (no arrivals)
 * for `drainMs`. `stall` (ms, optional): from then on nothing completes.
 */
async function simulate(
  ctl: FlowController,
  clock: { now: number },
  o: { slots: number; serviceMs: number; loads: Load[]; durationMs: number; drainMs?: number; stepMs?: number; stall?: number; startMs?: number },
  out?: Outcome,
): Promise<Outcome> {
  const nb = 4;
  const res: Outcome = out ?? {
    sent: new Array(nb).fill(0),
    granted: new Array(nb).fill(0),
    shed: new Array(nb).fill(0),
    expired: new Array(nb).fill(0),
    maxWait: new Array(nb).fill(0),
    maxQueued: 0,
    retryAfter: [],
    waiting: 0,
  };
  const step = o.stepMs ?? 10;
  const running: { ticket: number; endsAt: number }[] = [];
  const acc = o.loads.map(() => 0);
  const start = o.startMs ?? clock.now;
  const end = start + o.durationMs;
  const stop = end + (o.drainMs ?? 0);
  let nextSweep = clock.now + 250;
  let pending = 0;
  const onResult = (band: number, at: number) => (x: AdmitResult) => {
    pending--;
    if (x.ok) {
      res.granted[band]!++;
      const w = clock.now - at;
      if (w > res.maxWait[band]!) res.maxWait[band] = w;
      running.push({ ticket: x.ticket, endsAt: clock.now + o.serviceMs });
    } else {
      if (x.reason === 'rejected-ttl-expired') res.expired[band]!++;
      else res.shed[band]!++;
      res.retryAfter.push(x.retryAfterSeconds);
    }
  };
  while (clock.now < stop) {
    // completions
    if (o.stall === undefined || clock.now < o.stall) {
      for (let i = running.length - 1; i >= 0; i--) {
        if (running[i]!.endsAt <= clock.now) {
          ctl.release(running[i]!.ticket);
          running.splice(i, 1);
        }
      }
    }
    // arrivals
    if (clock.now < end) {
      o.loads.forEach((l, i) => {
        acc[i]! += (l.rate(clock.now - start) * step) / 1000;
        while (acc[i]! >= 1) {
          acc[i]! -= 1;
          res.sent[l.band]!++;
          pending++;
          const r = ctl.admit({ flowId: l.flow, band: l.band, bytes: 100 });
          const done = onResult(l.band, clock.now);
          if (r instanceof Promise) r.then(done);
          else done(r);
        }
      });
    }
    if (clock.now >= nextSweep) {
      ctl.sweep(clock.now);
      nextSweep += 250;
    }
    // the dispatch loop grants one request per turn of the event loop
    for (let i = 0; i <= o.slots; i++) await flush();
    if (ctl.queued > res.maxQueued) res.maxQueued = ctl.queued;
    clock.now += step;
  }
  res.waiting = ctl.queued;
  return res;
}

function harness(raw: Record<string, unknown>, slots: number) {
  const clock = { now: 0 };
  let ctl!: FlowController;
  ctl = new FlowController({
    config: config(raw),
    utilisation: () => ctl.inFlight / slots,
    now: () => clock.now,
    sweepTimer: false,
    rng: seededRng(34),
  });
  t.teardown(() => ctl.close());
  return { ctl, clock };
}

const FLOWS = { flows: [{ id: 'tenant:premium', priority: 'premium', minShare: 0.3 }], queueCapacity: 4096 };

// 8 slots of 100 ms; lower bands are dispatched while the pool is below maxUtilisation 0.85 (this
// harness has no `step`), so they may hold 7: they drain about 70/s, the whole pool 80/s
const SLOTS = 8;
const SERVICE = 100;

t.test('the meters: a windowed rate without start-up bias, and the excess law', (t) => {
  const r = new WindowedRate(5000);
  r.add(5, 500);
  t.ok(Math.abs(r.rate - 10) < 1e-9, `5 events in 0.5 s read 10/s (${r.rate})`);
  for (let i = 0; i < 100; i++) r.add(2, 100); // 20/s for 10 s
  t.ok(Math.abs(r.rate - 20) < 0.5, `it follows a new rate within two windows (${r.rate.toFixed(2)})`);
  for (let i = 0; i < 100; i++) r.add(0, 100);
  t.ok(r.rate < 20 * Math.exp(-1.5), `and decays when nothing happens (${r.rate.toFixed(2)})`);
  // 2x the drain rate, queue at the target: shed half; below the drain rate: nothing
  t.equal(excessProbability(50, 100, 50, 1000, 10_000), 0.5);
  t.equal(excessProbability(50, 40, 0, 1000, 10_000), 0);
  t.ok(excessProbability(50, 100, 550, 1000, 10_000) > 0.5, 'a queue above its target is drained too');
  t.equal(excessProbability(0, 10, 5, 1000, 10_000), 1, 'a band that drains nothing sheds every arrival');
  t.end();
});

t.test('a short saturation (a 2 s burst at 3x on a full pool) sheds nothing and every request completes', async (t) => {
  const { ctl, clock } = harness(FLOWS, SLOTS);
  const loads: Load[] = [
    { band: 0, flow: 'tenant:premium', rate: () => 8 },
    // the pool full for 5 s, then a 2 s burst at 3x, then quiet
    { band: 2, flow: 'tenant:a', rate: (ms) => (ms < 5000 ? 55 : ms < 7000 ? 150 : 10) },
    { band: 2, flow: 'tenant:b', rate: (ms) => (ms >= 5000 && ms < 7000 ? 30 : 0) },
  ];
  const o = await simulate(ctl, clock, { slots: SLOTS, serviceMs: SERVICE, loads, durationMs: 12_000, drainMs: 5000 });
  t.ok(ctl.drainRate(2) > 40 && ctl.drainRate(2) < 75, `the drain rate was measured (${ctl.drainRate(2).toFixed(1)}/s for best-effort)`);
  t.ok(o.maxQueued > 100, `the burst was held in the queue (up to ${o.maxQueued})`);
  t.same(o.shed, [0, 0, 0, 0], 'nothing shed');
  t.same(o.expired, [0, 0, 0, 0], 'nothing expired');
  t.same(o.granted, o.sent, `every request was served (${o.sent.join('/')})`);
  t.ok(o.maxWait[2]! > 1000, `best-effort waited (up to ${o.maxWait[2]} ms)`);
  t.ok(o.maxWait[0]! <= 2 * SERVICE, `premium did not (up to ${o.maxWait[0]} ms)`);
});

t.test('a sustained 2x overload sheds about the excess; the queue stays bounded; premium is never shed', async (t) => {
  const { ctl, clock } = harness(FLOWS, SLOTS);
  // premium takes 8/s of the 80/s; best-effort can drain ~70/s less premium's share and 4 tenants send 120/s
  const loads: Load[] = [
    { band: 0, flow: 'tenant:premium', rate: () => 8 },
    ...['a', 'b', 'c', 'd'].map((f) => ({ band: 2, flow: `tenant:${f}`, rate: () => 30 })),
  ];
  const o = await simulate(ctl, clock, { slots: SLOTS, serviceMs: SERVICE, loads, durationMs: 60_000, drainMs: 20_000 });
  const d = ctl.drainRate(2);
  const sent = o.sent[2]!;
  const shed = o.shed[2]! + o.expired[2]!;
  // the excess is what the band's arrivals exceed what it was served over the run
  const excess = 1 - o.granted[2]! / sent;
  const frac = shed / sent;
  t.comment(`best-effort: ${sent} sent, ${o.granted[2]} served, ${o.shed[2]} shed, ${o.expired[2]} expired; drain ${d.toFixed(1)}/s; max queue ${o.maxQueued}`);
  t.ok(frac > 0.4 && frac < 0.6, `shed fraction ${frac.toFixed(3)} about the excess of 2x (0.5)`);
  t.ok(Math.abs(frac - excess) < 0.01, `everything not shed was served (excess ${excess.toFixed(3)})`);
  t.equal(o.expired[2], 0, 'shed at admission, not by expiry');
  t.equal(o.shed[0], 0, 'premium never shed');
  t.equal(o.granted[0], o.sent[0], 'every premium request served');
  t.ok(o.maxWait[0]! <= 2 * SERVICE, `premium waited at most ${o.maxWait[0]} ms`);
  // the standing queue is bounded by the overload detection: about (λ - D) × (target + interval), far below D × ttl
  t.ok(o.maxQueued < 70 * 15, `queue bounded (max ${o.maxQueued}, the TTL rule alone would allow ${Math.round(d * 60)})`);
  t.ok(o.maxWait[2]! < 15_000, `best-effort waited at most ${o.maxWait[2]} ms (target 1 s + interval 10 s + drain)`);
  t.equal(o.waiting, 0);
  // Retry-After from the drain rate: the backlog ahead over D_b, at least 1 s, at most the TTL
  t.ok(o.retryAfter.length > 0 && o.retryAfter.every((s) => Number.isInteger(s) && s >= 1 && s <= 60), 'every 429 has a Retry-After in [1, ttl]');
});

t.test('the same short saturation with the rule before (mode utilisation) is shed', async (t) => {
  const { ctl, clock } = harness({ ...FLOWS, admission: { mode: 'utilisation' } }, SLOTS);
  const loads: Load[] = [
    { band: 0, flow: 'tenant:premium', rate: () => 8 },
    { band: 2, flow: 'tenant:a', rate: (ms) => (ms < 5000 ? 55 : ms < 7000 ? 150 : 10) },
    { band: 2, flow: 'tenant:b', rate: (ms) => (ms >= 5000 && ms < 7000 ? 30 : 0) },
  ];
  const o = await simulate(ctl, clock, { slots: SLOTS, serviceMs: SERVICE, loads, durationMs: 12_000, drainMs: 5000 });
  t.ok(o.shed[2]! > 20, `shed by instantaneous utilisation: ${o.shed[2]} of ${o.sent[2]}`);
  t.same(o.retryAfter.filter((s) => s !== 1), [], 'with the configured Retry-After');
});

t.test('Retry-After is the backlog ahead over the drain rate', async (t) => {
  // 8 slots of 1 s: best-effort drains ~7/s and gets 9/s; a queue limit of 30 sheds the 31st waiting request
  const { ctl, clock } = harness({ ...FLOWS, limits: { maxRequests: 30 } }, SLOTS);
  const loads: Load[] = [{ band: 2, flow: 'tenant:a', rate: (ms) => (ms < 8000 ? 9 : 0) }];
  await simulate(ctl, clock, { slots: SLOTS, serviceMs: 1000, loads, durationMs: 8000 });
  const d = ctl.drainRate(2);
  t.ok(d > 4 && d < 8, `drain rate measured: ${d.toFixed(2)}/s`);
  const held: Promise<AdmitResult>[] = [];
  for (let i = 0; ctl.queued < 30 && i < 100; i++) {
    const r = ctl.admit({ flowId: 'tenant:a', band: 2, bytes: 1 });
    if (r instanceof Promise) held.push(r);
  }
  t.equal(ctl.queued, 30);
  const r = ctl.admit({ flowId: 'tenant:a', band: 2, bytes: 1 }) as AdmitResult;
  t.equal(r.ok, false);
  if (!r.ok) {
    t.equal(r.reason, 'rejected-capacity');
    t.equal(r.retryAfterSeconds, Math.ceil(30 / d), `Retry-After ${r.retryAfterSeconds} s = ceil(30 / ${d.toFixed(2)})`);
  }
  ctl.close();
  await Promise.all(held);
});

t.test('a dead pool does not hold requests forever: they expire at the TTL and later arrivals are shed', async (t) => {
  const { ctl, clock } = harness({ ...FLOWS, ttl: '5s' }, SLOTS);
  const loads: Load[] = [{ band: 2, flow: 'tenant:a', rate: () => 20 }];
  // 3 s of normal service (the drain rate is learnt), then nothing completes for 17 s
  const o = await simulate(ctl, clock, { slots: SLOTS, serviceMs: SERVICE, loads, durationMs: 20_000, stall: 3000 });
  t.ok(o.expired[2]! > 0, `held requests expired (${o.expired[2]})`);
  t.ok(o.maxWait[2]! < 5000, 'none was granted after its TTL');
  t.equal(ctl.drainRate(2), 0, 'a pool that completed nothing for a TTL of busy time drains at 0');
  t.ok(o.shed[2]! > 0, `arrivals after that are shed at once (${o.shed[2]})`);
  t.ok(ctl.queued <= 20 * 5 + 1, `and the queue holds at most a TTL of arrivals (${ctl.queued})`);
  t.equal(o.retryAfter[o.retryAfter.length - 1], 5, 'with Retry-After: the TTL');
});

t.test('before a drain rate is measured nothing is shed by it (a first burst is held)', async (t) => {
  const { ctl, clock } = harness(FLOWS, SLOTS);
  const loads: Load[] = [{ band: 3, flow: 'workload:x', rate: (ms) => (ms < 100 ? 2000 : 0) }];
  const o = await simulate(ctl, clock, { slots: SLOTS, serviceMs: SERVICE, loads, durationMs: 100, drainMs: 5000 });
  t.equal(o.sent[3], 200);
  t.equal(o.granted[3], 200, 'a burst of 200 at once on an idle pool: all served');
});
