// Endpoints (model-server replicas), the pools that group them, and each
// endpoint's live state: the router's own in-flight count, the engine's last
// scraped metrics, health from /health, and a circuit breaker fed by request
// outcomes.
import type { Accelerator, CapacityConfig, DataLayerConfig, Engine, EndpointConfig, PoolConfig, Role } from '../config/schema.js';
import { DEFAULTS } from '../config/schema.js';
import { emptyEngineMetrics, type EngineMetrics } from './engine-metrics.js';
import { BatchLimit } from './batch-limit.js';
import { EndpointError } from '../errors.js';
import { acceleratorProfile } from '../accelerators.js';
import { AdapterStats } from './adapter-stats.js';
import type { LatencyModel } from './latency-model.js';
import { SpeedModel } from './speed.js';

export type Health = 'unknown' | 'up' | 'down';

/**
 * State changes of endpoints, for the router's log (src/server/state-log.ts).
 * Called on changes only (never per request): health, breaker, draining, and
 * upstream failures (which the listener rate-limits).
 */
export interface EndpointEvents {
  health(ep: Endpoint, from: Health, to: Health, reason: string): void;
  breaker(ep: Endpoint, open: boolean): void;
  draining(ep: Endpoint): void;
  /** The endpoint's GET /v1/models lists `served`: `missing` are its pool's models it does not serve (empty: all served again). */
  models(ep: Endpoint, missing: readonly string[], served: readonly string[]): void;
  /** A request's upstream leg failed (connect, DNS, reset, timeout); `midStream`: after bytes went to the client. */
  upstreamFailed(ep: Endpoint, message: string, midStream: boolean): void;
}

export class Endpoint {
  readonly id: number;
  readonly name: string;
  /** Origin URL, no trailing slash, e.g. http://127.0.0.1:9001 */
  readonly url: string;
  readonly pool: string;
  /** `Bearer <key>` from the pool's upstreamAuth variable, sent on every upstream request to this endpoint; '' = none. */
  readonly upstreamAuthorization: string;
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
  /** SGLang prefill endpoints: the engine's bootstrap port, when configured per endpoint. */
  readonly bootstrapPort: number | undefined;
  /** Prefix-index capacity from the config; when absent it comes from the engine's cache_config_info. */
  readonly configuredCapacity: CapacityConfig | undefined;
  /** Metrics older than this are stale (the data layer's `staleAfterMs`). */
  readonly staleAfterMs: number;
  /** The pool's configured batch limit (pools[].batchLimit), if any. */
  readonly configuredBatchLimit: number | undefined;

  /** Who added it: 'config' (the file and its reloads), 'admin', or another endpoint source's name. */
  origin: EndpointOrigin = 'config';
  /** 'draining': takes no new request (see EndpointSet.startDrain). */
  state: EndpointState = 'active';
  /** True once it left its EndpointSet. */
  removed = false;

  /** Requests the router has dispatched here and not yet completed. Always fresh. */
  inFlight = 0;
  /** Requests dispatched here since start. */
  dispatched = 0;
  /** Requests dispatched since the request of the last successful scrape left (the engine's metrics cannot show them yet). */
  sinceScrape = 0;
  /**
   * Prefill backlog: uncached prompt tokens of the router's requests here
   * that have not had a first body byte back (counted at the pick from the
   * prefix producer's match, released at the first byte or the request's
   * end; Scheduler.pick / prefilled / complete). Always fresh, like inFlight.
   */
  prefillPending = 0;
  /** The router's requests counted in prefillPending (those with uncached tokens). */
  prefillRequests = 0;
  /**
   * Other router replicas' requests here (active-active, src/ha/fleet.ts):
   * the sum of their last reports that have not expired, set off the request
   * path as the reports arrive; 0 without replicas. `peerUnseen`: of those,
   * the ones sent since their replica's last scrape, from the reports that
   * arrived after this router's last scrape left (the scrape shows the
   * earlier ones); `peerPrefillPending` and `peerPrefillRequests`: their
   * prefill backlog.
   */
  peerInFlight = 0;
  peerUnseen = 0;
  peerPrefillPending = 0;
  peerPrefillRequests = 0;

