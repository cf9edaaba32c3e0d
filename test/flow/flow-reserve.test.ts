// The reserve for the bands above (admission.reserveWindow): a lower band's
// request leaves free the slots a higher band used within the window and has
// released since, so the higher band's next requests (a user back from its
// think time) find them free instead of behind a best-effort request. Over
// real Endpoints (learnt batch limits, real occupancy) and the gate the
// server uses, on a virtual clock.
import t from 'tap';
import { EndpointSet, type Endpoint } from '../../src/endpoints/endpoint.js';
import { DEFAULTS } from '../../src/config/schema.js';
import { FlowControlGate } from '../../src/flow/gate.js';
import { validateFlowControl } from '../../src/flow/config.js';
import { seededRng } from '../../src/flow/admission.js';
import { flush, Signal } from '../support/flow-util.js';

function endpoints(n: number): Endpoint[] {
  const set = new EndpointSet(
    [{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: Array.from({ length: n }, (_, i) => ({ name: `e${i}`, url: `http://127.0.0.1:${9000 + i}`, role: 'both' as const })) }],
    { ...DEFAULTS.dataLayer, staleAfterMs: 1e9 },
  );
  return set.all;
}

/** Two scrapes showing a full batch of 4 with requests waiting: the batch limit is learnt as 4. */
function learn4(ep: Endpoint, now: number): void {
  for (let i = 0; i < 6; i++) ep.onDispatch(now);
  for (let k = 0; k < 2; k++) {
    ep.metrics.running = 4;
    ep.metrics.waiting = 2;
    ep.metrics.kvUsage = NaN;
    ep.metricsAt = now;
    ep.sinceScrape = 0;
    ep.onScrape();
  }
  for (let i = 0; i < 6; i++) ep.onOutcome(now, false, DEFAULTS.dataLayer);
  // and an idle engine at the last scrape: no foreign load
  ep.metrics.running = 0;
  ep.metrics.waiting = 0;
  ep.onScrape();
}

/** `realClock`: performance.now and the controller's own timers (sweep every 10 s, so only the reserve's timer re-runs the loop in time). */
function setup(t: Tap.Test, reserveWindow: string | number, realClock = false) {
  const { value: cfg, errors } = validateFlowControl({
    flows: [
      { id: 'tenant:premium', priority: 'premium', minShare: 0.3 },
      { id: 'tenant:best-effort', priority: 'best-effort' },
    ],
    admission: { mode: 'probabilistic', maxUtilisation: 0.85, reserveWindow },
    ...(realClock ? { sweepInterval: '10s' } : {}),
  });
  if (!cfg) throw new Error(errors.join('\n'));
  const clock = {
    t: realClock ? performance.now() : 1_000_000,
    get now(): number {
      return realClock ? performance.now() : this.t;
    },
    set now(v: number) {
      this.t = v;
    },
  };
  const eps = endpoints(2);
  for (const ep of eps) learn4(ep, clock.now);
  t.equal(eps[0]!.batchLimit, 4, 'batch limit learnt');
  const gate = FlowControlGate.fromEndpoints({ config: cfg, endpointsFor: () => eps, rng: seededRng(5), now: () => clock.now });
  t.teardown(() => gate.close());
  const info = (tenant: string) => ({
    model: 'm',
    headers: { authorization: '', 'x-tenant-id': tenant, 'x-workload-id': '', 'x-llm-d-inference-fairness-id': '', 'x-priority': '' },
    bodyBytes: 10,
  });
  // what the server does with a grant: send it to the least-loaded endpoint
  const running: { ticket: unknown; ep: Endpoint; who: string }[] = [];
  const dispatch = (ticket: unknown, who: string) => {
    const ep = eps[0]!.inFlight <= eps[1]!.inFlight ? eps[0]! : eps[1]!;
    ep.onDispatch(clock.now);
    running.push({ ticket, ep, who });
  };
  const held: Promise<unknown>[] = [];
  let granted = { premium: 0, 'best-effort': 0 } as Record<string, number>;
  const admit = (who: 'premium' | 'best-effort') => {
    const r = gate.admit(info(who), new Signal());
    const take = (x: unknown) => {
      const g = x as { admitted: boolean; ticket: unknown };
      if (g.admitted) {
        granted[who]!++;
        dispatch(g.ticket, who);
      }
    };
    if (r instanceof Promise) held.push(r.then(take));
    else take(r);
  };
  const finish = (who: string, n: number) => {
    for (let i = 0; i < n; i++) {
      const k = running.findIndex((x) => x.who === who);
      const [r] = running.splice(k, 1);
      r!.ep.onOutcome(clock.now, false, DEFAULTS.dataLayer);
      gate.release(r!.ticket);
    }
  };
  const counts = () => ({ ...granted });
  const reset = () => {
    granted = { premium: 0, 'best-effort': 0 };
  };
  return { gate, clock, eps, admit, finish, counts, reset, running };
}

