// Live endpoints: what changes the EndpointSet at runtime, and the contract
// every endpoint source (the config file and its reloads, the admin API, a
// Kubernetes InferencePool watcher) works through. A source never touches the
// scheduler, the data layer or the metrics: it adds, drains and removes
// endpoints here, and those follow the set's listeners.
//
// Draining: the endpoint leaves routing at once (no new request), its
// in-flight requests get up to a grace period to finish, then it leaves the
// set (scrapes stop, its prefix-index entries are dropped, its gauges go). A
// request still running when the grace period ends is not cut: it finishes on
// its open connection (the endpoint's id is never reused, so its accounting
// cannot land on another endpoint).
import type { EndpointConfig, PoolConfig, Role } from '../config/schema.js';
import { EndpointError } from '../errors.js';
import type { Endpoint, EndpointOrigin, EndpointSet } from './endpoint.js';

/** One endpoint as a source describes it: a pool (its engine, models, accelerator) plus the endpoint's own fields. */
export interface EndpointSpec extends EndpointConfig {
  pool: string;
}

/** What an endpoint source may do (implemented by LiveEndpoints). */
export interface EndpointTarget {
  /** Adds an endpoint to an existing pool (EndpointError: unknown pool 404, name taken 409). */
  add(spec: EndpointSpec, origin: EndpointOrigin): Endpoint;
  /** Stops new requests to it; resolves once it has no request in flight or `graceMs` passed. It stays listed. */
  drain(name: string, opts?: DrainOptions): Promise<DrainResult>;
  /** Drains, then removes it (EndpointError: unknown 404; the last active endpoint of a model without `force` 409). */
  remove(name: string, opts?: RemoveOptions): Promise<DrainResult>;
  /**
   * Makes the endpoints of `origin` exactly `pools`' endpoints: adds the new
   * ones, drains and removes those gone, replaces those whose definition
   * changed (url, role, revision, capacity, or their pool's engine, models,
   * accelerator, batch limit). Endpoints of other origins are left alone.
   */
  reconcile(origin: EndpointOrigin, pools: readonly PoolConfig[], opts?: DrainOptions): ReconcileResult;
  /** Every live endpoint with its role, revision, state, health and load. */
  list(): EndpointView[];
}

/**
 * An endpoint source: the config file (reload on SIGHUP), the admin API, a
 * Kubernetes watcher. start() gets the target and feeds it until close().
 * A source that knows its whole desired set (a pod list, a file) calls
 * reconcile() with its own origin name on every change; one that gets single
 * commands calls add/drain/remove.
 */
export interface EndpointSource {
  /** The origin name its endpoints carry (unique per router). */
  readonly name: string;
  start(target: EndpointTarget): Promise<void> | void;
  close(): Promise<void> | void;
}

export interface DrainOptions {
  /** How long in-flight requests get before the endpoint is removed anyway (default: the manager's). */
  graceMs?: number;
}

export interface RemoveOptions extends DrainOptions {
  /** Allows removing the last active endpoint of a model. */
  force?: boolean;
}

export interface DrainResult {
  endpoint: string;
  /** Requests still in flight when the wait ended (0: drained cleanly). */
  inFlightLeft: number;
  waitedMs: number;
}

export interface ReconcileResult {
  added: string[];
  removed: string[];
  replaced: string[];
}

export interface EndpointView {
  name: string;
  pool: string;
  url: string;
  engine: string;
  models: readonly string[];
  role: Role;
  revision: string | null;
  origin: string;
  state: 'active' | 'draining';
  health: string;
  ready: boolean;
  inFlight: number;
  waiting: number;
  running: number;
  kvUsage: number | null;
  metricsFresh: boolean;
}

export interface LiveEndpointsOptions {
  /** Default grace period of a drain (ms). */
  graceMs?: number;
  /** How often a drain checks the in-flight count (ms). */
  pollMs?: number;
}

