// One subject's counters (an API key's or a tenant's) and the pure arithmetic
// over them, shared by the local counters and the Redis script's mirror.
//
// Requests and tokens per period are GCRA (the generic cell rate algorithm,
// ITU-T I.371; as in Brandur Leach's and redis-cell's rate limiters): one
// number per limit, the theoretical arrival time `tat` (ms since the epoch).
// The period P is a minute for the interactive limits and the window of a
// batch quota (`batch.quotas.windowMs`) for a tenant's batch subject. A limit
// of L a period has an emission interval T = P / L ms; a cost of c is
// admitted when max(tat, now) + c·T − now ≤ P (a burst of L from a full
// bucket, refilled evenly), and moves tat there. What is left is
// (P − (max(tat, now) − now)) / T; the bucket is full again at tat. A token
// count corrected after the answer (the engine's usage) moves tat by the
// difference; a debt (tat beyond now + P) holds every request until it is
// paid. O(1), no allocation.
//
// Tokens per UTC day are a fixed-window counter: the day's number and what
// it used.

export const MINUTE_MS = 60_000;
export const DAY_MS = 86_400_000;
/** Float slack in the GCRA comparison (a cost that fits exactly is admitted). */
const EPS = 1e-6;

/** What is checked: one bit each (a subject has the limits its spec names). */
export const enum Fail {
  None = 0,
  Requests = 1,
  TokensMinute = 2,
  TokensDay = 3,
}

export class Bucket {
  /** The subject's id: `k:<key id>`, `t:<tenant>` or `b:<tenant>` (a batch quota; the Redis key's suffix). */
  readonly id: string;
  /** Who, for a 429's message: `key 1a2b…` or `tenant acme`. */
  readonly who: string;
  /** Limits (0 = none): requests a period, tokens a period (named for the minute of the interactive limits), tokens a UTC day. */
  rpm = 0;
  tpm = 0;
  tpd = 0;
  /** The GCRA period of `rpm` and `tpm`, ms: a minute, or a batch quota's window. */
  period = MINUTE_MS;
  reqTat = 0;
  tokTat = 0;
  /** The UTC day `dayUsed` belongs to (floor(ms / DAY_MS)). */
  day = 0;
  dayUsed = 0;
  /** Date.now() of the last admission (idle buckets may be dropped at the cap). */
  lastUsed = 0;

  constructor(id: string, who: string) {
    this.id = id;
    this.who = who;
  }

  /** The header lines' fixed parts for these limits (built when the limits are set, not per answer). */
  reqPrefix = '';
  tpmPrefix = '';
  tpdPrefix = '';

  setLimits(rpm: number, tpm: number, tpd: number, period = MINUTE_MS): void {
    if (rpm === this.rpm && tpm === this.tpm && tpd === this.tpd && period === this.period && (this.reqPrefix !== '' || rpm === 0)) return;
    this.rpm = rpm;
    this.tpm = tpm;
    this.tpd = tpd;
    this.period = period;
    this.reqPrefix = `x-ratelimit-limit-requests: ${rpm}\r\nx-ratelimit-remaining-requests: `;
    this.tpmPrefix = `x-ratelimit-limit-tokens: ${tpm}\r\nx-ratelimit-remaining-tokens: `;
    this.tpdPrefix = `x-ratelimit-limit-tokens: ${tpd}\r\nx-ratelimit-remaining-tokens: `;
  }

  get limited(): boolean {
    return this.rpm > 0 || this.tpm > 0 || this.tpd > 0;
  }

  /** Nothing to remember: both period buckets full and no token used today. */
  idle(now: number): boolean {
    return this.reqTat <= now && this.tokTat <= now && (this.dayUsed === 0 || this.day !== Math.floor(now / DAY_MS));
  }
}

/** The outcome of a check: which limit failed and when to retry (ms; Infinity: the request can never fit). */
export interface Verdict {
  fail: Fail;
  retryMs: number;
  /** The subject that refused (for the message) and what the limit and its use were. */
  bucket: Bucket | null;
  limit: number;
  used: number;
  requested: number;
}

/**
 * Checks `cost` tokens and one request against `b` at `now` without changing
 * it; fills `v` (v.fail stays None when it fits). A cost larger than a whole
 * period's or day's budget can never fit (retryMs Infinity).
 */
