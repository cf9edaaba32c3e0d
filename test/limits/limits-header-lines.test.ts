// The x-ratelimit-* header lines (src/limits/limiter.ts headerLines): their
// reset lines come from caches (durations under a second made once, a longer
// one kept while its ms stays the same); checked against the lines written
// out in full each time (the plain reference below: duration() per answer)
// over random limits, counters and clocks, with answers in the same ms, in
// later ones, and for plans whose resets alternate.
import t from 'tap';
import fc from 'fast-check';
import { Bucket, DAY_MS, duration, remainingRequests, remainingTokensDay, remainingTokensMinute } from '../../src/limits/bucket.js';
import { digits, headerLines, type Plan } from '../../src/limits/limiter.js';

function reference(p: Plan, now: number): string {
  let s = '';
  let rl = '';
  let rr = Infinity;
  let rt = 0;
  let tl = '';
  let tr = Infinity;
  let tt = 0;
  for (const b of [p.key, p.tenant]) {
    if (b === null) continue;
    if (b.rpm > 0) {
      const r = remainingRequests(b, now);
      if (r < rr) [rr, rl, rt] = [r, b.reqPrefix, Math.max(b.reqTat, now) - now];
    }
    if (b.tpm > 0) {
      const r = remainingTokensMinute(b, now);
      if (r < tr) [tr, tl, tt] = [r, b.tpmPrefix, Math.max(b.tokTat, now) - now];
    }
    if (b.tpd > 0) {
      const r = remainingTokensDay(b, now);
      if (r < tr) [tr, tl, tt] = [r, b.tpdPrefix, r === b.tpd ? 0 : (Math.floor(now / DAY_MS) + 1) * DAY_MS - now];
    }
  }
  if (rl !== '') s = `${rl}${rr}\r\nx-ratelimit-reset-requests: ${duration(rt)}\r\n`;
  if (tl !== '') s += `${tl}${tr}\r\nx-ratelimit-reset-tokens: ${duration(tt)}\r\n`;
  return s;
}

const T0 = 1_796_400_000_000;
const limit = fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 100 }), fc.integer({ min: 1, max: 1_000_000_000 }));
const bucketArb = fc.record({
  rpm: limit,
  tpm: limit,
  tpd: limit,
  period: fc.constantFrom(60_000, 3_600_000, 1000),
  reqAhead: fc.oneof(fc.constant(0), fc.double({ min: -5000, max: 4_000_000, noNaN: true })),
  tokAhead: fc.oneof(fc.constant(0), fc.double({ min: -5000, max: 4_000_000, noNaN: true })),
  dayUsed: fc.integer({ min: 0, max: 2_000_000_000 }),
});
type BArb = typeof bucketArb extends fc.Arbitrary<infer X> ? X : never;

function make(x: BArb, id: string): Bucket | null {
  if (x.rpm === 0 && x.tpm === 0 && x.tpd === 0) return null;
  const b = new Bucket(id, id);
  b.setLimits(x.rpm, x.tpm, x.tpd, x.period);
  b.reqTat = T0 + x.reqAhead;
  b.tokTat = T0 + x.tokAhead;
  b.day = Math.floor(T0 / DAY_MS);
  b.dayUsed = x.dayUsed;
  return b;
}

t.test('the lines equal the reference, answer after answer', async (t) => {
  fc.assert(
    fc.property(
      fc.array(fc.record({ key: fc.option(bucketArb), tenant: fc.option(bucketArb) }), { minLength: 1, maxLength: 4 }),
      // each answer: which plan, and how far the clock moved (often not at all: answers in the same ms)
      fc.array(fc.record({ plan: fc.nat(), step: fc.oneof(fc.constant(0), fc.constant(0), fc.double({ min: 0, max: 3, noNaN: true }), fc.integer({ min: 0, max: 90_000_000 })) }), { maxLength: 40 }),
      (plans, answers) => {
        const ps: Plan[] = plans.map((p, i) => ({
          key: p.key === null ? null : make(p.key, `k:${i}`),
          tenant: p.tenant === null ? null : make(p.tenant, `t:${i}`),
          tokens: true,
          lines: '',
          stale: true,
          at: T0,
        }));
        let now = T0;
        for (const a of answers) {
          now += a.step;
          const p = ps[a.plan % ps.length]!;
          if (headerLines(p, now) !== reference(p, now)) return false;
        }
        return true;
      },
    ),
    { numRuns: 3000 },
  );
});

t.test('a day reset: the same ms reuses the line, the next ms writes a new one', async (t) => {
  const b = new Bucket('t:x', 'tenant x');
  b.setLimits(0, 0, 1000);
  b.day = Math.floor(T0 / DAY_MS);
  b.dayUsed = 10;
  const p: Plan = { key: null, tenant: b, tokens: true, lines: '', stale: true, at: T0 };
  const a = headerLines(p, T0);
  t.match(a, /x-ratelimit-remaining-tokens: 990\r\nx-ratelimit-reset-tokens: \d+h\d+m[\d.]+s\r\n$/);
  t.equal(headerLines(p, T0 + 0.5), reference(p, T0 + 0.5), 'within the same whole ms');
  t.not(headerLines(p, T0 + 1), a, 'a ms later the reset is a ms shorter');
  t.equal(headerLines(p, T0 + 1), reference(p, T0 + 1));
  b.dayUsed = 11;
  t.equal(headerLines(p, T0 + 1), reference(p, T0 + 1), 'remaining moved, reset the same');
});

// The counts' digits come from four-digit groups made once each: every whole number writes as String(n)
// does, across each group edge and past the groups' range (toFixed), and a count that is not a whole
// number (none is today) as toFixed(0) would.
t.test('digits: the same text as String(n) for every whole count', async (t) => {
  const edges = [0, 1, 9, 10, 999, 1000, 9999, 10_000, 10_001, 99_999_999, 100_000_000, 100_000_001, 100_010_000, 999_999_999_999, 1e12, 1e15, 2 ** 53];
  for (const n of edges) t.equal(digits(n), String(n), `${n}`);
  fc.assert(fc.property(fc.oneof(fc.integer({ min: 0, max: 20_000 }), fc.integer({ min: 0, max: 2_000_000_000 }), fc.maxSafeInteger().filter((n) => n >= 0)), (n) => digits(n) === String(n)), { numRuns: 5000 });
  for (const x of [0.5, 1.5, 12_345.678, -3, -0.4]) t.equal(digits(x), x.toFixed(0), `${x}`);
});
