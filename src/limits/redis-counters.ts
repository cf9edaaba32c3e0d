// Rate-limit counters shared by several routers in Redis: one hash per
// subject (`<keyPrefix>k:<key id>`, `<keyPrefix>t:<tenant>`, a tenant's batch
// quota `<keyPrefix>b:<tenant>`: fields r = requests' TAT, k = tokens' TAT,
// d = UTC day, u = tokens used that day; each subject's GCRA period, a minute
// or a batch quota's window, is sent with its limits),
// checked and charged by one Lua script in one round trip per request (the
// key's and the tenant's hash together, atomically; the clock is Redis's
// TIME, so routers need not agree on theirs). ioredis's defineCommand sends
// EVALSHA and falls back to EVAL when Redis does not know the script (a
// restart, a failover). The arithmetic is bucket.ts's, written again in Lua.
//
// Corrections (the answer's real token count) are not on the request path:
// they add up per subject and go out every `FLUSH_MS` in one pipeline.
//
// Redis down or slower than `timeoutMs`: the take fails (counted in
// `errors`), and the gate fails open or closed (rateLimits.redis.failMode).
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { RateLimitedWarn, redisReady } from '../redis-link.js';
import type { RateLimitsRedisConfig } from '../config/rate-limits.js';
import { Fail, type Bucket, type Verdict } from './bucket.js';
import { Take, type Plan, type SharedCounters } from './limiter.js';

const FLUSH_MS = 20;

/**
 * KEYS: 1 or 2 subject hashes. ARGV: cost, then per key rpm, tpm, tpd (0 = none)
 * and the period of rpm and tpm (ms).
 * Returns strings: fail (0 none, 1 requests, 2 tokens a period, 3 tokens a day),
 * retry ms (-1: can never fit), the refusing key's index (1-based), limit, used,
 * then per key: requests TAT − now, tokens TAT − now, tokens used today.
 */
const TAKE = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local cost = tonumber(ARGV[1])
local D, EPS = 86400000, 1e-6
local day = math.floor(now / D)
local st = {}
local fail, retry, who, limit, used = 0, 0, 0, 0, 0
local function refuse(f, rt, i, l, u)
  if fail ~= 0 and (retry < 0 or (rt >= 0 and retry >= rt)) then return end
  fail, retry, who, limit, used = f, rt, i, l, u
end
for i = 1, #KEYS do
  local rpm, tpm, tpd, M = tonumber(ARGV[4 * i - 2]), tonumber(ARGV[4 * i - 1]), tonumber(ARGV[4 * i]), tonumber(ARGV[4 * i + 1])
  local v = redis.call('HMGET', KEYS[i], 'r', 'k', 'd', 'u')
  local r, k, d, u = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0, tonumber(v[4]) or 0
  if d ~= day then u = 0 end
  st[i] = { r, k, u, rpm, tpm, tpd, M }
  if rpm > 0 then
    local T = M / rpm
    local tt = math.max(r, now) + T
    if tt - now > M + EPS then
      local left = math.floor((M - (math.max(r, now) - now)) / T + EPS)
      refuse(1, tt - now - M, i, rpm, rpm - math.max(0, left))
    end
  end
  if tpm > 0 then
    local T = M / tpm
    local left = math.max(0, math.floor((M - (math.max(k, now) - now)) / T + EPS))
    if cost > tpm then refuse(2, -1, i, tpm, tpm - left)
    else
      local tt = math.max(k, now) + cost * T
      if tt - now > M + EPS then refuse(2, tt - now - M, i, tpm, tpm - left) end
    end
  end
  if tpd > 0 then
    if cost > tpd then refuse(3, -1, i, tpd, u)
    elseif u + cost > tpd then refuse(3, (day + 1) * D - now, i, tpd, u) end
  end
