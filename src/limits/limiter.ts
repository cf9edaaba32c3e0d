// The rate limiter: which counters a caller is charged to (its key's and its
// tenant's, each only when it has a limit), the check-and-charge at
// admission (here, or in Redis through SharedCounters), the correction when
// the answer ends, and OpenAI's x-ratelimit-* header lines of an answer.
//
// Per request: one WeakMap lookup for the caller's plan (callers are shared
// frozen objects: one per key, one per tenant), a check of at most two
// buckets, and one string of header lines. Buckets live in one Map by
// subject id, bounded by `maxSubjects` (idle ones are dropped first, then new
// subjects share an `(overflow)` bucket); they outlive a reload, so a reload
// never resets what a key or tenant used.
//
// A subject that is not a caller's (a tenant's batch quota, `b:<tenant>`,
// src/batch/quota.ts) has a plan of its own through `subject()`: its limits a
// period of its own (the quota's window), the same check, charge, correction
// and shared counters.
import { RATE_LIMIT_DEFAULTS, type RateLimitsConfig, type LimitSpec } from '../config/rate-limits.js';
import type { Caller, KeyLimits } from '../identity.js';
import { Bucket, charge, check, correct, DAY_MS, duration, Fail, MINUTE_MS, remainingRequests, remainingTokensDay, remainingTokensMinute, unchargeRequest, type Verdict } from './bucket.js';

/** The buckets one caller is charged to, and its answers' header lines. */
export interface Plan {
  readonly key: Bucket | null;
  readonly tenant: Bucket | null;
  /** Some bucket counts tokens (the answer's usage is read at the end). */
  readonly tokens: boolean;
  /** The x-ratelimit-* lines as of `at` (rebuilt when a counter moved since: `stale`). */
  lines: string;
  stale: boolean;
  /** Date.now() of this caller's last admission (the headers describe the counters then). */
  at: number;
}

/** The answer of shared counters (Redis): admitted, refused (the verdict says why), or the store failed. */
export const enum Take {
  Ok = 0,
  Refused = 1,
  Down = 2,
}

/**
 * Counters shared by several routers (src/limits/redis-counters.ts): one
 * round trip checks and charges every bucket of a plan atomically and
 * refreshes the buckets' local copies (what the headers read).
 */
export interface SharedCounters {
  take(plan: Plan, cost: number, v: Verdict): Promise<Take>;
  /** A token correction, and `requests` given back (negative; batched: sent with the next flush, off the request path). */
  correct(b: Bucket, delta: number, day: number, requests?: number): void;
  /** Failed or timed-out commands. */
  readonly errors: number;
  close(): Promise<void>;
}

const OVERFLOW = '(overflow)';

export class RateLimiter {
  #cfg: RateLimitsConfig;
  readonly #buckets = new Map<string, Bucket>();
  #plans = new WeakMap<Caller, Plan | null>();
  /** Plans of subjects that are not callers' (subject()), by id. */
  #subjectPlans = new Map<string, Plan>();
  /** The latest clock an admission read. */
  #lastNow = 0;
  #maxSubjects: number;
  /** Shared counters (Redis), or null: this router counts alone. */
  readonly shared: SharedCounters | null;
  /** True when `rateLimits.redis.failMode` is closed. */
  readonly failClosed: boolean;
  /** Reused verdict (read synchronously by the caller of take/check). */
  readonly verdict: Verdict = { fail: Fail.None, retryMs: 0, bucket: null, limit: 0, used: 0, requested: 0 };
  /** Counted for the metrics: refusals by kind, store failures. */
  refusedRequests = 0;
  refusedTokens = 0;
  storeErrors = 0;
  failedOpen = 0;
  failedClosed = 0;
  /** New subjects counted under `(overflow)` because `maxSubjects` were busy. */
  overflowed = 0;

  /**
   * `opts.maxSubjects` overrides `cfg.maxSubjects` (rateLimits.maxSubjects; default 100,000);
   * `opts.failClosed` overrides `cfg.redis.failMode` (for shared counters that are not `cfg.redis`'s).
   */
  constructor(cfg: RateLimitsConfig, opts: { maxSubjects?: number; shared?: SharedCounters | null; failClosed?: boolean } = {}) {
    this.#cfg = cfg;
    this.#maxSubjects = opts.maxSubjects ?? cfg.maxSubjects ?? RATE_LIMIT_DEFAULTS.maxSubjects;
    this.shared = opts.shared ?? null;
    this.failClosed = opts.failClosed ?? cfg.redis?.failMode === 'closed';
  }