  /** Requests the whole fleet of routers has out here: this router's own plus its replicas' (as of their last reports). */
  get fleetInFlight(): number {
    return this.inFlight + this.peerInFlight;
  }

  readonly metrics: EngineMetrics = emptyEngineMetrics();
  /** LoRA adapters its engine serves (its GET /v1/models lists them with a `parent` among the pool's models; those the router loaded there since). */
  readonly adapters = new Set<string>();
  /** The router's requests here per adapter, in flight now (the lora-affinity scorer's exact view between scrapes). */
  readonly adapterInFlight = new Map<string, number>();
  /** Adapters the router sent here last, most recent last: those likely still in a GPU slot (bounded by the slots, loraMax or 1). */
  readonly recentAdapters = new Map<string, true>();
  /** The pool loads adapters on demand (pools[].adapterLoading): a request for one its engine lacks may go here after a load. */
  readonly adapterLoading: boolean;
  /** Adapter → performance.now() until which this engine is not asked to load it again (it refused). */
  readonly loadRefused = new Map<string, number>();
  /** performance.now() of the last successful scrape; 0 = never. */
  metricsAt = 0;
  /** performance.now() when that scrape's request left (what was sent before it is in its figures). */
  scrapeSentAt = 0;
  /**
   * Requests at the engine at the last successful scrape that were not the
   * router's (other routers' or clients'): running + waiting beyond the router's
   * own in-flight requests. Counts only while fresh.
   */
  foreign = 0;
  /** peerInFlight when that scrape was taken, and the most it has been since: what the replicas reported beyond it may already be in `foreign` (occupancy). */
  peerAtScrape = 0;
  peerPeak = 0;
  /** The engine's batch limit, learned from its running/waiting counts. */
  readonly batch: BatchLimit;
  health: Health = 'unknown';
  healthAt = 0;
  /** Prefill speed learned from every request's first token (always on: the default load scorers read it; speed.ts). */
  readonly speed: SpeedModel;
  /** The learned latency model, when a latency plugin (predicted-latency) uses one; null otherwise. */
  latency: LatencyModel | null = null;