end
local out = { tostring(fail), tostring(retry), tostring(who), tostring(limit), tostring(used) }
for i = 1, #KEYS do
  local s = st[i]
  local r, k, u, rpm, tpm, tpd, M = s[1], s[2], s[3], s[4], s[5], s[6], s[7]
  if fail == 0 then
    if rpm > 0 then r = math.max(r, now) + M / rpm end
    if tpm > 0 and cost ~= 0 then k = math.max(k, now) + cost * M / tpm end
    if tpd > 0 then u = u + cost end
    redis.call('HSET', KEYS[i], 'r', tostring(r), 'k', tostring(k), 'd', tostring(day), 'u', tostring(u))
    local keep = math.max(r, k) - now
    if tpd > 0 then keep = math.max(keep, (day + 1) * D - now) end
    redis.call('PEXPIRE', KEYS[i], math.ceil(keep) + M)
  end
  out[#out + 1] = tostring(r - now)
  out[#out + 1] = tostring(k - now)
  out[#out + 1] = tostring(u)
end
return out
`;

/**
 * KEYS: one subject hash. ARGV: delta tokens, tpm, tpd, the UTC day the
 * request was charged on, the period of tpm and rpm (ms), requests given
 * back (0 or negative), rpm.
 */
const CORRECT = `
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local delta, tpm, tpd, day, M = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rd, rpm = tonumber(ARGV[6]), tonumber(ARGV[7])
local v = redis.call('HMGET', KEYS[1], 'k', 'd', 'u', 'r')
local k, d, u, r = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0, tonumber(v[4]) or 0
if rpm > 0 and rd ~= 0 then redis.call('HSET', KEYS[1], 'r', tostring(r + rd * M / rpm)) end
if tpm > 0 and delta ~= 0 then
  if delta > 0 then k = math.max(k, now) + delta * M / tpm else k = k + delta * M / tpm end
  redis.call('HSET', KEYS[1], 'k', tostring(k))
  -- a debt outlives the expiry the take set (what the estimate charged)
  if delta > 0 then
    local keep = math.ceil(k - now + M)
    if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
  end
end
if tpd > 0 and d == day and delta ~= 0 then redis.call('HSET', KEYS[1], 'u', tostring(math.max(0, u + delta))) end
return 1
`;

interface RlRedis extends Redis {
  swyRlTake(numKeys: number, ...args: (string | number)[]): Promise<string[]>;
  swyRlCorrect(key: string, delta: number, tpm: number, tpd: number, day: number, period: number, requests: number, rpm: number): Promise<number>;
}

interface Pending {
  bucket: Bucket;
  delta: number;
  day: number;
  /** Requests given back (0 or negative). */
  requests: number;
}

export class RedisCounters implements SharedCounters {
  readonly #redis: RlRedis;
  readonly #prefix: string;
  readonly #warns: RateLimitedWarn;
  /** Failed or timed-out commands (switchyard_rate_limit_store_errors_total). */
  errors = 0;
  readonly #pending = new Map<string, Pending>();
  #flush: NodeJS.Timeout | null = null;
  /** The take's arguments, reused (read synchronously by ioredis when the command is built). */
  readonly #args: (string | number)[] = [];

  constructor(cfg: RateLimitsRedisConfig, log?: Logger) {
    this.#prefix = cfg.keyPrefix;
    this.#warns = new RateLimitedWarn(log);
    const r = new Redis(cfg.url, {
      // fail at once while disconnected (the fail mode decides) instead of queueing behind the request
      enableOfflineQueue: false,
      commandTimeout: cfg.timeoutMs,
      maxRetriesPerRequest: 0,
      connectTimeout: Math.max(1000, cfg.timeoutMs),
      retryStrategy: (n) => Math.min(50 * n, 1000),
    });
    r.defineCommand('swyRlTake', { lua: TAKE });
    r.defineCommand('swyRlCorrect', { numberOfKeys: 1, lua: CORRECT });
    r.on('error', (err: Error) => this.#warns.warn(err, 'rate-limit counters (Redis) connection error'));
    this.#redis = r as RlRedis;
  }

  /** Connected (or 2 s passed: requests then follow the fail mode until it is). */
  ready(): Promise<void> {
    return redisReady(this.#redis);
  }

  take(plan: Plan, cost: number, v: Verdict): Promise<Take> {
    const a = this.#args;
    a.length = 0;
    const k = plan.key;
    const t = plan.tenant;
    const n = (k !== null ? 1 : 0) + (t !== null ? 1 : 0);
    if (k !== null) a.push(this.#prefix + k.id);
    if (t !== null) a.push(this.#prefix + t.id);
    a.push(cost);
    if (k !== null) a.push(k.rpm, k.tpm, k.tpd, k.period);
    if (t !== null) a.push(t.rpm, t.tpm, t.tpd, t.period);
    return this.#redis.swyRlTake(n, ...a).then(
      (out) => {
        const now = Date.now();
        // the local copies (what the headers read), on this router's clock
        let at = 5;
        if (k !== null) at = mirror(k, out, at, now);
        if (t !== null) mirror(t, out, at, now);
        const fail = Number(out[0]) as Fail;
        if (fail === Fail.None) return Take.Ok;
        const retry = Number(out[1]);
        v.fail = fail;
        v.retryMs = retry < 0 ? Infinity : retry;
        v.bucket = Number(out[2]) === 1 ? (k ?? t) : t;
        v.limit = Number(out[3]);
        v.used = Math.max(0, Math.round(Number(out[4])));
        v.requested = fail === Fail.Requests ? 1 : cost;
        return Take.Refused;
      },
      (err: Error) => {
        this.errors++;
        this.#warns.warn(err, 'rate-limit counters (Redis) failed: following rateLimits.redis.failMode');
        return Take.Down;
      },
    );
  }

  correct(b: Bucket, delta: number, day: number, requests = 0): void {
    const p = this.#pending.get(b.id);
    if (p !== undefined && p.day === day) {
      p.delta += delta;
      p.requests += requests;
    } else this.#pending.set(b.id, { bucket: b, delta, day, requests });
    this.#flush ??= setTimeout(() => this.#send(), FLUSH_MS);
  }

  #send(): Promise<void> {
    this.#flush = null;
    if (this.#pending.size === 0) return Promise.resolve();
    const pipe = this.#redis.pipeline() as unknown as { swyRlCorrect(...a: (string | number)[]): void; exec(): Promise<[Error | null, unknown][] | null> };
    for (const p of this.#pending.values()) {
      if (p.delta !== 0 || p.requests !== 0) pipe.swyRlCorrect(this.#prefix + p.bucket.id, p.delta, p.bucket.tpm, p.bucket.tpd, p.day, p.bucket.period, p.requests, p.bucket.rpm);
    }
    this.#pending.clear();
    return pipe.exec().then(
      (res) => {
        for (const [err] of res ?? []) if (err) this.errors++;
      },
      (err: Error) => {
        this.errors++;
        this.#warns.warn(err, 'rate-limit counters (Redis): a correction failed');
      },
    );
  }

  async close(): Promise<void> {
    if (this.#flush !== null) {
      clearTimeout(this.#flush);
      await this.#send().catch(() => undefined);
    }
    this.#redis.disconnect();
  }
}

/** Copies one subject's state from the script's answer into its bucket; returns the next index. */
function mirror(b: Bucket, out: string[], at: number, now: number): number {
  b.reqTat = now + Number(out[at]);
  b.tokTat = now + Number(out[at + 1]);
  b.day = Math.floor(now / 86_400_000);
  b.dayUsed = Number(out[at + 2]);
  b.lastUsed = now;
  return at + 3;
}