/** Counters of runtime changes (the router's metrics read them). */
export interface LiveCounters {
  added: number;
  drained: number;
  removed: number;
  /** Removals whose grace period ended with requests still in flight. */
  graceExpired: number;
}

function sameDefinition(ep: Endpoint, pool: PoolConfig, ec: EndpointConfig): boolean {
  const c = ep.configuredCapacity;
  const d = ec.capacity;
  return (
    ep.pool === pool.name &&
    ep.url === ec.url &&
    ep.role === ec.role &&
    ep.revision === ec.revision &&
    ep.bootstrapPort === ec.bootstrapPort &&
    ep.engine === pool.engine &&
    ep.accelerator === pool.accelerator &&
    ep.configuredBatchLimit === pool.batchLimit &&
    ep.models.length === pool.models.length &&
    ep.models.every((m, i) => pool.models[i] === m) &&
    (c === undefined) === (d === undefined) &&
    (c === undefined || (c.gpuBlocks === d!.gpuBlocks && c.cpuBlocks === d!.cpuBlocks && c.diskBlocks === d!.diskBlocks))
  );
}

export class LiveEndpoints implements EndpointTarget {
  readonly set: EndpointSet;
  readonly graceMs: number;
  readonly counters: LiveCounters = { added: 0, drained: 0, removed: 0, graceExpired: 0 };
  readonly #pollMs: number;
  /** Drains under way, by endpoint: one wait per endpoint however many callers ask. */
  readonly #waits = new Map<Endpoint, Promise<DrainResult>>();
  readonly #timers = new Set<NodeJS.Timeout>();
  /** The checks of pending waits: close() runs them once more so each resolves. */
  readonly #pending = new Set<() => void>();
  #healthChecks: () => boolean;
  #closed = false;

  constructor(set: EndpointSet, opts: LiveEndpointsOptions = {}) {
    this.set = set;
    this.graceMs = opts.graceMs ?? 30_000;
    this.#pollMs = opts.pollMs ?? 20;
    this.#healthChecks = () => set.dataLayer.healthIntervalMs > 0;
  }

  add(spec: EndpointSpec, origin: EndpointOrigin): Endpoint {
    const pool = this.set.pool(spec.pool);
    if (pool === undefined) throw new EndpointError(`no pool named "${spec.pool}"`, 'SWY_ERR_POOL_UNKNOWN');
    const { pool: _p, ...ec } = spec;
    const ep = this.set.add(pool, ec, origin);
    this.counters.added++;
    return ep;
  }

  drain(name: string, opts: DrainOptions = {}): Promise<DrainResult> {
    const ep = this.set.find(name);
    if (ep === undefined) return Promise.reject(new EndpointError(`no endpoint named "${name}"`, 'SWY_ERR_ENDPOINT_UNKNOWN'));
    return this.#drain(ep, opts.graceMs ?? this.graceMs);
  }

  async remove(name: string, opts: RemoveOptions = {}): Promise<DrainResult> {
    const ep = this.set.find(name);
    if (ep === undefined) throw new EndpointError(`no endpoint named "${name}"`, 'SWY_ERR_ENDPOINT_UNKNOWN');
    if (!opts.force && ep.state === 'active') {
      const orphaned = ep.models.filter((m) => (this.set.forModel(m) ?? []).every((e) => e === ep));
      if (orphaned.length > 0)
        throw new EndpointError(
          `"${name}" is the last active endpoint of ${orphaned.map((m) => `"${m}"`).join(', ')}: removing it needs force`,
          'SWY_ERR_ENDPOINT_LAST',
        );
    }
    return this.#removeAfterDrain(ep, opts.graceMs ?? this.graceMs);
  }

