// The active/standby lease in Redis, with a fencing token.
//
// One key `<prefix>:lease` holds `<holder id>|<fence>` with a PX expiry; one
// counter `<prefix>:fence` is INCRemented on every acquisition, so each term
// of office has a larger fence than any before it. Acquire, renew and release
// are Lua scripts (atomic in Redis): acquire sets the key only when it is
// absent (the SET NX PX of the classic lock) and issues the fence in the same
// step; renew extends the expiry only while the key still holds our value
// (compare-and-extend); release deletes it only if it is ours. Every write of
// shared state goes through a script that first compares the writer's fence
// with the counter, so an active that was paused past its lease (GC, SIGSTOP,
// a partition) and wakes up believing it still leads is refused by Redis
// itself: two actives never both pass the check (the fencing pattern from
// Kleppmann's "How to do distributed locking", 2016).
//
// Timing: the lease is believed held until `sentAt + ttl`, where sentAt is
// when the last successful acquire/renew was *sent* (so the local belief
// always ends no later than the key's expiry in Redis). A renewal every
// renewIntervalMs; a standby tries to acquire at the same pace, so it takes
// over within ttl + one interval of the active's last renewal.
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';

const ACQUIRE = `
local cur = redis.call('GET', KEYS[1])
if cur then
  local sep = string.find(cur, '|', 1, true)
  if sep and string.sub(cur, 1, sep - 1) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(string.sub(cur, sep + 1))
  end
  return 0
end
local f = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. f, 'PX', ARGV[2], 'NX')
return f`;

const RENEW = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`;

const RELEASE = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0`;

/** XADD guarded by the fence: nil when a newer acquisition happened since `fence` was issued. */
const FENCED_XADD = `
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1]) then return false end
return redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'f', ARGV[1], 'd', ARGV[3])`;

type Scripted = Redis & {
  swyAcquire(lease: string, fence: string, id: string, ttl: number): Promise<number>;
  swyRenew(lease: string, value: string, ttl: number): Promise<number>;
  swyRelease(lease: string, value: string): Promise<number>;
  swyFencedXadd(fence: string, stream: string, token: number, maxLen: number, payload: Buffer): Promise<string | null>;
};

/** Adds the lease's scripts to an ioredis connection (EVALSHA with a fallback to EVAL). */
export function withLeaseScripts(r: Redis): Scripted {
  const s = r as Scripted;
  if (typeof s.swyAcquire === 'function') return s;
  r.defineCommand('swyAcquire', { numberOfKeys: 2, lua: ACQUIRE });
  r.defineCommand('swyRenew', { numberOfKeys: 1, lua: RENEW });
  r.defineCommand('swyRelease', { numberOfKeys: 1, lua: RELEASE });
  r.defineCommand('swyFencedXadd', { numberOfKeys: 2, lua: FENCED_XADD });
  return s;
}

export interface LeaseOptions {
  redis: Redis;
  /** Key prefix (config ha.key). */
  key: string;
  ttlMs: number;
  renewIntervalMs: number;
  log: Logger;
  /** This process's holder id (default: random). */
  id?: string;
}

export type LeaseState = 'active' | 'standby' | 'alone';

/** What the standby pair needs of a lease: the Redis one here, or a Kubernetes Lease (src/ha/k8s-lease.ts). */
export interface Lease {
  readonly id: string;
  readonly state: LeaseState;
  /** True while this router should take traffic. */
  readonly leading: boolean;
  /** The fencing token of the current term (0: none). */
  readonly fence: number;
  onChange(fn: (state: LeaseState, reason: string) => void): void;
  /** The first round; rejects when the lease's store cannot be reached. */
  start(): Promise<LeaseState>;
  serveAlone(reason: string): void;
  round(raise: boolean): Promise<void>;
  /** Appends to the delta stream only if `fence` is still the newest; null when refused. */
  fencedAppend(stream: string, fence: number, maxLen: number, payload: Buffer): Promise<string | null>;
  pause(): void;
  resume(): void;
  stop(release: boolean): Promise<void>;
}

/**
 * How long a held lease is believed valid, on this process's own clock: the
 * send time of the last successful acquire or renewal plus the TTL (a slow
 * answer shortens the term, never extends it). When the term runs out with no
 * renewal, `onExpired` is called; a timer that fires early waits out the rest.
 * Both leases (Redis here, the Kubernetes Lease in src/ha/k8s-lease.ts) keep their
 * term with it.
 */
export class LeaseTerm {
  #until = 0;
  #timer: NodeJS.Timeout | null = null;
  readonly #ttlMs: number;
  readonly #onExpired: () => void;

  constructor(ttlMs: number, onExpired: () => void) {
    this.#ttlMs = ttlMs;
    this.#onExpired = onExpired;
  }

  /** True once the term is over (or none was held). */
  over(now = performance.now()): boolean {
    return now >= this.#until;
  }

  /** An acquire or renewal sent at `sentAt` succeeded: the term runs TTL from then. */
  hold(sentAt: number): void {
    this.#until = sentAt + this.#ttlMs;
    this.#arm(this.#until - performance.now());
  }

  /** No term (lost, released or stopped); the timer is cancelled. */
  end(): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    this.#until = 0;
  }

  #arm(ms: number): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = setTimeout(this.#fire, Math.max(1, ms));
    this.#timer.unref();
  }

  readonly #fire = (): void => {
    this.#timer = null;
    const left = this.#until - performance.now();
    if (left <= 0) this.#onExpired();
    else this.#arm(left);
  };
}

