// A subject's GCRA period (bucket.ts): a minute for the interactive limits, a
// batch quota's window for a tenant's batch subject (RateLimiter.subject).
// Pure arithmetic on explicit clocks, and the limiter's local check-and-charge
// of such a subject (the counters a processor without shared ones uses).
import t from 'tap';
import { Bucket, charge, check, correct, Fail, MINUTE_MS, remainingRequests, remainingTokensMinute, type Verdict } from '../../src/limits/bucket.js';
import { RateLimiter } from '../../src/limits/limiter.js';

const verdict = (): Verdict => ({ fail: Fail.None, retryMs: 0, bucket: null, limit: 0, used: 0, requested: 0 });

function take(b: Bucket, now: number, cost: number): Verdict {
  const v = verdict();
  check(b, now, cost, v);
  if (v.fail === Fail.None) charge(b, now, cost);
  return v;
}

t.test('requests a period: a burst of the budget, then one each period ÷ limit', async (t) => {
  const b = new Bucket('b:acme', 'batch quota of tenant acme');
  b.setLimits(2, 0, 0, 2000);
  t.equal(b.period, 2000);
  const t0 = 1_000_000;
  t.equal(take(b, t0, 0).fail, Fail.None);
  t.equal(take(b, t0, 0).fail, Fail.None);
  const v = take(b, t0, 0);
  t.equal(v.fail, Fail.Requests, 'the third of the burst is refused');
  t.equal(v.retryMs, 1000, 'one request refills in 2000 / 2 ms');
  t.equal(remainingRequests(b, t0 + 999), 0);
  t.equal(remainingRequests(b, t0 + 1000), 1);
  t.equal(take(b, t0 + 1000, 0).fail, Fail.None, 'admitted once it refilled');
  t.equal(remainingRequests(b, t0 + 5000), 2, 'full again after a period');
  // the default period is the minute the interactive limits count
  const k = new Bucket('k:1', 'key 1');
  k.setLimits(2, 0, 0);
  t.equal(k.period, MINUTE_MS);
  take(k, t0, 0);
  take(k, t0, 0);
  t.equal(take(k, t0, 0).retryMs, 30_000);
});

t.test('tokens a period: charged, corrected both ways, a cost over the period never fits', async (t) => {
  const b = new Bucket('b:acme', 'batch quota of tenant acme');
  b.setLimits(0, 100, 0, 4000);
  const t0 = 5_000_000;
  t.equal(take(b, t0, 90).fail, Fail.None);
  t.equal(take(b, t0, 20).fail, Fail.TokensMinute, '90 + 20 > 100');
  // the answer used 30: 60 back
  correct(b, t0, 30 - 90, 0);
  t.equal(remainingTokensMinute(b, t0), 70);
  t.equal(take(b, t0, 20).fail, Fail.None, 'fits after the refund');
  // an answer of 200 against an estimate of 20: a debt past the whole period
  correct(b, t0, 180, 0);
  const v = take(b, t0, 1);
  t.equal(v.fail, Fail.TokensMinute);
  // used: 30 + 200 = 230 of 100 over 4000 ms (40 ms a token); one more fits when 131 have refilled
  t.equal(Math.round(v.retryMs), 131 * 40);
  t.equal(take(b, t0 + 131 * 40, 1).fail, Fail.None, 'admitted once the debt is paid');
  t.equal(take(b, t0 + 1_000_000, 101).retryMs, Infinity, 'more than the period holds can never fit');
});

t.test('RateLimiter.subject: a plan of one subject with its own period, charged locally', async (t) => {
  const l = new RateLimiter({ tenants: {} });
  t.equal(l.subject('b:none', 'nobody', 0, 0, 1000), null, 'no limit: no plan');
  const p = l.subject('b:acme', 'batch quota of tenant acme', 1, 50, 3000)!;
  t.equal(p.key, null);
  t.equal(p.tenant!.id, 'b:acme');
  t.equal(p.tenant!.period, 3000);
  t.equal(p.tokens, true);
  t.equal(l.subject('b:acme', 'batch quota of tenant acme', 1, 50, 3000), p, 'cached by id');
  const t0 = 9_000_000;
  t.equal(l.takeLocal(p, 10, t0), true);
  t.equal(l.takeLocal(p, 10, t0), false, 'one request a 3 s window');
  t.equal(l.verdict.fail, Fail.Requests);
  t.equal(l.verdict.retryMs, 3000);
  t.equal(l.refusedRequests, 1);
  t.equal(l.takeLocal(p, 60, t0 + 3000), false, 'more tokens than the window holds');
  t.equal(l.refusedTokens, 1);
  t.equal(l.takeLocal(p, 40, t0 + 3000), true, 'a window later both have refilled');
  t.equal(p.tenant!.tokTat, t0 + 3000 + 40 * 60, 'the token TAT: 40 tokens of 3000 / 50 ms each ahead');
  // a charge undone (a batch line deferred downstream, dispatched again later): its request and its tokens back
  l.giveBack(p, 40, 0);
  t.equal(remainingRequests(p.tenant!, t0 + 3000), 1, 'the request back');
  t.equal(remainingTokensMinute(p.tenant!, t0 + 3000), 50, 'the tokens back');
  t.equal(l.takeLocal(p, 50, t0 + 3000), true, 'the whole window again at once');
});