  reconcile(origin: EndpointOrigin, pools: readonly PoolConfig[], opts: DrainOptions = {}): ReconcileResult {
    const grace = opts.graceMs ?? this.graceMs;
    const out: ReconcileResult = { added: [], removed: [], replaced: [] };
    const wanted = new Map<string, { pool: PoolConfig; ec: EndpointConfig }>();
    for (const pool of pools) for (const ec of pool.endpoints) wanted.set(ec.name, { pool, ec });
    // pools first: an added endpoint takes its pool's definition. A pool this
    // source does not list stays when another origin has endpoints in it or it
    // has none at all (a discovered pool waiting for its pods).
    const others = this.set.pools.filter((p) => {
      if (pools.some((q) => q.name === p.name)) return false;
      const live = this.set.all.filter((e) => e.pool === p.name && !e.removed);
      return live.length === 0 || live.some((e) => e.origin !== origin);
    });
    this.set.setPools([...pools, ...others]);
    for (const ep of [...this.set.all]) {
      if (ep.origin !== origin || ep.state !== 'active') continue;
      const w = wanted.get(ep.name);
      if (w !== undefined && sameDefinition(ep, w.pool, w.ec)) {
        wanted.delete(ep.name);
        continue;
      }
      // gone or changed: out of routing now, removed once its requests end
      this.set.startDrain(ep);
      void this.#removeAfterDrain(ep, grace);
      (w === undefined ? out.removed : out.replaced).push(ep.name);
    }
    for (const { pool, ec } of wanted.values()) {
      if (this.set.byName(ec.name) !== undefined) continue; // another origin's endpoint holds the name: left alone
      this.set.add(pool, ec, origin);
      this.counters.added++;
      if (!out.replaced.includes(ec.name)) out.added.push(ec.name);
    }
    return out;
  }

  list(): EndpointView[] {
    const now = performance.now();
    const checks = this.#healthChecks();
    return this.set.all.map((ep) => {
      const fresh = ep.fresh(now);
      return {
        name: ep.name,
        pool: ep.pool,
        url: ep.url,
        engine: ep.engine,
        models: ep.models,
        role: ep.role,
        revision: ep.revision ?? null,
        origin: ep.origin,
        state: ep.state,
        health: ep.health,
        ready: ep.state === 'active' && ep.ready(now, checks),
        inFlight: ep.inFlight,
        waiting: fresh ? ep.metrics.waiting : 0,
        running: fresh ? ep.metrics.running : 0,
        kvUsage: fresh && !Number.isNaN(ep.metrics.kvUsage) ? ep.metrics.kvUsage : null,
        metricsFresh: fresh,
      };
    });
  }

  /** Stops pending drain waits (they resolve at once); removals they would have made are not made. */
  close(): void {
    this.#closed = true;
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    for (const check of [...this.#pending]) check();
  }

  #drain(ep: Endpoint, graceMs: number): Promise<DrainResult> {
    this.set.startDrain(ep);
    let w = this.#waits.get(ep);
    if (w === undefined) {
      this.counters.drained++;
      w = this.#waitIdle(ep, graceMs).finally(() => this.#waits.delete(ep));
      this.#waits.set(ep, w);
    }
    return w;
  }

  async #removeAfterDrain(ep: Endpoint, graceMs: number): Promise<DrainResult> {
    const r = await this.#drain(ep, graceMs);
    if (this.#closed || ep.removed) return r;
    if (r.inFlightLeft > 0) this.counters.graceExpired++;
    this.set.delete(ep);
    this.counters.removed++;
    return r;
  }

  /** Polls the endpoint's in-flight count (off the request path) until 0 or the grace period ends. */
  #waitIdle(ep: Endpoint, graceMs: number): Promise<DrainResult> {
    const t0 = performance.now();
    return new Promise((resolve) => {
      const check = () => {
        const waited = performance.now() - t0;
        if (ep.inFlight === 0 || waited >= graceMs || this.#closed || ep.removed) {
          this.#pending.delete(check);
          resolve({ endpoint: ep.name, inFlightLeft: ep.inFlight, waitedMs: Math.round(waited) });
          return;
        }
        this.#pending.add(check);
        const t = setTimeout(() => {
          this.#timers.delete(t);
          check();
        }, Math.min(this.#pollMs, Math.max(1, graceMs - waited)));
        t.unref();
        this.#timers.add(t);
      };
      check();
    });
  }
}
