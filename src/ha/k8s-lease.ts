// The active/standby lease as a Kubernetes `coordination.k8s.io/v1` Lease
// (the object client-go's leader election uses). The same contract as the
// Redis lease (src/ha/lease.ts, `Lease`), so the standby pair and /readyz do
// not care which one holds it.
//
// Every write is a PUT carrying the resourceVersion we read: the API server
// refuses it with 409 Conflict when anyone wrote in between (optimistic
// concurrency), so two routers racing for an expired lease cannot both win,
// and an active whose renewal gets 409 has lost the lease. The record:
// holderIdentity, leaseDurationSeconds, acquireTime, renewTime and
// leaseTransitions (incremented on every acquisition). The fencing token of a
// term is leaseTransitions + 1, larger than any earlier term's.
//
// Expiry is judged as client-go does, on the local clock only: a standby notes
// when it last saw the record change (its resourceVersion) and takes over when
// it has not changed for leaseDurationSeconds, so clock skew between the
// routers and the API server does not matter. An active believes it holds the
// lease until `sentAt + ttl` of its last successful write (no later than any
// standby's view of the expiry), keeps serving while the API server is
// unreachable until then, and steps down after.
//
// With a Redis beside it (ha.redis), the warm standby's delta stream is
// fenced in Redis by the same token: an append succeeds only when its fence
// is at least the largest seen, which it then becomes (a newer term raises the
// bar; an old active's appends are refused).
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { LeaseTerm, type Lease, type LeaseState } from './lease.js';
import { KubeApiError, type KubeApi, type KubeObject } from '../k8s/api.js';

interface LeaseSpec {
  holderIdentity?: string | null;
  leaseDurationSeconds?: number;
  acquireTime?: string | null;
  renewTime?: string | null;
  leaseTransitions?: number;
}
type LeaseObject = KubeObject & { spec?: LeaseSpec };

const FENCED_XADD_MAX = `
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local f = tonumber(ARGV[1])
if f < cur then return false end
if f > cur then redis.call('SET', KEYS[1], ARGV[1]) end
return redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'f', ARGV[1], 'd', ARGV[3])`;

type Scripted = Redis & { swyFencedXaddMax(fence: string, stream: string, token: number, maxLen: number, payload: Buffer): Promise<string | null> };

export interface KubernetesLeaseOptions {
  api: KubeApi;
  namespace: string;
  /** The Lease object's name. */
  name: string;
  ttlMs: number;
  renewIntervalMs: number;
  log: Logger;
  /** holderIdentity (default: the pod's hostname plus a random suffix). */
  id?: string;
  /** Where the warm standby's delta stream is fenced (ha.redis), if any. */
  redis?: Redis;
  /** The Redis key of the fence counter. */
  fenceKey?: string;
}