  /** A reload's new block: limits apply from the next request; what was used stays counted. */
  configure(cfg: RateLimitsConfig): void {
    this.#cfg = cfg;
    // a lower cap applies to the next new subject (idle ones are dropped then); none is cut off
    this.#maxSubjects = cfg.maxSubjects ?? RATE_LIMIT_DEFAULTS.maxSubjects;
    this.#plans = new WeakMap();
    this.#subjectPlans.clear();
  }

  get maxSubjects(): number {
    return this.#maxSubjects;
  }

  get subjects(): number {
    return this.#buckets.size;
  }

  /** The buckets `caller` is charged to, or null when nothing limits it. */
  plan(caller: Caller): Plan | null {
    let p = this.#plans.get(caller);
    if (p === undefined) {
      p = this.#build(caller);
      this.#plans.set(caller, p);
    }
    return p;
  }

  #build(caller: Caller): Plan | null {
    const cfg = this.#cfg;
    let key: Bucket | null = null;
    if (caller.keyId !== '') {
      const spec = merge(cfg.defaultKey, caller.limits);
      if (spec !== null) key = this.#bucket(`k:${caller.keyId}`, `key ${caller.keyId}`, spec);
    }
    const t = caller.tenant;
    const tspec = t === '' ? (cfg.anonymous ?? null) : (Object.hasOwn(cfg.tenants, t) ? cfg.tenants[t]! : (cfg.defaultTenant ?? null));
    const tenant = tspec !== null && limited(tspec) ? this.#bucket(`t:${t}`, t === '' ? 'the anonymous scope' : `tenant ${t}`, tspec) : null;
    if (key === null && tenant === null) return null;
    return { key, tenant, tokens: (key !== null && (key.tpm > 0 || key.tpd > 0)) || (tenant !== null && (tenant.tpm > 0 || tenant.tpd > 0)), lines: '', stale: true, at: Date.now() };
  }

  /**
   * The plan of a subject that is not a caller's (a tenant's batch quota:
   * `b:<tenant>`): `requests` and `tokens` every `periodMs` (0 = none of
   * that kind), charged as a caller's tenant is; cached by id (at most
   * `maxSubjects` plans). Null when it limits nothing.
   */
  subject(id: string, who: string, requests: number, tokens: number, periodMs: number): Plan | null {
    if (requests === 0 && tokens === 0) return null;
    let p = this.#subjectPlans.get(id);
    if (p === undefined) {
      if (this.#subjectPlans.size >= this.#maxSubjects) this.#subjectPlans.clear();
      const spec: LimitSpec = {};
      if (requests > 0) spec.requestsPerMinute = requests;
      if (tokens > 0) spec.tokensPerMinute = tokens;
      p = { key: null, tenant: this.#bucket(id, who, spec, periodMs), tokens: tokens > 0, lines: '', stale: true, at: Date.now() };
      this.#subjectPlans.set(id, p);
    }
    return p;
  }

  #bucket(id: string, who: string, spec: LimitSpec | KeyLimits, period = MINUTE_MS): Bucket {
    let b = this.#buckets.get(id);
    if (b === undefined) {
      if (this.#buckets.size >= this.#maxSubjects) this.#sweep();
      if (this.#buckets.size >= this.#maxSubjects) {
        // every subject is busy: later ones share one bucket per kind (bounded memory before fairness)
        this.overflowed++;
        id = `${id.slice(0, 2)}${OVERFLOW}`;
        who = `${who.split(' ')[0]} ${OVERFLOW}`;
        b = this.#buckets.get(id);
      }
      if (b === undefined) {
        b = new Bucket(id, who);
        this.#buckets.set(id, b);
      }
    }
    b.setLimits(spec.requestsPerMinute ?? 0, spec.tokensPerMinute ?? 0, spec.tokensPerDay ?? 0, period);
    return b;
  }

  /** Drops the buckets that remember nothing (full, no tokens today); plans are rebuilt. */
  #sweep(): void {
    const now = Date.now();
    for (const [id, b] of this.#buckets) if (b.idle(now)) this.#buckets.delete(id);
    this.#plans = new WeakMap();
    this.#subjectPlans.clear();
  }

  /**
   * Checks and charges one request of `cost` tokens to every bucket of
   * `plan` on this router's counters; false (and `verdict` says why) when a
   * limit refuses it, and then nothing is charged.
   */
  takeLocal(plan: Plan, cost: number, now: number): boolean {
    plan.at = now;
    plan.stale = true;
    const v = this.verdict;
    v.fail = Fail.None;
    v.bucket = null;
    if (plan.key !== null) check(plan.key, now, cost, v);
    if (plan.tenant !== null) check(plan.tenant, now, cost, v);
    this.#lastNow = now;
    if (v.fail !== Fail.None) {
      this.#count(v);
      return false;
    }
    if (plan.key !== null) charge(plan.key, now, cost);
    if (plan.tenant !== null) charge(plan.tenant, now, cost);
    return true;
  }

  /** The shared counters' check (Redis); a refusal is counted here. */
  take(plan: Plan, cost: number): Promise<Take> {
    const v = this.verdict;
    v.fail = Fail.None;
    v.bucket = null;
    return this.shared!.take(plan, cost, v).then((r) => {
      plan.at = Date.now();
      plan.stale = true;
      if (r === Take.Refused) this.#count(v);
      return r;
    });
  }

  #count(v: Verdict): void {
    if (v.fail === Fail.Requests) this.refusedRequests++;
    else this.refusedTokens++;
  }

  /** The answer ended: its real token count differs from the charged estimate by `delta`. */
  correct(plan: Plan, delta: number, day: number): void {
    if (delta === 0 || !plan.tokens) return;
    // the clock of the caller's last admission: near enough for a correction (no clock read per answer)
    const now = Math.max(plan.at, this.#lastNow);
    plan.stale = true;
    if (plan.key !== null) this.#correct(plan.key, now, delta, day);
    if (plan.tenant !== null) this.#correct(plan.tenant, now, delta, day);
  }

  #correct(b: Bucket, now: number, delta: number, day: number): void {
    if (b.tpm === 0 && b.tpd === 0) return;
    correct(b, now, delta, day);
    this.shared?.correct(b, delta, day);
  }

  /** One request given back (admitted here, then refused downstream): its request count stays, its tokens return. */
  refund(plan: Plan, cost: number, day: number): void {
    this.correct(plan, -cost, day);
  }

  /**
   * A charge undone: the request was never served and will be sent again by
   * the router itself (a batch line the interactive limits deferred), so its
   * request and its tokens both go back.
   */
  giveBack(plan: Plan, cost: number, day: number): void {
    const now = Math.max(plan.at, this.#lastNow);
    plan.stale = true;
    if (plan.key !== null) this.#giveBack(plan.key, now, cost, day);
    if (plan.tenant !== null) this.#giveBack(plan.tenant, now, cost, day);
  }

  #giveBack(b: Bucket, now: number, cost: number, day: number): void {
    const tokens = b.tpm > 0 || b.tpd > 0 ? -cost : 0;
    const requests = b.rpm > 0 ? -1 : 0;
    if (tokens === 0 && requests === 0) return;
    correct(b, now, tokens, day);
    unchargeRequest(b);
    this.shared?.correct(b, tokens, day, requests);
  }

  /**
   * The x-ratelimit-* lines (each ending in CRLF) of an answer to `caller`:
   * the requests trio of its tighter request limit, the tokens trio of its
   * tightest token limit (a minute's or the day's); '' when nothing limits it.
   */
  headers(caller: Caller): string {
    const p = this.plan(caller);
    if (p === null) return '';
    if (p.stale) {
      p.lines = headerLines(p, p.at);
      p.stale = false;
    }
    return p.lines;
  }
}