export function check(b: Bucket, now: number, cost: number, v: Verdict): void {
  const P = b.period;
  if (b.rpm > 0) {
    const t = Math.max(b.reqTat, now) + P / b.rpm;
    if (t - now > P + EPS) return refuse(v, Fail.Requests, t - now - P, b, b.rpm, b.rpm - remainingRequests(b, now), 1);
  }
  if (b.tpm > 0) {
    const step = (cost * P) / b.tpm;
    if (cost > b.tpm) return refuse(v, Fail.TokensMinute, Infinity, b, b.tpm, b.tpm - remainingTokensMinute(b, now), cost);
    const t = Math.max(b.tokTat, now) + step;
    if (t - now > P + EPS) return refuse(v, Fail.TokensMinute, t - now - P, b, b.tpm, b.tpm - remainingTokensMinute(b, now), cost);
  }
  if (b.tpd > 0) {
    const day = Math.floor(now / DAY_MS);
    const used = b.day === day ? b.dayUsed : 0;
    if (cost > b.tpd) return refuse(v, Fail.TokensDay, Infinity, b, b.tpd, used, cost);
    if (used + cost > b.tpd) return refuse(v, Fail.TokensDay, (day + 1) * DAY_MS - now, b, b.tpd, used, cost);
  }
}

function refuse(v: Verdict, fail: Fail, retryMs: number, b: Bucket, limit: number, used: number, requested: number): void {
  // the first refusal found is kept unless a later one waits longer (retry after the longest)
  if (v.fail !== Fail.None && v.retryMs >= retryMs) return;
  v.fail = fail;
  v.retryMs = retryMs;
  v.bucket = b;
  v.limit = limit;
  v.used = Math.max(0, Math.round(used));
  v.requested = requested;
}

/** Charges one request and `cost` tokens (after every subject's check passed). */
export function charge(b: Bucket, now: number, cost: number): void {
  b.lastUsed = now;
  if (b.rpm > 0) b.reqTat = Math.max(b.reqTat, now) + b.period / b.rpm;
  if (b.tpm > 0 && cost !== 0) b.tokTat = Math.max(b.tokTat, now) + (cost * b.period) / b.tpm;
  if (b.tpd > 0) {
    const day = Math.floor(now / DAY_MS);
    if (b.day !== day) {
      b.day = day;
      b.dayUsed = 0;
    }
    b.dayUsed += cost;
  }
}

/**
 * Moves the token counters by `delta` (the answer's real count minus what
 * admission charged; negative: a refund), charged on UTC day `day`.
 */
export function correct(b: Bucket, now: number, delta: number, day: number): void {
  if (delta === 0) return;
  if (b.tpm > 0) b.tokTat = delta > 0 ? Math.max(b.tokTat, now) + (delta * b.period) / b.tpm : b.tokTat + (delta * b.period) / b.tpm;
  if (b.tpd > 0 && b.day === day) b.dayUsed = Math.max(0, b.dayUsed + delta);
}

/** Gives one request back (it was charged, then never served: a batch line that will be dispatched again). */
export function unchargeRequest(b: Bucket): void {
  if (b.rpm > 0) b.reqTat -= b.period / b.rpm;
}

export function remainingRequests(b: Bucket, now: number): number {
  const T = b.period / b.rpm;
  return Math.max(0, Math.min(b.rpm, Math.floor((b.period - (Math.max(b.reqTat, now) - now)) / T + EPS)));
}

export function remainingTokensMinute(b: Bucket, now: number): number {
  const T = b.period / b.tpm;
  return Math.max(0, Math.min(b.tpm, Math.floor((b.period - (Math.max(b.tokTat, now) - now)) / T + EPS)));
}

export function remainingTokensDay(b: Bucket, now: number): number {
  const used = b.day === Math.floor(now / DAY_MS) ? b.dayUsed : 0;
  return Math.max(0, Math.floor(b.tpd - used));
}

/**
 * A duration as OpenAI's x-ratelimit-reset-* headers write it (Go's
 * time.Duration form): `20ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`.
 */
export function duration(ms: number): string {
  if (!(ms > 0)) return '0s';
  ms = Math.ceil(ms);
  if (ms < 1000) return `${ms}ms`;
  const h = Math.floor(ms / 3_600_000);
  const m = Math.floor((ms % 3_600_000) / 60_000);
  const sMs = ms % 60_000;
  const s = sMs % 1000 === 0 ? String(sMs / 1000) : String(Math.round(sMs) / 1000);
  if (h > 0) return `${h}h${m}m${s}s`;
  if (m > 0) return `${m}m${s}s`;
  return `${s}s`;
}
