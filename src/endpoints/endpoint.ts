// Endpoints (model-server replicas), the pools that group them, and each
// endpoint's live state: the router's own in-flight count, the engine's last
// scraped metrics, health from /health, and a circuit breaker fed by request
// outcomes.
import type { Accelerator, CapacityConfig, DataLayerConfig, Engine, PoolConfig, Role } from '../config/schema.js';
import { DEFAULTS } from '../config/schema.js';
import type { EngineMetrics } from './engine-metrics.js';
import { BatchLimit } from './batch-limit.js';
import { acceleratorProfile } from '../accelerators.js';
import type { LatencyModel } from './latency-model.js';

export type Health = 'unknown' | 'up' | 'down';

export class Endpoint {
  readonly id: number;
  readonly name: string;
  /** Origin URL, no trailing slash, e.g. http://127.0.0.1:9001 */
  readonly url: string;
  readonly pool: string;
  readonly engine: Engine;
  readonly accelerator: Accelerator;
  /** Speed against the reference (pools[].speed, else the accelerator profile): the latency model's priors. */
  readonly prefillCostFactor: number;
  readonly decodeCostFactor: number;
  /** Relative cost per unit of time (pools[].cost, else the profile's). */
  readonly cost: number;
  readonly models: readonly string[];
  readonly role: Role;
  readonly revision: string | undefined;
  /** Prefix-index capacity from the config; when absent it comes from the engine's cache_config_info. */
  readonly configuredCapacity: CapacityConfig | undefined;
  /** Metrics older than this are stale (the data layer's `staleAfterMs`). */
  readonly staleAfterMs: number;

  /** Requests the router has dispatched here and not yet completed. Always fresh. */
  inFlight = 0;
  /** Requests dispatched here since start. */
  dispatched = 0;
  /** Requests dispatched since the request of the last successful scrape left (the engine's metrics cannot show them yet). */
  sinceScrape = 0;

  readonly metrics: EngineMetrics = { waiting: 0, running: 0, kvUsage: NaN, cacheBlocks: 0, cacheBlockTokens: 0 };
  /** performance.now() of the last successful scrape; 0 = never. */
  metricsAt = 0;
  /**
   * Requests at the engine at the last successful scrape that were not the
   * router's (other routers' or clients'): running + waiting beyond the router's
   * own in-flight requests. Counts only while fresh.
   */
  foreign = 0;
  /** The engine's batch limit, learned from its running/waiting counts. */
  readonly batch: BatchLimit;
  health: Health = 'unknown';
  healthAt = 0;
  /** The learned latency model, when a latency plugin (predicted-latency) uses one; null otherwise. */
  latency: LatencyModel | null = null;

  consecutiveFailures = 0;
  /** performance.now() until which the breaker is open (0 = closed). */
  breakerOpenUntil = 0;
  /**
   * After the cooldown one trial request is let through (half-open): its
   * dispatch number (`dispatched` when it was sent), 0 while none is out. Only
   * the trial's own end closes or reopens the breaker, or lets another trial go:
   * requests sent before the breaker opened may still end while it runs.
   */
  trialSeq = 0;

  /** True while a half-open trial request is out. */
  get trialInFlight(): boolean {
    return this.trialSeq !== 0;
  }

  constructor(id: number, pool: PoolConfig, ep: PoolConfig['endpoints'][number], staleAfterMs: number = DEFAULTS.dataLayer.staleAfterMs) {
    this.id = id;
    this.name = ep.name;
    this.url = ep.url;
    this.pool = pool.name;
    this.engine = pool.engine;
    this.accelerator = pool.accelerator;
    const profile = acceleratorProfile(pool.accelerator);
    this.prefillCostFactor = pool.speed?.prefillCostFactor ?? profile?.prefillCostFactor ?? 1;
    this.decodeCostFactor = pool.speed?.decodeCostFactor ?? profile?.decodeCostFactor ?? 1;
    this.cost = pool.cost ?? profile?.cost ?? 1;
    this.models = pool.models;
    this.role = ep.role;
    this.revision = ep.revision;
    this.configuredCapacity = ep.capacity;
    this.staleAfterMs = staleAfterMs;
    this.batch = new BatchLimit(pool.batchLimit);
  }

  /** True when metrics were scraped within `staleAfterMs` of `now`. */
  fresh(now: number): boolean {
    return this.metricsAt > 0 && now - this.metricsAt <= this.staleAfterMs;
  }

  /**
   * Requests waiting at the engine: the engine's last waiting count plus what
   * the router sent since that scrape and still has out; with stale metrics,
   * the router's in-flight count alone.
   */
  queueEstimate(now: number): number {
    return this.fresh(now) ? this.metrics.waiting + Math.min(this.sinceScrape, this.inFlight) : this.inFlight;
  }