export class RedisLease implements Lease {
  readonly id: string;
  readonly leaseKey: string;
  readonly fenceKey: string;
  readonly #r: Scripted;
  readonly #ttl: number;
  readonly #every: number;
  readonly #log: Logger;
  #state: LeaseState = 'standby';
  /** The fence of the current term (0: none). */
  #fence = 0;
  /** The term this process believes it holds (local clock). */
  readonly #term: LeaseTerm;
  #tick: NodeJS.Timeout | null = null;
  #busy = false;
  #stopped = false;
  /** Stopped renewing (tests: a paused process); the timers keep their schedule but do nothing. */
  #paused = false;
  readonly #listeners: ((state: LeaseState, reason: string) => void)[] = [];

  constructor(o: LeaseOptions) {
    this.id = o.id ?? `${process.pid}-${randomBytes(6).toString('hex')}`;
    this.leaseKey = `${o.key}:lease`;
    this.fenceKey = `${o.key}:fence`;
    this.#r = withLeaseScripts(o.redis);
    this.#ttl = o.ttlMs;
    this.#term = new LeaseTerm(o.ttlMs, () => {
      if (!this.#paused && this.#state === 'active') this.#lost('the lease expired without a successful renewal (Redis unreachable?)');
    });
    this.#every = o.renewIntervalMs;
    this.#log = o.log;
  }

  get state(): LeaseState {
    return this.#state;
  }

  /** True while this router should take traffic: it holds the lease, or serves alone without Redis. */
  get leading(): boolean {
    return this.#state !== 'standby';
  }

  get fence(): number {
    return this.#fence;
  }

  onChange(fn: (state: LeaseState, reason: string) => void): void {
    this.#listeners.push(fn);
  }

  #set(state: LeaseState, reason: string): void {
    if (state === this.#state) return;
    const was = this.#state;
    this.#state = state;
    if (state === 'standby') this.#fence = 0;
    // taking the lead is routine (info); losing it is what an operator looks into (warn)
    this.#log[state === 'active' ? 'info' : 'warn']({ event: 'ha.leader_change', from: was, to: state, fence: this.#fence, reason }, `high availability: now ${state}`);
    for (const l of this.#listeners) {
      try {
        l(state, reason);
      } catch (err) {
        this.#log.error({ err }, 'high availability: a lease listener failed');
      }
    }
  }

  /**
   * The first round: try to acquire. Resolves with the state, or rejects when
   * Redis cannot be reached (the caller decides: serve alone or refuse).
   */
  async start(): Promise<LeaseState> {
    await this.round(true);
    this.#tick = setInterval(() => void this.round(false), this.#every);
    this.#tick.unref();
    return this.#state;
  }

  /** Serve without a lease (Redis unreachable at start, `onRedisDown: serve-alone`); rounds keep trying Redis. */
  serveAlone(reason: string): void {
    this.#set('alone', reason);
    if (this.#tick === null) {
      this.#tick = setInterval(() => void this.round(false), this.#every);
      this.#tick.unref();
    }
  }

  /** One renewal (active) or acquisition attempt (standby, alone). `raise`: rethrow a Redis error. */
  async round(raise: boolean): Promise<void> {
    if (this.#busy || this.#stopped || this.#paused) return;
    this.#busy = true;
    const sentAt = performance.now();
    try {
      if (this.#state === 'active') {
        const ok = await this.#r.swyRenew(this.leaseKey, `${this.id}|${this.#fence}`, this.#ttl);
        if (this.#stopped || this.#paused) return;
        if (ok === 1) this.#term.hold(sentAt);
        else this.#lost('the lease was taken over (renewal refused)');
      } else {
        const f = Number(await this.#r.swyAcquire(this.leaseKey, this.fenceKey, this.id, this.#ttl));
        if (this.#stopped || this.#paused) return;
        if (f > 0) {
          this.#fence = f;
          this.#term.hold(sentAt);
          this.#set('active', this.#state === 'alone' ? 'Redis reachable again: acquired the lease' : 'acquired the lease');
        } else if (this.#state === 'alone') this.#set('standby', 'Redis reachable again and another router holds the lease');
      }
    } catch (err) {
      if (raise) throw err;
      // Redis unreachable: an active keeps serving until its lease would have expired (the expiry timer)
      this.#log.debug({ err }, 'high availability: lease round failed');
      if (this.#state === 'active' && !this.#paused && this.#term.over()) this.#lost('the lease expired without a successful renewal (Redis unreachable?)');
    } finally {
      this.#busy = false;
    }
  }

  #lost(reason: string): void {
    this.#term.end();
    this.#set('standby', reason);
  }

  /**
   * Appends `payload` to `stream` only if `fence` is still the newest (the
   * fencing check, in Redis). Resolves with the entry id, or null when refused.
   */
  async fencedAppend(stream: string, fence: number, maxLen: number, payload: Buffer): Promise<string | null> {
    const id = await this.#r.swyFencedXadd(this.fenceKey, stream, fence, maxLen, payload);
    if (id === null && fence === this.#fence && this.#state === 'active') this.#lost('a newer fence exists: another router acquired the lease');
    return id;
  }

  /** Tests: stop acting as if the process were frozen (no renewals, no step-down, no timers firing effects). */
  pause(): void {
    this.#paused = true;
  }

  /** Tests: the frozen process wakes up, still believing what it believed. */
  resume(): void {
    this.#paused = false;
  }

  /** Stops the rounds; `release`: give the lease up at once (a graceful shutdown hands over without waiting for the TTL). */
  async stop(release: boolean): Promise<void> {
    this.#stopped = true;
    if (this.#tick !== null) clearInterval(this.#tick);
    this.#term.end();
    this.#tick = null;
    if (release && this.#state === 'active') {
      try {
        await this.#r.swyRelease(this.leaseKey, `${this.id}|${this.#fence}`);
      } catch {
        /* Redis gone: the lease expires by itself */
      }
    }
    this.#set('standby', 'stopped');
  }
}