async function settle(): Promise<void> {
  for (let i = 0; i < 6; i++) await flush();
}

/** Premium takes 6 of the 8 slots, 100 ms later 4 of its users think (release), then 4 best-effort requests arrive. */
async function thinkThenBurst(t: Tap.Test, reserveWindow: string | number, realClock = false) {
  const s = setup(t, reserveWindow, realClock);
  for (let i = 0; i < 6; i++) s.admit('premium');
  await settle();
  t.equal(s.counts().premium, 6, 'premium takes 6 of the 8 slots');
  s.clock.now += 100;
  s.finish('premium', 4);
  await settle();
  s.reset();
  for (let i = 0; i < 4; i++) s.admit('best-effort');
  await settle();
  return s;
}

t.test('best-effort leaves free the slots premium used a moment ago; premium gets them back at once', async (t) => {
  const s = await thinkThenBurst(t, '1s');
  // 8 slots, premium at 2 of a recent 6: 4 kept free, so best-effort may run 2 (not 4, as the ceiling alone allows)
  t.equal(s.counts()['best-effort'], 2, 'best-effort runs 2 and holds 2 in the router');
  s.clock.now += 50;
  for (let i = 0; i < 4; i++) s.admit('premium');
  await settle();
  t.equal(s.counts().premium, 4, 'the four premium users back from thinking all start at once');
  t.equal(s.running.length, 8, 'the pool is full');
  // premium goes quiet for longer than the window: the reserve is gone, best-effort fills what the ceiling allows
  s.finish('premium', 6);
  s.clock.now += 100;
  s.gate.controller('m').pump();
  await settle();
  t.equal(s.counts()['best-effort'], 2, 'premium idle for 100 ms: its slots are still kept for it');
  s.clock.now += 1400;
  s.gate.controller('m').pump();
  await settle();
  t.equal(s.counts()['best-effort'], 4, 'after the window best-effort runs its other 2');
});

t.test('reserveWindow 0: the ceiling alone decides (the rule before)', async (t) => {
  const s = await thinkThenBurst(t, 0);
  t.equal(s.counts()['best-effort'], 4, 'best-effort takes every slot the ceiling allows');
  s.clock.now += 50;
  for (let i = 0; i < 4; i++) s.admit('premium');
  await settle();
  t.equal(s.counts().premium, 2, 'so only 2 of the 4 premium users find a slot; the others wait');
});

t.test('the reserve never holds the top band, and a band with no recent peak reserves nothing', async (t) => {
  const s = setup(t, '1s');
  // best-effort first, premium idle: no reserve
  for (let i = 0; i < 4; i++) s.admit('best-effort');
  await settle();
  t.equal(s.counts()['best-effort'], 4, 'with premium idle (no peak yet) no slot is kept for it');
  for (let i = 0; i < 4; i++) s.admit('premium');
  await settle();
  t.equal(s.counts().premium, 4, 'premium runs in what is left, up to the pool');
  t.equal(s.running.length, 8);
});

t.test('the loop runs again when the reserve lapses: an idle pool does not wait for the next sweep', async (t) => {
  const s = await thinkThenBurst(t, '200ms', true);
  t.equal(s.counts()['best-effort'], 2, 'best-effort runs 2 and holds 2');
  // nothing else happens: no release, no arrival, the sweep is 10 s away
  const t0 = performance.now();
  while (s.counts()['best-effort'] < 4 && performance.now() - t0 < 3000) await new Promise((r) => setTimeout(r, 10));
  const waited = performance.now() - t0;
  t.equal(s.counts()['best-effort'], 4, `the held 2 start once the reserve lapses (after ${Math.round(waited)} ms)`);
  t.ok(waited < 2000, 'well before the 10 s sweep');
});