/** The key's limits over `defaultKey` (field by field), or null when neither limits anything. */
function merge(base: LimitSpec | undefined, own: KeyLimits | null): LimitSpec | null {
  if (own === null) return base !== undefined && limited(base) ? base : null;
  const out: LimitSpec = {
    requestsPerMinute: own.requestsPerMinute ?? base?.requestsPerMinute,
    tokensPerMinute: own.tokensPerMinute ?? base?.tokensPerMinute,
    tokensPerDay: own.tokensPerDay ?? base?.tokensPerDay,
  };
  return limited(out) ? out : null;
}

function limited(s: LimitSpec): boolean {
  return s.requestsPerMinute !== undefined || s.tokensPerMinute !== undefined || s.tokensPerDay !== undefined;
}

const CRLF = '\r\n';
const RESET_REQUESTS = '\r\nx-ratelimit-reset-requests: ';
const RESET_TOKENS = '\r\nx-ratelimit-reset-tokens: ';

/**
 * The reset lines' ends (`\r\nx-ratelimit-reset-…: <duration>\r\n`), by
 * whole ms (0 for none): those under a second made once each on first use,
 * a longer one (the day's reset: hours) kept while its ms stays the same
 * (every answer within that ms), so most answers' headers cost no duration
 * string and two concatenations fewer.
 */
const SHORT_RESETS = 1000;

class ResetLines {
  readonly #head: string;
  readonly #short: (string | undefined)[] = new Array<string | undefined>(SHORT_RESETS).fill(undefined);
  #longMs = -1;
  #long = '';

  constructor(head: string) {
    this.#head = head;
  }