/** MicroTime as the API server writes it: RFC 3339 with microseconds. */
function microTime(d = new Date()): string {
  return d.toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

export class KubernetesLease implements Lease {
  readonly id: string;
  readonly path: string;
  readonly #o: KubernetesLeaseOptions;
  readonly #durationS: number;
  readonly #r: Scripted | null;
  #state: LeaseState = 'standby';
  #fence = 0;
  /** The term this process believes it holds (local clock). */
  readonly #term: LeaseTerm;
  /** The record's resourceVersion when last seen, and when (local clock) it last changed. */
  #seenRv = '';
  #seenAt = 0;
  #tick: NodeJS.Timeout | null = null;
  #busy = false;
  #stopped = false;
  #paused = false;
  readonly #listeners: ((state: LeaseState, reason: string) => void)[] = [];
  /** Writes refused with 409 Conflict (a lost race or a lost lease). */
  conflicts = 0;

  constructor(o: KubernetesLeaseOptions) {
    this.#o = o;
    this.id = o.id ?? `${hostname()}-${randomBytes(4).toString('hex')}`;
    this.path = `/apis/coordination.k8s.io/v1/namespaces/${o.namespace}/leases`;
    this.#durationS = Math.max(1, Math.ceil(o.ttlMs / 1000));
    this.#term = new LeaseTerm(o.ttlMs, () => {
      if (!this.#paused && this.#state === 'active') this.#lost('the lease expired without a successful renewal (API server unreachable?)');
    });
    if (o.redis) {
      const s = o.redis as Scripted;
      if (typeof s.swyFencedXaddMax !== 'function') o.redis.defineCommand('swyFencedXaddMax', { numberOfKeys: 2, lua: FENCED_XADD_MAX });
      this.#r = s;
    } else this.#r = null;
  }

  get state(): LeaseState {
    return this.#state;
  }

  get leading(): boolean {
    return this.#state !== 'standby';
  }

  get fence(): number {
    return this.#fence;
  }

  onChange(fn: (state: LeaseState, reason: string) => void): void {
    this.#listeners.push(fn);
  }

  async start(): Promise<LeaseState> {
    await this.round(true);
    this.#startTicking();
    return this.#state;
  }

  serveAlone(reason: string): void {
    this.#set('alone', reason);
    this.#startTicking();
  }

  #startTicking(): void {
    if (this.#tick !== null) return;
    this.#tick = setInterval(() => void this.round(false), this.#o.renewIntervalMs);
    this.#tick.unref();
  }

  async round(raise: boolean): Promise<void> {
    if (this.#busy || this.#stopped || this.#paused) return;
    this.#busy = true;
    const sentAt = performance.now();
    try {
      await this.#attempt(sentAt);
    } catch (err) {
      if (raise) throw err;
      this.#o.log.debug({ err: (err as Error).message }, 'high availability: Kubernetes lease round failed');
      if (this.#state === 'active' && !this.#paused && this.#term.over()) this.#lost('the lease expired without a successful renewal (API server unreachable?)');
    } finally {
      this.#busy = false;
    }
  }

  async #attempt(sentAt: number): Promise<void> {
    const o = this.#o;
    let cur: LeaseObject | null;
    try {
      cur = await o.api.get<LeaseObject>(`${this.path}/${o.name}`);
    } catch (err) {
      if (!(err instanceof KubeApiError && err.status === 404)) throw err;
      cur = null;
    }
    if (this.#stopped || this.#paused) return;
    const now = microTime();
    if (cur === null) {
      // nobody has held it yet: create it (409 AlreadyExists: another router was first)
      const body = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: o.name, namespace: o.namespace }, spec: { holderIdentity: this.id, leaseDurationSeconds: this.#durationS, acquireTime: now, renewTime: now, leaseTransitions: 0 } };
      const made = await this.#write(() => o.api.post<LeaseObject>(this.path, body));
      if (made !== null) this.#won(made, sentAt);
      return;
    }
    const spec = cur.spec ?? {};
    const rv = cur.metadata.resourceVersion ?? '';
    if (rv !== this.#seenRv) {
      this.#seenRv = rv;
      this.#seenAt = performance.now();
    }
    const mine = spec.holderIdentity === this.id;
    if (mine && this.#state === 'active') {
      const renewed = await this.#write(() => o.api.put<LeaseObject>(`${this.path}/${o.name}`, { ...cur, spec: { ...spec, renewTime: now, leaseDurationSeconds: this.#durationS } }));
      if (this.#stopped || this.#paused) return;
      if (renewed === null) this.#lost('the lease was taken over (renewal refused with 409 Conflict)');
      else {
        this.#seen(renewed);
        this.#term.hold(sentAt);
      }
      return;
    }
    if (!mine && this.#state === 'active') {
      this.#lost(`another router holds the lease (${String(spec.holderIdentity)})`);
      return;
    }
    const free = !spec.holderIdentity;
    const durationMs = (spec.leaseDurationSeconds ?? this.#durationS) * 1000;
    const expired = performance.now() - this.#seenAt >= durationMs;
    if (!mine && !free && !expired) {
      if (this.#state === 'alone') this.#set('standby', 'the API server is reachable again and another router holds the lease');
      return;
    }
    // free, expired, or ours from an earlier term: a new term
    const next = { ...cur, spec: { ...spec, holderIdentity: this.id, leaseDurationSeconds: this.#durationS, acquireTime: now, renewTime: now, leaseTransitions: (spec.leaseTransitions ?? 0) + 1 } };
    const taken = await this.#write(() => o.api.put<LeaseObject>(`${this.path}/${o.name}`, next));
    if (taken !== null) this.#won(taken, sentAt);
  }

  /** A write, or null when the API server refused it with 409 (someone wrote first). */
  async #write(fn: () => Promise<LeaseObject>): Promise<LeaseObject | null> {
    try {
      return await fn();
    } catch (err) {
      if (err instanceof KubeApiError && err.status === 409) {
        this.conflicts++;
        return null;
      }
      throw err;
    }
  }

  #seen(obj: LeaseObject): void {
    this.#seenRv = obj.metadata.resourceVersion ?? '';
    this.#seenAt = performance.now();
  }

  #won(obj: LeaseObject, sentAt: number): void {
    if (this.#stopped || this.#paused) return;
    this.#seen(obj);
    this.#fence = (obj.spec?.leaseTransitions ?? 0) + 1;
    this.#term.hold(sentAt);
    this.#set('active', this.#state === 'alone' ? 'the API server is reachable again: acquired the lease' : 'acquired the Kubernetes lease');
  }

  #lost(reason: string): void {
    this.#term.end();
    this.#set('standby', reason);
  }

  #set(state: LeaseState, reason: string): void {
    if (state === this.#state) return;
    const was = this.#state;
    this.#state = state;
    if (state === 'standby') this.#fence = 0;
    this.#o.log[state === 'active' ? 'info' : 'warn']({ event: 'ha.leader_change', from: was, to: state, fence: this.#fence, reason, lease: `${this.#o.namespace}/${this.#o.name}` }, `high availability: now ${state}`);
    for (const l of this.#listeners) {
      try {
        l(state, reason);
      } catch (err) {
        this.#o.log.error({ err }, 'high availability: a lease listener failed');
      }
    }
  }

  async fencedAppend(stream: string, fence: number, maxLen: number, payload: Buffer): Promise<string | null> {
    if (this.#r === null) return null;
    const id = await this.#r.swyFencedXaddMax(this.#o.fenceKey ?? 'switchyard:ha:fence', stream, fence, maxLen, payload);
    if (id === null && fence === this.#fence && this.#state === 'active') this.#lost('a newer fence exists: another router acquired the lease');
    return id;
  }

  pause(): void {
    this.#paused = true;
  }

  resume(): void {
    this.#paused = false;
  }

  /** Stops the rounds; `release`: clear holderIdentity so the standby takes over at once. */
  async stop(release: boolean): Promise<void> {
    this.#stopped = true;
    if (this.#tick !== null) clearInterval(this.#tick);
    this.#term.end();
    this.#tick = null;
    if (release && this.#state === 'active') {
      const o = this.#o;
      try {
        const cur = await o.api.get<LeaseObject>(`${this.path}/${o.name}`);
        if (cur.spec?.holderIdentity === this.id) await o.api.put(`${this.path}/${o.name}`, { ...cur, spec: { ...cur.spec, holderIdentity: null, renewTime: microTime() } });
      } catch {
        /* API server gone or a conflict: the lease expires by itself */
      }
    }
    this.#set('standby', 'stopped');
  }
}
