// The scheduler: filters → prefix producer → weighted scorers → picker over
// an EndpointSet. Synchronous, allocation-free per pick (apart from what
// plugins choose to do), and free of HTTP: embed it in any proxy with
// createScheduler(). It does not own the data layer (metrics scraping, health
// checks): the router does, and tells the scheduler of capacity changes;
// createScheduler() attaches one for library users.
import { performance } from 'node:perf_hooks';
import { validateConfig, API_VERSION, type PluginSpec, type RouterConfig, type ScorerSpec, type SchedulingConfig } from '../config/schema.js';
import { DataLayer } from '../endpoints/data-layer.js';
import { EndpointSet, MAX_ENDPOINT_IDS, type Endpoint } from '../endpoints/endpoint.js';
import { NoEndpointError, UnknownModelError } from '../errors.js';
import { registry as defaultRegistry } from './plugins/index.js';
import type { PluginRegistry } from './registry.js';
import { PrefixProducer, type PreciseSource, type TierWeights } from './prefix-producer.js';
import { SessionTable } from '../sessions/table.js';
import type { CycleContext, Filter, LatencyNote, Picker, Plugin, SchedRequest, Scorer } from './types.js';
import type { Registry } from 'prom-client';

/**
 * The outcome of one pick. Pass it back to `complete()` once (complete() zeroes `seq`; a second call is ignored).
 * With latency plugins (`scheduler.latency`) it also carries the request's LatencyNote fields.
 */
export interface Decision extends Partial<LatencyNote> {
  endpoint: Endpoint;
  /** The endpoint's dispatch number for this request (from Endpoint.onDispatch; the breaker's half-open trial is named by it). */
  seq: number;
  /** Prompt blocks hashed by the prefix producer (0 when no plugin reads prefix matches). */
  promptBlocks: number;
  /** Of those, leading blocks the picked endpoint was believed to hold. */
  matchedBlocks: number;
  /**
   * Uncached prompt tokens this pick added to the endpoint's prefill backlog
   * (Endpoint.prefillPending) and has not released yet; 0 once released
   * (Scheduler.prefilled, or complete()). Set by pick().
   */
  prefillTokens?: number;
  /** Prefill tokens ahead of this request at its endpoint at the pick, its own included (the speed model's feature). */
  aheadTokens?: number;
  /** The LoRA adapter the request names, counted in its endpoint's adapterInFlight until complete() ('' or absent: none). */
  adapter?: string;
}

export type Outcome = 'ok' | 'failed' | 'aborted';

export interface SchedulerOptions {
  random?: () => number;
  registry?: PluginRegistry;
  /** Session pins shared with the director (the router's `sessions` config); default: a table with default settings. */
  sessions?: SessionTable;
  /** Precise prefix matching's event-fed index (src/server/precise.ts builds it from the config). */
  precise?: PreciseSource;
  /** What a matched block is worth by tier [GPU, host, disk] (default: scheduling.tierWeights). */
  tierWeights?: TierWeights;
  /**
   * P/D: the scorers and picker of picks whose candidates are in a pool with
   * prefill endpoints (the decode leg; config disaggregation.decode). The
   * filters stay the scheduling ones. Absent: one profile for every pick.
   */
  decodeProfile?: { scorers: readonly ScorerSpec[]; picker: PluginSpec };
}

/** One set of scorers with their weights and a picker. */
interface Scoring {
  readonly scorers: readonly Scorer[];
  readonly weights: Float64Array;
  readonly picker: Picker;
}

export class Scheduler {
  readonly endpoints: EndpointSet;
  /** Session pins and turn records (read by the `session-affinity` filter, fed by the director). */
  readonly sessions: SessionTable;
  readonly filters: readonly Filter[];
  readonly scorers: readonly Scorer[];
  readonly weights: Float64Array;
  readonly picker: Picker;
  readonly #plugins: Plugin[];
  /** Plugins with latency hooks (usesLatency). */
  readonly #lat: Plugin[];
  /** True when a plugin learns from request timing: the caller reports firstToken() and streamEnd(). */
  readonly latency: boolean;
  readonly #ctx: CycleContext;
  readonly #cands: Endpoint[] = [];
  /** The scheduling scorers and picker, and the decode profile's (null: none configured). */
  readonly #main: Scoring;
  readonly #decode: Scoring | null;
  /** Pools with an active prefill endpoint (the decode profile's pools), kept current with the set. */
  #pdPools = new Set<string>();
  /** Prefix matching once per request, when a plugin reads it (a prefix-cache scorer); null otherwise. */
  readonly prefix: PrefixProducer | null;
  #total: Float64Array;
  /** A data layer createScheduler() started for a library user (closed with the scheduler). */
  #dataLayer: DataLayer | undefined;
  /** Resolves after the attached data layer's first round of scrapes and health checks. */
  ready: Promise<void> = Promise.resolve();