  /** `head + duration(ms) + CRLF`. */
  line(ms: number): string {
    // duration() writes a positive ms as Math.ceil(ms), anything else as 0s
    const whole = ms > 0 ? Math.ceil(ms) : 0;
    if (whole < SHORT_RESETS) {
      let s = this.#short[whole];
      if (s === undefined) this.#short[whole] = s = this.#head + duration(whole) + CRLF;
      return s;
    }
    if (whole !== this.#longMs) {
      this.#longMs = whole;
      this.#long = this.#head + duration(whole) + CRLF;
    }
    return this.#long;
  }
}

const reqResets = new ResetLines(RESET_REQUESTS);
const tokResets = new ResetLines(RESET_TOKENS);

/** The header lines of a plan at `now` (see RateLimiter.headers). */
export function headerLines(p: Plan, now: number): string {
  let s = '';
  // requests: the bucket with the fewest left
  let rl = '';
  let rr = Infinity;
  let rt = 0;
  // tokens: the limit (a minute's or the day's) with the fewest left
  let tl = '';
  let tr = Infinity;
  let tt = 0;
  for (let i = 0; i < 2; i++) {
    const b = i === 0 ? p.key : p.tenant;
    if (b === null) continue;
    if (b.rpm > 0) {
      const r = remainingRequests(b, now);
      if (r < rr) {
        rr = r;
        rl = b.reqPrefix;
        rt = Math.max(b.reqTat, now) - now;
      }
    }
    if (b.tpm > 0) {
      const r = remainingTokensMinute(b, now);
      if (r < tr) {
        tr = r;
        tl = b.tpmPrefix;
        tt = Math.max(b.tokTat, now) - now;
      }
    }
    if (b.tpd > 0) {
      const r = remainingTokensDay(b, now);
      if (r < tr) {
        tr = r;
        tl = b.tpdPrefix;
        tt = r === b.tpd ? 0 : (Math.floor(now / DAY_MS) + 1) * DAY_MS - now;
      }
    }
  }
  if (rl !== '') s = rl + digits(rr) + reqResets.line(rt);
  if (tl !== '') s += tl + digits(tr) + tokResets.line(tt);
  return s;
}

/**
 * The decimal digits of a whole number, not through V8's number-to-string
 * cache (`${n}`, String(n) and `+` go through it). A remaining count moves with
 * every answer, so each one would be a new cache entry: the cache lives in the
 * old generation and keeps its strings through scavenges until they are
 * promoted, ~26 bytes a request promoted and collected only by full GCs
 * (measured: bench/RESULTS.md, 2026-12-04 "GC"). Counts are cut into groups of
 * four digits whose strings are made once each (at most 20,000 strings, made
 * on first use), so a count costs one or two short concatenations instead of
 * toFixed's runtime call (bench/RESULTS.md, 2026-12-05); toFixed is left for
 * counts of 10^12 and over.
 */
const GROUPS = 10_000;
const PLAIN: (string | undefined)[] = new Array<string | undefined>(GROUPS).fill(undefined);
const PADDED: (string | undefined)[] = new Array<string | undefined>(GROUPS).fill(undefined);

function plain(k: number): string {
  let s = PLAIN[k];
  if (s === undefined) PLAIN[k] = s = k.toFixed(0);
  return s;
}

function padded(k: number): string {
  let s = PADDED[k];
  if (s === undefined) PADDED[k] = s = k.toFixed(0).padStart(4, '0');
  return s;
}

export function digits(n: number): string {
  if (!(n >= 0 && n < 1e12 && Number.isInteger(n))) return n.toFixed(0);
  if (n < GROUPS) return plain(n);
  if (n < GROUPS * GROUPS) {
    const hi = Math.floor(n / GROUPS);
    return plain(hi) + padded(n - hi * GROUPS);
  }
  const hi = Math.floor(n / (GROUPS * GROUPS));
  const rest = n - hi * GROUPS * GROUPS;
  const mid = Math.floor(rest / GROUPS);
  return plain(hi) + padded(mid) + padded(rest - mid * GROUPS);
}

/** OpenAI's 429 message for a refusal (its words: "Rate limit reached for … on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s."). */
export function refusalMessage(v: Verdict): string {
  const what = v.fail === Fail.Requests ? 'requests per min (RPM)' : v.fail === Fail.TokensMinute ? 'tokens per min (TPM)' : 'tokens per day (TPD)';
  const who = v.bucket?.who ?? 'this caller';
  if (v.retryMs === Infinity) return `Request too large for ${who} on ${what}: Limit ${v.limit}, Requested ${v.requested}. The input or output tokens must be reduced in order to run successfully.`;
  return `Rate limit reached for ${who} on ${what}: Limit ${v.limit}, Used ${v.used}, Requested ${v.requested}. Please try again in ${duration(v.retryMs)}.`;
}