  /**
   * Requests at the engine now, running or waiting: the router's own in-flight
   * count (exact at any moment, scrapes or not) plus, while the metrics are
   * fresh, what the last scrape showed beyond the router's own requests.
   */
  occupancy(now: number): number {
    return this.foreign > 0 && this.fresh(now) ? this.inFlight + this.foreign : this.inFlight;
  }

  /** How many requests the engine runs at once: learned from its metrics, a default until then. */
  get batchLimit(): number {
    return this.batch.value;
  }

  /**
   * Called by the data layer after a successful scrape (`metrics`, `metricsAt`
   * and `sinceScrape` already set): learns the batch limit and what of the
   * engine's load is not the router's.
   */
  onScrape(): void {
    const m = this.metrics;
    this.batch.observe(m.running, m.waiting);
    // Beyond all the router has out now: requests it sent while the scrape was
    // on its way often reach the engine before the engine answers it, so
    // leaving them out would count them twice (as foreign and as in flight)
    // and hold requests for nothing until the next scrape; counted here, at
    // worst some other client's load is missed until then.
    const other = m.running + m.waiting - this.inFlight;
    this.foreign = other > 0 ? other : 0;
  }

  breakerOpen(now: number): boolean {
    if (this.breakerOpenUntil === 0) return false;
    if (now < this.breakerOpenUntil) return true;
    return this.trialInFlight; // half-open: one trial at a time
  }

  /** Can requests be sent here now? Unknown health counts as routable. */
  routable(now: number): boolean {
    return this.health !== 'down' && !this.breakerOpen(now);
  }

  /** Ready for /readyz: known healthy (or health checks off) and breaker closed. */
  ready(now: number, healthChecks: boolean): boolean {
    return (this.health === 'up' || (!healthChecks && this.health !== 'down')) && !this.breakerOpen(now);
  }

  /** Called when a request is sent here; returns its dispatch number (pass it to onOutcome/onRelease). */
  onDispatch(now: number): number {
    this.inFlight++;
    const seq = ++this.dispatched;
    this.sinceScrape++;
    if (this.breakerOpenUntil !== 0 && now >= this.breakerOpenUntil && this.trialSeq === 0) this.trialSeq = seq;
    return seq;
  }

  /**
   * Called once per dispatched request with its dispatch number. `failed`:
   * connect error, reset or 5xx from the engine.
   */
  onOutcome(now: number, failed: boolean, cfg: DataLayerConfig, seq = 0): void {
    if (this.inFlight > 0) this.inFlight--;
    if (seq !== 0 && seq === this.trialSeq) {
      // the half-open trial decides: closed after a success, open for another cooldown after a failure
      this.trialSeq = 0;
      if (failed) {
        this.consecutiveFailures++;
        this.breakerOpenUntil = now + cfg.breakerCooldownMs;
      } else {
        this.consecutiveFailures = 0;
        this.breakerOpenUntil = 0;
      }
      return;
    }
    if (failed) {
      this.consecutiveFailures++;
      if (this.breakerOpenUntil === 0 && this.consecutiveFailures >= cfg.breakerFailures) {
        this.breakerOpenUntil = now + cfg.breakerCooldownMs;
      }
    } else if (this.breakerOpenUntil === 0) {
      // a success resets the count; while the breaker is open only its trial can close it
      this.consecutiveFailures = 0;
    }
  }

  /** Called when a request is released without an engine outcome (client abort), with its dispatch number. */
  onRelease(seq = 0): void {
    if (this.inFlight > 0) this.inFlight--;
    if (seq !== 0 && seq === this.trialSeq) this.trialSeq = 0; // the trial went away: the next request may be one
  }
}

/** All endpoints of all pools, with lookups by name and by model. */
export class EndpointSet {
  readonly all: Endpoint[] = [];
  readonly pools: readonly PoolConfig[];
  readonly dataLayer: DataLayerConfig;
  readonly #byName = new Map<string, Endpoint>();
  readonly #byModel = new Map<string, Endpoint[]>();

  constructor(pools: readonly PoolConfig[], dataLayer: DataLayerConfig = DEFAULTS.dataLayer) {
    this.pools = pools;
    this.dataLayer = dataLayer;
    for (const pool of pools) {
      for (const ec of pool.endpoints) {
        const ep = new Endpoint(this.all.length, pool, ec, dataLayer.staleAfterMs);
        this.all.push(ep);
        this.#byName.set(ep.name, ep);
        for (const m of pool.models) {
          let list = this.#byModel.get(m);
          if (!list) this.#byModel.set(m, (list = []));
          list.push(ep);
        }
      }
    }
  }

  byName(name: string): Endpoint | undefined {
    return this.#byName.get(name);
  }

  /** Endpoints serving `model` (shared array: do not mutate), or undefined for an unknown model. */
  forModel(model: string): readonly Endpoint[] | undefined {
    return this.#byModel.get(model);
  }

  models(): string[] {
    return [...this.#byModel.keys()];
  }
}