  /**
   * Models of its pool the engine does not serve (its GET /v1/models does not
   * list them): not routed there, and /readyz is not ready for them on its
   * account. Null: none missing, or not checked (an engine without the route).
   */
  missingModels: readonly string[] | null = null;
  /** performance.now() of the last /v1/models check; 0: never. */
  modelsCheckedAt = 0;
  /** State-change listener (the router's log), shared by the set's endpoints; null: none. */
  events: EndpointEvents | null = null;

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
    // read once, here (startup checks the variable is set: src/auth/keys.ts); never the client's header
    const key = pool.upstreamAuth !== undefined ? process.env[pool.upstreamAuth] : undefined;
    this.upstreamAuthorization = key ? `Bearer ${key}` : '';
    this.engine = pool.engine;
    this.accelerator = pool.accelerator;
    const profile = acceleratorProfile(pool.accelerator);
    this.prefillCostFactor = pool.speed?.prefillCostFactor ?? profile?.prefillCostFactor ?? 1;
    this.decodeCostFactor = pool.speed?.decodeCostFactor ?? profile?.decodeCostFactor ?? 1;
    this.cost = pool.cost ?? profile?.cost ?? 1;
    this.speed = new SpeedModel(this.prefillCostFactor);
    this.models = pool.models;
    this.role = ep.role;
    this.revision = ep.revision;
    this.bootstrapPort = ep.bootstrapPort;
    this.configuredCapacity = ep.capacity;
    this.staleAfterMs = staleAfterMs;
    this.configuredBatchLimit = pool.batchLimit;
    this.batch = new BatchLimit(pool.batchLimit);
    this.adapterLoading = pool.adapterLoading?.enabled === true;
  }

  /** The router may ask this engine to load `adapter` (its pool loads on demand, and it has not refused lately). */
  canLoad(adapter: string, now: number): boolean {
    if (!this.adapterLoading) return false;
    const until = this.loadRefused.get(adapter);
    return until === undefined || now >= until;
  }

  /** A request for `adapter` was sent here: counted in flight, remembered as recent. */
  adapterSent(adapter: string): void {
    this.adapterInFlight.set(adapter, (this.adapterInFlight.get(adapter) ?? 0) + 1);
    const r = this.recentAdapters;
    r.delete(adapter);
    r.set(adapter, true);
    const cap = this.metrics.loraMax > 0 ? this.metrics.loraMax : 1;
    if (r.size > cap) for (const k of r.keys()) if (r.size > cap) r.delete(k); else break;
  }

  /** A request for `adapter` sent here ended. */
  adapterDone(adapter: string): void {
    const n = (this.adapterInFlight.get(adapter) ?? 0) - 1;
    if (n > 0) this.adapterInFlight.set(adapter, n);
    else this.adapterInFlight.delete(adapter);
  }

  /**
   * Where `adapter` stands here: 2 = active (requests of it running or
   * waiting at the engine, the router's in flight, or sent here among the last
   * loraMax adapters: likely in a GPU slot), 1 = a free GPU slot (loraMax less
   * the distinct adapters running or waiting), 0 = every slot taken.
   */
  adapterState(adapter: string): 0 | 1 | 2 {
    const m = this.metrics;
    if (this.adapterInFlight.has(adapter) || this.recentAdapters.has(adapter) || m.loraRunning.includes(adapter) || m.loraWaiting.includes(adapter)) return 2;
    const max = m.loraMax > 0 ? m.loraMax : 1;
    let used = this.adapterInFlight.size;
    for (const a of m.loraRunning) if (!this.adapterInFlight.has(a)) used++;
    for (const a of m.loraWaiting) if (!this.adapterInFlight.has(a) && !m.loraRunning.includes(a)) used++;
    return used < max ? 1 : 0;
  }

  /** True when metrics were scraped within `staleAfterMs` of `now`. */
  fresh(now: number): boolean {
    return this.metricsAt > 0 && now - this.metricsAt <= this.staleAfterMs;
  }

  /**
   * Requests waiting at the engine: the engine's last waiting count plus what
   * the router sent since that scrape and still has out (and its replicas',
   * peerUnseen); with stale metrics, the fleet's in-flight count alone.
   */
  queueEstimate(now: number): number {
    return this.fresh(now) ? this.metrics.waiting + Math.min(this.sinceScrape, this.inFlight) + this.peerUnseen : this.inFlight + this.peerInFlight;
  }

  /**
   * Requests at the engine now, running or waiting: the router's own in-flight
   * count (exact at any moment, scrapes or not) and its replicas' (as of their
   * last reports) plus, while the metrics are fresh, what the last scrape
   * showed beyond the fleet's requests.
   */
  occupancy(now: number): number {
    const fleet = this.inFlight + this.peerInFlight;
    if (this.foreign <= 0 || !this.fresh(now)) return fleet;
    // A replica's dispatch that reached the engine before the scrape but its
    // report after it is in `foreign` and, once reported, in peerInFlight:
    // what the replicas added since the scrape comes out of the foreign load,
    // so it is not counted twice until the next scrape (at worst another
    // client's load is missed until then, as for this router's own sends).
    // The most they had out since (not what they have now): when those
    // requests finish, the foreign load they were part of is gone too.
    if (this.peerInFlight > this.peerPeak) this.peerPeak = this.peerInFlight;
    const f = this.foreign - (this.peerPeak - this.peerAtScrape);
    return f > 0 ? fleet + f : fleet;
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
    // (and the replicas' requests, which occupancy() counts on their own)
    const other = m.running + m.waiting - this.inFlight - this.peerInFlight;
    this.foreign = other > 0 ? other : 0;
    this.peerAtScrape = this.peerPeak = this.peerInFlight;
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

  /** Serves `model` as far as its /v1/models says (unchecked: yes). */
  serves(model: string): boolean {
    return this.missingModels === null || !this.missingModels.includes(model);
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
        this.events?.breaker(this, false);
      }
      return;
    }
    if (failed) {
      this.consecutiveFailures++;
      if (this.breakerOpenUntil === 0 && this.consecutiveFailures >= cfg.breakerFailures) {
        this.breakerOpenUntil = now + cfg.breakerCooldownMs;
        this.events?.breaker(this, true);
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

/** Where an endpoint came from: the config file (and its reloads), the admin API, or another source's name. */
export type EndpointOrigin = string;

/** An endpoint's place in its lifecycle: taking requests, or draining (no new ones) until it leaves the set. */
export type EndpointState = 'active' | 'draining';

export type EndpointListener = (ep: Endpoint) => void;

/**
 * Endpoint ids are never reused (upstream connection pools and metrics are
 * keyed by id), so a router can add this many endpoints over its life; the
 * prefix index is sized for it. It is the native index's own ceiling: each id
 * costs the index about 60 bytes (its per-endpoint tier state) and nothing per
 * request, since a match only visits its candidates. A Kubernetes fleet that
 * replaces 50 pods a day uses it up in about 300 days.
 */
export const MAX_ENDPOINT_IDS = 16384;

/**
 * All endpoints of all pools, with lookups by name and by model. The set
 * changes at runtime (config reload, admin API, other endpoint sources, see
 * live.ts): `add` and `startDrain`/`delete`, with listeners (data layer,
 * scheduler, metrics) told of each addition and removal. A draining endpoint
 * leaves the per-model lists at once (the scheduler never sees it again) but
 * stays in `all` (scraped, listed) until `delete`.
 */
export class EndpointSet {
  /** Live endpoints (active and draining), in the order they were added. */
  readonly all: Endpoint[] = [];
  /** Pool definitions by name: the template of an endpoint added at runtime. */
  pools: readonly PoolConfig[];
  readonly dataLayer: DataLayerConfig;
  /** Active endpoints by name (a draining one may share its name with the active one replacing it). */
  readonly #byName = new Map<string, Endpoint>();
  readonly #byModel = new Map<string, Endpoint[]>();
  /** LoRA adapter → its base model: declared (pools[].adapters) or listed by an engine's /v1/models with that parent. */
  readonly #adapterBase = new Map<string, string>();
  /** Requests, misses and loads per adapter (the router's metrics); the assembly sets one capped at metrics.maxLabelValues before any request. */
  adapterStats = new AdapterStats();
  /** Declared adapters: name → [base, path]. */
  #declared = new Map<string, [string, string]>();
  readonly #byId: (Endpoint | undefined)[] = [];
  /** Names by id, kept after removal (request counters of a removed endpoint keep their label). */
  readonly #names: string[] = [];
  readonly #added: EndpointListener[] = [];
  readonly #removed: EndpointListener[] = [];
  readonly #changed: (() => void)[] = [];
  #nextId = 0;
  #events: EndpointEvents | null = null;
  /** The constructor's endpoints are in: later ones are runtime additions. */
  #started = false;

  constructor(pools: readonly PoolConfig[], dataLayer: DataLayerConfig = DEFAULTS.dataLayer) {
    this.pools = pools;
    this.dataLayer = dataLayer;
    this.#declare(pools);
    for (const pool of pools) {
      for (const m of pool.models) if (!this.#byModel.has(m)) this.#byModel.set(m, []);
      for (const ec of pool.endpoints) this.add(pool, ec, 'config');
    }
    this.#started = true;
  }

  /** The state-change listener of every endpoint, present and added later (the router's log). */
  set events(e: EndpointEvents | null) {
    this.#events = e;
    for (const ep of this.all) ep.events = e;
  }

  /** Ids handed out so far (ids are below this). */
  get idsUsed(): number {
    return this.#nextId;
  }

  /** Called after an endpoint joined the set (runtime additions; not for those of the constructor). */
  onAdded(fn: EndpointListener): void {
    this.#added.push(fn);
  }

  /** Called after an endpoint left the set (its requests are over, or its grace period is). */
  onRemoved(fn: EndpointListener): void {
    this.#removed.push(fn);
  }

  /** Called after any change of the routable endpoints or models (added, draining, removed, pools replaced). */
  onChange(fn: () => void): void {
    this.#changed.push(fn);
  }

  /**
   * Adds an endpoint of `pool` (throws EndpointError when the name is taken by
   * an active endpoint or the ids are used up). Added at runtime with health
   * checks on, it is routable once its first health check (made at once) says
   * up; the config's endpoints at start are routable before theirs.
   */
  add(pool: PoolConfig, ec: EndpointConfig, origin: EndpointOrigin = 'config'): Endpoint {
    if (this.#byName.has(ec.name)) throw new EndpointError(`an endpoint named "${ec.name}" exists already`, 'SWY_ERR_ENDPOINT_EXISTS');
    if (this.#nextId >= MAX_ENDPOINT_IDS)
      throw new EndpointError(`this router has added ${MAX_ENDPOINT_IDS} endpoints since it started (ids are not reused); restart it to add more`, 'SWY_ERR_ENDPOINT_IDS');
    const ep = new Endpoint(this.#nextId++, pool, ec, this.dataLayer.staleAfterMs);
    ep.origin = origin;
    ep.events = this.#events;
    // added at runtime: routable only after its first health check says up (it may still be loading)
    if (this.#started && this.dataLayer.healthIntervalMs > 0) ep.health = 'down';
    this.all.push(ep);
    this.#byId[ep.id] = ep;
    this.#names[ep.id] = ep.name;
    this.#byName.set(ep.name, ep);
    for (const m of pool.models) {
      // copy on write: a list handed out by forModel() is never changed under its reader
      const list = this.#byModel.get(m);
      this.#byModel.set(m, list ? [...list, ep] : [ep]);
    }
    for (const fn of this.#added) fn(ep);
    for (const fn of this.#changed) fn();
    return ep;
  }

  /** Takes `ep` out of routing: no new request goes to it; it stays listed (and scraped) until delete(). */
  startDrain(ep: Endpoint): void {
    if (ep.state === 'draining' || this.#byId[ep.id] !== ep) return;
    ep.state = 'draining';
    ep.events?.draining(ep);
    if (this.#byName.get(ep.name) === ep) this.#byName.delete(ep.name);
    for (const m of ep.models) {
      const list = this.#byModel.get(m);
      if (list) this.#byModel.set(m, list.filter((e) => e !== ep));
    }
    for (const fn of this.#changed) fn();
  }

  /** Removes `ep` from the set (drained first if it was not); listeners drop its state (scrapes, prefix index, metrics). */
  delete(ep: Endpoint): void {
    if (this.#byId[ep.id] !== ep) return;
    this.startDrain(ep);
    this.#byId[ep.id] = undefined;
    const i = this.all.indexOf(ep);
    if (i >= 0) this.all.splice(i, 1);
    ep.state = 'draining';
    ep.removed = true;
    this.#pruneModels();
    this.#pruneAdapters();
    for (const fn of this.#removed) fn(ep);
    for (const fn of this.#changed) fn();
  }

  /** Replaces the pool definitions (a config reload); models no pool declares and no endpoint serves are forgotten. */
  setPools(pools: readonly PoolConfig[]): void {
    this.pools = pools;
    this.#declare(pools);
    this.#pruneAdapters();
    for (const pool of pools) for (const m of pool.models) if (!this.#byModel.has(m)) this.#byModel.set(m, []);
    this.#pruneModels();
    for (const fn of this.#changed) fn();
  }

  #pruneModels(): void {
    for (const [m, list] of this.#byModel) {
      if (list.length > 0) continue;
      if (this.pools.some((p) => p.models.includes(m))) continue;
      if (this.all.some((e) => e.models.includes(m))) continue;
      this.#byModel.delete(m);
    }
  }

  pool(name: string): PoolConfig | undefined {
    return this.pools.find((p) => p.name === name);
  }

  /** The active endpoint of that name. */
  byName(name: string): Endpoint | undefined {
    return this.#byName.get(name);
  }

  /** The active endpoint of that name, else a draining one. */
  find(name: string): Endpoint | undefined {
    return this.#byName.get(name) ?? this.all.find((e) => e.name === name);
  }

  /** A live endpoint by id. */
  byId(id: number): Endpoint | undefined {
    return this.#byId[id];
  }

  /** The name an id had (also after its endpoint left), '' for an id never given. */
  nameOf(id: number): string {
    return this.#names[id] ?? '';
  }

  /**
   * Active endpoints serving `model` (shared array: do not mutate; a change
   * replaces it, so a reader's array stays as it was), or undefined for an
   * unknown model. A model whose endpoints are all draining has an empty list.
   */
  forModel(model: string): readonly Endpoint[] | undefined {
    const eps = this.#byModel.get(model);
    if (eps !== undefined) return eps;
    // an adapter: the endpoints of its base model (the model filter keeps those that hold it or may load it)
    const base = this.#adapterBase.get(model);
    return base === undefined ? undefined : this.#byModel.get(base);
  }

  models(): string[] {
    return [...this.#byModel.keys()];
  }

  // ---- LoRA adapters ----------------------------------------------------------------

  #declare(pools: readonly PoolConfig[]): void {
    const d = new Map<string, [string, string]>();
    for (const p of pools) for (const a of p.adapters ?? []) d.set(a.name, [a.base ?? p.models[0]!, a.path ?? a.name]);
    this.#declared = d;
    for (const [name, [base]] of d) this.#adapterBase.set(name, base);
  }

  /** The base model of adapter `model` (undefined: not an adapter the router knows). */
  baseOf(model: string): string | undefined {
    return this.#adapterBase.get(model);
  }

  /** The `lora_path` a load of `adapter` sends: the declared path, else its name. */
  adapterPath(adapter: string): string {
    return this.#declared.get(adapter)?.[1] ?? adapter;
  }

  /** Adapters the router knows, with their base model (for /v1/models). */
  adapters(): [string, string][] {
    return [...this.#adapterBase];
  }

  /**
   * What an endpoint's GET /v1/models lists: entries with a `parent` among
   * its pool's models are its adapters. Tells the change listeners when the
   * router's set of adapters changed.
   */
  learnAdapters(ep: Endpoint, listed: readonly { id: string; parent: string }[]): void {
    let changed = false;
    ep.adapters.clear();
    for (const a of listed) {
      if (!ep.models.includes(a.parent) || this.#byModel.has(a.id)) continue;
      ep.adapters.add(a.id);
      if (!this.#adapterBase.has(a.id)) {
        this.#adapterBase.set(a.id, a.parent);
        changed = true;
      }
    }
    if (this.#pruneAdapters() || changed) for (const fn of this.#changed) fn();
  }

  /** An adapter the router loaded on `ep` (its next /v1/models read will list it). */
  adapterLoaded(ep: Endpoint, adapter: string): void {
    ep.adapters.add(adapter);
  }

  /** Forgets adapters no endpoint lists and no pool declares; true if any went. */
  #pruneAdapters(): boolean {
    let gone = false;
    for (const name of this.#adapterBase.keys()) {
      if (this.#declared.has(name) || this.all.some((e) => e.adapters.has(name))) continue;
      this.#adapterBase.delete(name);
      gone = true;
    }
    return gone;
  }
}