  constructor(endpoints: EndpointSet, scheduling: SchedulingConfig, opts: SchedulerOptions = {}) {
    const reg = opts.registry ?? defaultRegistry;
    this.sessions = opts.sessions ?? new SessionTable(endpoints);
    const env = { endpoints, prefixBlockSize: scheduling.prefixBlockSize, random: opts.random ?? Math.random, sessions: this.sessions };
    this.endpoints = endpoints;
    this.filters = scheduling.filters.map((f) => reg.create('filter', f.type, f.params, env));
    this.scorers = scheduling.scorers.map((s) => reg.create('scorer', s.type, s.params, env));
    this.weights = Float64Array.from(scheduling.scorers.map((s) => s.weight));
    this.picker = reg.create('picker', scheduling.picker.type, scheduling.picker.params, env);
    this.#main = { scorers: this.scorers, weights: this.weights, picker: this.picker };
    const dp = opts.decodeProfile;
    this.#decode =
      dp === undefined
        ? null
        : {
            scorers: dp.scorers.map((s) => reg.create('scorer', s.type, s.params, env)),
            weights: Float64Array.from(dp.scorers.map((s) => s.weight)),
            picker: reg.create('picker', dp.picker.type, dp.picker.params, env),
          };
    this.#plugins = [...this.filters, ...this.scorers, this.picker];
    if (this.#decode !== null) this.#plugins.push(...this.#decode.scorers, this.#decode.picker);
    this.#lat = this.#plugins.filter((p) => p.usesLatency === true);
    this.latency = this.#lat.length > 0;
    this.#total = new Float64Array(Math.max(1, endpoints.all.length));
    this.prefix = null;
    if (this.#plugins.some((p) => p.usesPrefix)) {
      // one index for every reader: a plugin may ask for its own block size (they must agree: the config says so)
      const asked = this.#plugins.map((p) => p.blockSize).find((b) => b !== undefined);
      this.prefix = new PrefixProducer({
        blockSize: asked ?? scheduling.prefixBlockSize,
        capacityBlockSize: scheduling.prefixBlockSize,
        // ids are never reused: room for every endpoint the set may add at runtime
        maxEndpoints: MAX_ENDPOINT_IDS,
        precise: opts.precise,
        tierWeights: opts.tierWeights ?? (scheduling.tierWeights ? [scheduling.tierWeights.gpu, scheduling.tierWeights.cpu, scheduling.tierWeights.disk] : undefined),
      });
      for (const ep of endpoints.all) this.prefix.setCapacity(ep);
    }
    // live endpoints (reload, admin API, other sources): a new one gets its capacity, a removed one leaves the index
    endpoints.onAdded((ep) => {
      if (this.#total.length < endpoints.all.length) this.#total = new Float64Array(endpoints.all.length * 2);
      this.onCapacity(ep);
    });
    endpoints.onRemoved((ep) => {
      this.prefix?.clear(ep);
      for (const p of this.#plugins) p.onRemoved?.(ep);
    });
    if (this.#decode !== null) {
      const scan = (): void => {
        const pools = new Set<string>();
        for (const ep of endpoints.all) if (ep.role === 'prefill' && ep.state === 'active') pools.add(ep.pool);
        this.#pdPools = pools;
      };
      scan();
      endpoints.onChange(scan);
    }
    this.#ctx = {
      request: { model: '' },
      now: 0,
      promptBlocks: 0,
      prefixMatched: EMPTY_MATCH,
      matchedBlocks: 0,
    };
  }

  /** An endpoint's KV-cache geometry was learnt or changed (the data layer's capacity event). */
  onCapacity(ep: Endpoint): void {
    this.prefix?.setCapacity(ep);
    for (const p of this.#plugins) p.onCapacity?.(ep);
  }

  /**
   * Starts a data layer owned by this scheduler (library use without the
   * router: createScheduler() calls it unless `watch: false`); resolves after
   * the first round of scrapes and health checks.
   */
  watch(): Promise<void> {
    if (this.#dataLayer) return this.ready;
    const dl = (this.#dataLayer = new DataLayer(this.endpoints));
    dl.onCapacity((ep) => this.onCapacity(ep));
    this.ready = dl.start();
    return this.ready;
  }

  /** Registers a callback run after each successful metrics scrape of an endpoint (needs watch()). */
  onScrape(fn: (ep: Endpoint) => void): void {
    if (!this.#dataLayer) throw new Error('onScrape needs a data layer: createScheduler() with watch, or the router\'s own');
    this.#dataLayer.onScrape(fn);
  }

  /** Of the last successful pick (read by tracing right after it): candidates left by the filters, and the winner's weighted score. */
  lastCandidates = 0;
  lastScore = 0;
  /** The last pick's candidates (a reference, not a copy): fallbacks() reads them right after the pick. */
  #lastEps: readonly Endpoint[] = [];

  /**
   * Right after a pick (same tick): up to `max` other candidates of it, best
   * weighted score first, into `out` (cleared first). A proxy that dispatches
   * itself (ext_proc) retries down this list; these are not counted in flight.
   */
  fallbacks(primary: Endpoint, max: number, out: Endpoint[]): Endpoint[] {
    out.length = 0;
    const eps = this.#lastEps;
    const n = eps.length;
    if (max <= 0 || n <= 1) return out;
    const total = this.#total;
    const scored = this.scorers.length > 0;
    for (let k = 0; k < max; k++) {
      let best = -1;
      for (let i = 0; i < n; i++) {
        const ep = eps[i];
        if (ep === primary || ep.state !== 'active' || out.includes(ep)) continue;
        if (best < 0 || (scored && total[i] > total[best])) best = i;
      }
      if (best < 0) break;
      out.push(eps[best]);
    }
    return out;
  }

  /** True if some pool serves `model`. */
  hasModel(model: string): boolean {
    return this.endpoints.forModel(model) !== undefined;
  }

  /**
   * Picks an endpoint for `req`, or returns null when none can serve it
   * (unknown model, or every candidate filtered out). The pick counts as
   * dispatched: call `complete()` once when the request ends. `exclude` lists
   * endpoints already tried (retries); `out` lets a caller reuse a Decision;
   * `now` (performance.now()) spares the scheduler a clock read when the
   * caller already has one.
   */
  pick(req: SchedRequest, exclude?: readonly Endpoint[] | null, out?: Decision, now?: number): Decision | null {
    const base = this.endpoints.forModel(req.model);
    if (base === undefined) return null;
    let eps: readonly Endpoint[] = base;
    const pair = req.pair;
    const role = req.role;
    if ((exclude && exclude.length > 0) || (pair !== undefined && pair !== null) || (role !== undefined && role !== null)) {
      const c = this.#cands;
      c.length = 0;
      for (let i = 0; i < base.length; i++) {
        const ep = base[i];
        if (exclude && exclude.includes(ep)) continue;
        if (pair && (ep.pool !== pair.pool || ep.revision !== pair.revision)) continue;
        if (role && ep.role !== role) continue;
        c.push(ep);
      }
      eps = c;
    }
    const ctx = this.#ctx;
    ctx.request = req;
    ctx.now = now ?? performance.now();
    ctx.promptBlocks = 0;
    ctx.prefixMatched = EMPTY_MATCH;
    ctx.matchedBlocks = 0;
    for (let f = 0; f < this.filters.length && eps.length > 0; f++) eps = this.filters[f].filter(ctx, eps);
    const n = eps.length;
    if (n === 0) return null;
    const prefix = this.prefix;
    if (prefix !== null) prefix.produce(ctx, eps);
    let idx = 0;
    const sc = this.#decode !== null && this.#pdPools.has(eps[0].pool) ? this.#decode : this.#main;
    const scorers = sc.scorers;
    if (n > 1 || scorers.length > 0) {
      const total = this.#total;
      for (let i = 0; i < n; i++) total[i] = 0;
      for (let s = 0; s < scorers.length; s++) {
        const w = sc.weights[s];
        const v = scorers[s].score(ctx, eps);
        if (w === 0) continue;
        for (let i = 0; i < n; i++) {
          const x = v[i];
          total[i] += w * (x > 1 ? 1 : x > 0 ? x : 0);
        }
      }
      idx = n > 1 ? sc.picker.pick(ctx, eps, total) : 0;
    }
    const ep = eps[idx];
    this.#lastEps = eps;
    this.lastCandidates = n;
    this.lastScore = n > 1 || scorers.length > 0 ? this.#total[idx] : 0;
    if (prefix !== null) prefix.record(ctx, ep, idx);
    for (let p = 0; p < this.#plugins.length; p++) this.#plugins[p].onPicked?.(ctx, ep, idx);
    const d: Decision = out ?? { endpoint: ep, seq: 0, promptBlocks: 0, matchedBlocks: 0, prefillTokens: 0, adapter: '' };
    // a LoRA adapter: counted per adapter (a miss when the endpoint did not have it active), in flight there until complete()
    if (this.endpoints.baseOf(req.model) !== undefined && !ep.models.includes(req.model)) {
      this.endpoints.adapterStats.picked(req.model, ep.adapters.has(req.model) && ep.adapterState(req.model) === 2);
      ep.adapterSent(req.model);
      d.adapter = req.model;
    } else d.adapter = '';
    if (this.latency) this.#decide(ctx, ep, idx, d as Decision & LatencyNote);
    d.seq = ep.onDispatch(ctx.now);
    // the prefill backlog: what this request makes the engine compute before its first token
    const t = this.#uncachedTokens(req, ctx);
    d.prefillTokens = t;
    if (t > 0) {
      ep.prefillPending += t;
      ep.prefillRequests++;
    }
    d.aheadTokens = ep.prefillPending + ep.peerPrefillPending;
    if (t > 0) ep.speed.sent(t);
    ctx.request = EMPTY_REQUEST;
    ctx.prefixMatched = EMPTY_MATCH;
    d.endpoint = ep;
    d.promptBlocks = ctx.promptBlocks;
    d.matchedBlocks = ctx.matchedBlocks;
    return d;
  }

  /**
   * Prompt tokens the picked endpoint must compute: the prompt (its tokens in
   * precise mode, else its bytes / 4, the conversion the prefix index uses)
   * less the leading blocks the prefix producer matched there. Without prefix
   * matching, the whole prompt.
   */
  #uncachedTokens(req: SchedRequest, ctx: CycleContext): number {
    const tokens = req.tokens;
    const total = tokens !== undefined ? tokens.length >>> 2 : req.prompt !== undefined ? req.prompt.length / BYTES_PER_TOKEN : 0;
    const p = this.prefix;
    if (p === null || ctx.matchedBlocks === 0) return total;
    const cached = ctx.matchedBlocks * p.tokensPerBlock;
    return cached >= total ? 0 : total - cached;
  }

  /**
   * The picked request no longer waits for its prefill (its first body byte
   * arrived, or its prefill ran elsewhere: a P/D prefill leg): releases what
   * it added to its endpoint's prefill backlog. Returns the tokens released
   * (0 when nothing was left). complete() releases it too, on every path.
   * `ttftMs` ≥ 0: the release is the first byte of a 200 answer that marks the
   * end of the prefill, that long after dispatch: the endpoint's speed model
   * learns from it (Endpoint.speed).
   */
  prefilled(d: Decision, ttftMs = -1): number {
    const t = d.prefillTokens;
    if (t === undefined || t === 0 || d.seq === 0) return 0;
    d.prefillTokens = 0;
    const ep = d.endpoint;
    if (ttftMs >= 0) ep.speed.observe(d.aheadTokens ?? t, ttftMs);
    ep.prefillPending -= t;
    if (ep.prefillRequests > 0) ep.prefillRequests--;
    if (ep.prefillPending < 0.5 || ep.prefillRequests === 0) ep.prefillPending = 0;
    return t;
  }

  #decide(ctx: CycleContext, ep: Endpoint, idx: number, note: LatencyNote): void {
    note.latPending = 0;
    note.latWork = 0;
    note.latOwn = 0;
    note.latRunning = 0;
    note.latPredTtftMs = 0;
    note.latPredTpotMs = 0;
    note.latSloTtftMs = 0;
    note.latSloTpotMs = 0;
    note.latBand = -1;
    for (let p = 0; p < this.#lat.length; p++) this.#lat[p].onDecision?.(ctx, ep, idx, note);
  }

  /** A streamed answer's first token arrived `ms` after dispatch (call only when `latency`). */
  firstToken(d: Decision, ms: number): void {
    if (d.seq === 0) return;
    for (let p = 0; p < this.#lat.length; p++) this.#lat[p].onFirstToken?.(d.endpoint, d as Decision & LatencyNote, ms);
  }

  /** The stream ended: `tokens` after the first one took `decodeMs` (call only when `latency`, before complete()). */
  streamEnd(d: Decision, tokens: number, decodeMs: number): void {
    if (d.seq === 0) return;
    for (let p = 0; p < this.#lat.length; p++) this.#lat[p].onStreamEnd?.(d.endpoint, d as Decision & LatencyNote, tokens, decodeMs);
  }

  /** A non-streamed answer of `tokens` output tokens took `totalMs` (call only when `latency`, before complete()). */
  wholeAnswer(d: Decision, totalMs: number, tokens: number): void {
    if (d.seq === 0) return;
    for (let p = 0; p < this.#lat.length; p++) this.#lat[p].onAnswer?.(d.endpoint, d as Decision & LatencyNote, totalMs, tokens);
  }

  /** Registers the plugins' metric families in a router's registry. */
  registerMetrics(registry: Registry): void {
    for (const p of this.#plugins) p.registerMetrics?.(registry);
  }

  /** Like pick(), but throws UnknownModelError or NoEndpointError instead of returning null. */
  pickOrThrow(req: SchedRequest, exclude?: readonly Endpoint[] | null): Decision {
    const d = this.pick(req, exclude);
    if (d !== null) return d;
    if (!this.hasModel(req.model)) throw new UnknownModelError(`no pool serves model "${req.model}"`);
    throw new NoEndpointError(`no ready endpoint for model "${req.model}"`);
  }

  /**
   * Reports the end of a picked request: `ok` (the engine answered, any
   * status below 500), `failed` (connect error, reset, 5xx: feeds the circuit
   * breaker) or `aborted` (the client went away: only releases accounting).
   * With a failure, pass the request again (`req`, same model and prompt as
   * the pick) so the prefix producer can forget the blocks this pick
   * recorded: the engine never computed them.
   */
  complete(d: Decision, outcome: Outcome, req?: SchedRequest): void {
    // a second complete() would release another request's in-flight slot and count its outcome twice
    if (d.seq === 0) return;
    this.prefilled(d);
    const seq = d.seq;
    d.seq = 0;
    const ep = d.endpoint;
    const failed = outcome === 'failed';
    if (outcome === 'aborted') ep.onRelease(seq);
    else ep.onOutcome(failed ? performance.now() : 0, failed, this.endpoints.dataLayer, seq); // the clock matters only to the breaker
    if (failed && req !== undefined && this.prefix !== null) this.prefix.forget(ep, d, req);
    if (d.adapter !== undefined && d.adapter !== '') {
      ep.adapterDone(d.adapter);
      d.adapter = '';
    }
    for (let p = 0; p < this.#lat.length; p++) this.#lat[p].onEnd?.(ep, d as Decision & LatencyNote);
    for (let p = 0; p < this.#plugins.length; p++) this.#plugins[p].onComplete?.(ep, failed, d, failed ? req : undefined);
  }

  async close(): Promise<void> {
    for (const p of this.#plugins) p.close?.();
    await this.#dataLayer?.close();
  }
}

const EMPTY_REQUEST: SchedRequest = { model: '' };
/** Bytes of prompt text per token: the prefix index's conversion (docs/config.md). */
const BYTES_PER_TOKEN = 4;
const EMPTY_MATCH = new Uint32Array(0);

/** Input for createScheduler: the `pools`, `scheduling` and `dataLayer` parts of a Router config. */
export interface SchedulerConfig {
  pools: unknown;
  scheduling?: unknown;
  dataLayer?: unknown;
}

/**
 * Builds a scheduler from plain config (validated like a config file; throws
 * ConfigError listing every problem). Unless `watch: false`, it starts its own
 * data layer scraping the endpoints' /metrics and /health in the background;
 * `scheduler.ready` resolves after the first round.
 */
export function createScheduler(config: SchedulerConfig | RouterConfig, opts: SchedulerOptions & { watch?: boolean } = {}): Scheduler {
  const reg = opts.registry ?? defaultRegistry;
  const cfg = validateConfig(
    { apiVersion: API_VERSION, kind: 'Router', pools: config.pools, scheduling: config.scheduling, dataLayer: config.dataLayer },
    (kind, spec) => reg.validate(kind, spec.type, spec.params),
    'createScheduler',
  );
  const s = new Scheduler(new EndpointSet(cfg.pools, cfg.dataLayer), cfg.scheduling, opts);
  if (opts.watch !== false) void s.watch();
  return s;
}
