// Property test: random sequences of uses, pins, turn ends, lookups and
// sweeps on the SessionTable and on a plain reference model (an array in
// recency order, expiry and eviction written out longhand) must agree at
// every step: which sessions exist, their pins and turn ends, the pinned
// count, the eviction and expiry counters, and the continuation answer.
import fc from 'fast-check';
import t from 'tap';
import { EndpointSet, type Endpoint } from '../../src/endpoints/endpoint.js';
import { SessionTable } from '../../src/sessions/table.js';

const set = new EndpointSet([
  {
    name: 'p',
    engine: 'vllm',
    accelerator: 'nvidia',
    models: ['m'],
    endpoints: [0, 1, 2].map((i) => ({ name: `e${i}`, url: `http://127.0.0.1:${1000 + i}`, role: 'both' as const })),
  },
]);
const TTL = 1000;
const WINDOW = 300;

interface ModelEntry {
  key: string;
  ep: Endpoint | null;
  lastEnd: number;
  touched: number;
}

/** The reference: recency order is array order (oldest first). */
class Model {
  entries: ModelEntry[] = [];
  evicted = 0;
  expired = 0;
  constructor(readonly max: number) {}
  #find(key: string) {
    return this.entries.findIndex((e) => e.key === key);
  }
  peek(key: string, now: number): ModelEntry | undefined {
    const i = this.#find(key);
    if (i < 0) return undefined;
    if (now - this.entries[i]!.touched > TTL) {
      this.entries.splice(i, 1);
      this.expired++;
      return undefined;
    }
    return this.entries[i];
  }
  use(key: string, now: number): ModelEntry {
    let e = this.peek(key, now);
    if (e === undefined) {
      e = { key, ep: null, lastEnd: 0, touched: now };
      if (this.entries.length >= this.max) {
        this.entries.shift();
        this.evicted++;
      }
    } else this.entries.splice(this.entries.indexOf(e), 1);
    this.entries.push(e);
    e.touched = now;
    return e;
  }
  sweep(now: number): void {
    while (this.entries.length > 0 && now - this.entries[0]!.touched > TTL) {
      this.entries.shift();
      this.expired++;
    }
  }
  continues(key: string, now: number): boolean {
    const e = this.peek(key, now);
    return e !== undefined && e.lastEnd !== 0 && now - e.lastEnd <= WINDOW;
  }
}

type Op =
  | { op: 'picked'; key: number; ep: number; dt: number }
  | { op: 'turnEnded'; key: number; dt: number }
  | { op: 'peek'; key: number; dt: number }
  | { op: 'continues'; key: number; dt: number }
  | { op: 'sweep'; dt: number };

const keyArb = fc.integer({ min: 0, max: 7 });
const dtArb = fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 400 }));
const opArb: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ op: fc.constant('picked' as const), key: keyArb, ep: fc.integer({ min: 0, max: 2 }), dt: dtArb }),
  fc.record({ op: fc.constant('turnEnded' as const), key: keyArb, dt: dtArb }),
  fc.record({ op: fc.constant('peek' as const), key: keyArb, dt: dtArb }),
  fc.record({ op: fc.constant('continues' as const), key: keyArb, dt: dtArb }),
  fc.record({ op: fc.constant('sweep' as const), dt: dtArb }),
);

t.test('SessionTable agrees with the reference model', async (t) => {
  fc.assert(
    fc.property(fc.integer({ min: 1, max: 5 }), fc.array(opArb, { maxLength: 80 }), (max, ops) => {
      const table = new SessionTable(set, {
        sources: [],
        header: 'x-session-id',
        ttlMs: TTL,
        maxSessions: max,
        moveQueueDepth: 4,
        moveLoadGap: 8,
        continuationWindowMs: WINDOW,
        store: 'memory',
      });
      const model = new Model(max);
      // the table's picked() reads the wall clock: drive time from a fixed base and hand the same
      // times to both (picked → use + setPin, written out with the explicit clock)
      let now = 1_000_000;
      for (const o of ops) {
        now += o.dt;
        const key = `k${'key' in o ? o.key : 0}`;
        switch (o.op) {
          case 'picked': {
            const ep = set.all[o.ep]!;
            const e = table.use(key, now);
            table.setPin(e, ep);
            model.use(key, now).ep = ep;
            break;
          }
          case 'turnEnded':
            table.turnEnded(key, now);
            model.use(key, now).lastEnd = now;
            break;
          case 'peek': {
            const a = table.peek(key, now);
            const b = model.peek(key, now);
            if ((a === undefined) !== (b === undefined)) return false;
            if (a && b && (a.ep !== b.ep || a.lastEnd !== b.lastEnd)) return false;
            break;
          }
          case 'continues':
            if (table.continues(key, now) !== model.continues(key, now)) return false;
            break;
          case 'sweep':
            table.sweep(now);
            model.sweep(now);
            break;
        }
        if (table.size !== model.entries.length) return false;
        if (table.pinned !== model.entries.filter((e) => e.ep !== null).length) return false;
        if (table.evicted !== model.evicted || table.expired !== model.expired) return false;
        if (table.size > max) return false;
      }
      return true;
    }),
    { numRuns: 300 },
  );
  t.pass('300 random sequences');
});
