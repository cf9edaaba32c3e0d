// Property test of the FlowController against invariants, over random
// sequences of arrivals, completions, client disconnects and clock advances:
//   - strict band priority: no request is granted while a request of a higher
//     band is waiting;
//   - capacity: granted-and-unreleased requests never exceed the pool's slots;
//   - every request settles exactly once, and its result is the right kind;
//   - no granted request waited past the TTL;
//   - the controller's queue counters match the requests still waiting.
// Run twice: admission off, and with probabilistic admission and flow-aware
// shedding, random continuations (turn priority with a short maxColdWait),
// random prompt sizes (cost fairness) and usage at release.
import t from 'tap';
import fc from 'fast-check';
import { FlowController, type AdmitResult } from '../../src/flow/controller.js';
import { flush, Signal } from '../support/flow-util.js';
import { validateFlowControl } from '../../src/flow/config.js';
import { seededRng } from '../../src/flow/admission.js';

type Op =
  | { kind: 'arrive'; flow: number; band: number; bytes: number; cont: boolean; tokens: number }
  | { kind: 'complete'; pick: number }
  | { kind: 'disconnect'; pick: number }
  | { kind: 'advance'; ms: number; sweep: boolean };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ kind: fc.constant('arrive' as const), flow: fc.integer({ min: 0, max: 3 }), band: fc.integer({ min: 0, max: 3 }), bytes: fc.integer({ min: 0, max: 5000 }), cont: fc.boolean(), tokens: fc.integer({ min: 0, max: 9000 }) }) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('complete' as const), pick: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('disconnect' as const), pick: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('advance' as const), ms: fc.constantFrom(50, 400, 1100), sweep: fc.boolean() }) },
);

interface Req {
  band: number;
  bytes: number;
  tokens: number;
  arrivedAt: number;
  signal: Signal;
  state: 'waiting' | 'granted' | 'released' | 'refused';
  settled: number;
  ticket?: number;
}

const VARIANTS = [
  { name: 'admission off', cfg: { admission: { mode: 'off', maxUtilisation: 1 } }, shed: false },
  {
    name: 'probabilistic admission with fair shedding, turn priority, token costs',
    cfg: { admission: { mode: 'probabilistic', maxUtilisation: 0.5, shedding: 'fair' }, turnPriority: { maxColdWait: '100ms' } },
    shed: true,
  },
];

for (const variant of VARIANTS) t.test(`dispatch invariants hold on random workloads: ${variant.name}`, async (t) => {
  let seed = 1;
  await fc.assert(
    fc.asyncProperty(fc.integer({ min: 1, max: 4 }), fc.array(opArb, { minLength: 5, maxLength: 80, size: 'max' }), async (slots, ops) => {
      const { value: cfg, errors } = validateFlowControl({
        ...variant.cfg,
        ttl: '1s',
        limits: { maxRequests: 12 },
        maxFlows: 8,
      });
      if (!cfg) throw new Error(errors.join('; '));
      const clock = { now: 0 };
      let ctl!: FlowController;
      ctl = new FlowController({
        config: cfg,
        utilisation: () => ctl.inFlight / slots,
        now: () => clock.now,
        sweepTimer: false,
        rng: seededRng(seed++),
      });
      const reqs: Req[] = [];
      const problems: string[] = [];
      const waiting = () => reqs.filter((r) => r.state === 'waiting');
      const settle = (r: Req, x: AdmitResult) => {
        r.settled++;
        if (r.settled > 1) problems.push('settled twice');
        if (x.ok) {
          if (r.signal.aborted) problems.push('granted after the client left');
          if (clock.now - r.arrivedAt >= 1000) problems.push(`granted after waiting ${clock.now - r.arrivedAt} ms`);
          for (const o of reqs) if (o !== r && o.state === 'waiting' && o.band < r.band) problems.push(`band ${r.band} granted while band ${o.band} waits`);
          r.state = 'granted';
          r.ticket = x.ticket;
          if (ctl.inFlight > slots) problems.push(`inFlight ${ctl.inFlight} > ${slots}`);
        } else {
          r.state = 'refused';
          if (x.reason === 'cancelled' && !r.signal.aborted) problems.push('cancelled without a disconnect');
          if (x.reason === 'rejected-ttl-expired' && clock.now - r.arrivedAt < 1000) problems.push('expired early');
        }
      };
      for (const op of ops) {
        switch (op.kind) {
          case 'arrive': {
            const r: Req = { band: op.band, bytes: op.bytes, tokens: op.tokens, arrivedAt: clock.now, signal: new Signal(), state: 'waiting', settled: 0 };
            reqs.push(r);
            const x = variant.shed
              ? ctl.admit({ flowId: `f${op.flow}`, band: op.band, bytes: op.bytes, promptTokens: op.tokens, maxTokens: 16, continuation: op.cont }, r.signal)
              : ctl.admit({ flowId: `f${op.flow}`, band: op.band, bytes: op.bytes }, r.signal);
            if (x instanceof Promise) void x.then((y) => settle(r, y));
            else settle(r, x);
            break;
          }
          case 'complete': {
            const held = reqs.filter((r) => r.state === 'granted');
            if (held.length === 0) break;
            const r = held[op.pick % held.length]!;
            r.state = 'released';
            if (variant.shed) ctl.release(r.ticket!, { promptTokens: r.tokens, maxTokens: 16, uncached: (op.pick % 5) / 4, outputTokens: (op.pick % 40) - 1 });
            else ctl.release(r.ticket!);
            break;
          }
          case 'disconnect': {
            const w = waiting();
            if (w.length > 0) w[op.pick % w.length]!.signal.abort();
            break;
          }
          case 'advance':
            clock.now += op.ms;
            if (op.sweep) ctl.sweep(); // without a sweep, expired requests may still sit in the queue
            break;
        }
        await flush();
        await flush();
        const w = waiting();
        if (ctl.queued !== w.length) problems.push(`queued ${ctl.queued} but ${w.length} waiting`);
        if (ctl.queuedBytes !== w.reduce((a, r) => a + r.bytes, 0)) problems.push('queued bytes mismatch');
        if (ctl.inFlight !== reqs.filter((r) => r.state === 'granted').length) problems.push('inFlight mismatch');
        if (problems.length > 0) break;
      }
      ctl.close();
      await flush();
      for (const r of reqs) if (r.settled !== 1) problems.push(`a request settled ${r.settled} times`);
      if (problems.length > 0) throw new Error(problems.slice(0, 3).join('; '));
      return true;
    }),
    { numRuns: 200 },
  );
  t.pass('no invariant broken');
});
