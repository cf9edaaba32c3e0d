// What authentication and local rate limits cost per request, in process:
// `ApiKeyAuthenticator.authenticate` (1,000 keys) with its token → caller
// cache against the uncached path (SHA-256 of the token each time), and the
// rate limiter's per-request work (the caller's plan, check-and-charge of
// its key's and tenant's buckets, the x-ratelimit-* header lines, the usage
// correction), each timed over the same loop with nothing in it as baseline.
// Numbers are ns per call; the router's CPU per request to compare them with
// comes from bench/system/router-ab.ts in the same session.
//   node dist/bench/micro/auth-limits.js [--keys 1000] [--iterations 2000000]
import { createHash, randomBytes } from 'node:crypto';
import { ApiKeyAuthenticator } from '../../src/auth/authenticator.js';
import { RateLimiter } from '../../src/limits/limiter.js';
import { RateLimitGate } from '../../src/limits/gate.js';
import { PassThroughGate, type Admitted, type FinishedRequest } from '../../src/admission.js';
import type { Caller } from '../../src/identity.js';
import { exitOnHelp } from '../lib/help.js';
import { option } from '../lib/proc.js';

exitOnHelp(import.meta.url);

const argv = process.argv.slice(2);
const nKeys = Number(option(argv, '--keys') ?? '1000');
const iterations = Number(option(argv, '--iterations') ?? '2000000');

const keys = Array.from({ length: nKeys }, () => `sk-${randomBytes(24).toString('hex')}`);
const entries = keys.map((k, i) => ({ digest: createHash('sha256').update(k).digest('hex'), tenant: `tenant-${i}` }));
const header = `Bearer ${keys[nKeys >> 1]}`;
const get = (name: string) => (name === 'authorization' ? header : '');

function time(label: string, n: number, f: () => unknown): number {
  for (let i = 0; i < Math.min(n, 100_000); i++) f();
  const t0 = process.hrtime.bigint();
  let sink: unknown;
  for (let i = 0; i < n; i++) sink = f();
  const ns = Number(process.hrtime.bigint() - t0) / n;
  if (sink === Symbol.for('never')) console.log(label);
  return ns;
}

const cached = new ApiKeyAuthenticator({ required: true, trustHeaders: false }, entries);
const base = time('loop', iterations, () => get('authorization'));
const hit = time('cached', iterations, () => cached.authenticate(get)) - base;
// a new table every call would measure construction: the uncached path is the random-token miss (hash + lookup)
const missHeader = `Bearer ${keys[0]}x`;
const miss = time('uncached', Math.min(iterations, 500_000), () => cached.authenticate((n) => (n === 'authorization' ? missHeader : ''))) - base;
const caller = cached.authenticate(get) as Caller;
const limiter = new RateLimiter({ tenants: {}, defaultTenant: { requestsPerMinute: 1e8, tokensPerMinute: 1e9, tokensPerDay: 1e9 }, defaultKey: { requestsPerMinute: 1e8, tokensPerMinute: 1e9 } });
const limits = time('limits', iterations, () => {
  const p = limiter.plan(caller)!;
  limiter.takeLocal(p, 8, Date.now());
  limiter.correct(p, 4, 0);
  return limiter.headers(caller);
}) - base;
// the router's whole per-request path of the two, as the front end and the director call it: a fresh
// header string each request (its hash not yet computed, as the front end hands one over), authenticate,
// the limits gate's admit, the answer's header lines, release with the answer's usage
const bufs = keys.slice(0, 16).map((k) => Buffer.from(`Bearer ${k}`, 'latin1'));
let current = '';
const getCurrent = (name: string) => (name === 'authorization' ? current : '');
const gate = new RateLimitGate(new PassThroughGate(), limiter);
const done = { requestId: 'r', model: 'm', caller, promptBytes: 27, bodyBytes: 80, completionTokens: 1, promptTokens: 3, responseBytes: 325, responseChunks: 1, promptBlocks: 0, matchedBlocks: 0, body: {} } as unknown as FinishedRequest & { caller: Caller };
let k = 0;
const freshBase = time('fresh loop', iterations, () => {
  current = bufs[k++ & 15]!.toString('latin1');
  return current;
});
const whole = time('whole path', iterations, () => {
  current = bufs[k++ & 15]!.toString('latin1');
  const c = cached.authenticate(getCurrent) as Caller;
  done.caller = c;
  const a = gate.admit(done, { aborted: false } as never) as Admitted;
  const lines = limiter.headers(c);
  gate.release(a.ticket, 'ok', done);
  return lines;
}) - freshBase;
console.log(`auth and local rate limits, in process (${nKeys} keys, ${iterations.toLocaleString('en-US')} calls; ns per call over an empty loop's ${base.toFixed(1)} ns)`);
console.log('| step | ns per request |');
console.log('|---|---:|');
console.log(`| authenticate, token cached (a known key's second request on) | ${hit.toFixed(0)} |`);
console.log(`| authenticate, not cached (SHA-256 + lookup: every unknown token) | ${miss.toFixed(0)} |`);
console.log(`| the whole path: authenticate (16 keys in turn, a fresh header string each) + limits gate admit + header lines + release | ${whole.toFixed(0)} |`);
console.log(`| rate limits: plan + check-and-charge of key and tenant (rpm, tpm, tpd) + correction + header lines | ${limits.toFixed(0)} |`);
