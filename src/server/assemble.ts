// The router's assembly: one place that builds every component from the
// validated config (the admission gate, tracing, endpoints and data layer,
// sessions, precise mode, the scheduler, the upstream client, P/D, the
// director, the Responses service, endpoint discovery, the hot-standby lease,
// the batch API and processor), starts those that start before the router
// listens, registers each one's close in the lifecycle, and hands the parts to
// RouterCore (which keeps routes, listen and the drain). startRouter
// (router.ts) calls it; nothing else builds these.
import { ModelRewriter } from '../director/model-rewrites.js';
import { AdapterStats } from '../endpoints/adapter-stats.js';
import type { Logger } from 'pino';
import type { RouterConfig } from '../config/schema.js';
import { PassThroughGate, type AdmissionGate } from '../admission.js';
import { Director } from '../director/director.js';
import { Disaggregator } from '../director/pd.js';
import { SessionTable } from '../sessions/table.js';
import { RedisSessions } from '../sessions/redis.js';
import { registerSessionMetrics } from '../sessions/metrics.js';
import { DataLayer } from '../endpoints/data-layer.js';
import { EndpointSet } from '../endpoints/endpoint.js';
import { LiveEndpoints } from '../endpoints/live.js';
import type { UpstreamClient } from '../proxy/upstream.js';
import { Scheduler } from '../scheduler/scheduler.js';
import { ResponsesService } from '../responses/service.js';
import type { RequestTracer } from '../telemetry/tracing.js';
import { VERSION } from '../version.js';
import { RouterMetrics } from './metrics.js';
import { buildPrecise, type Precise } from './precise.js';
import { newUpstreamClient } from './upstream-choice.js';
import { StateLog } from './state-log.js';
import { flowGateFactory } from './flow-gate.js';
import { loadAuth } from '../auth/keys.js';
import type { ApiKeyAuthenticator } from '../auth/authenticator.js';
import type { RateLimiter } from '../limits/limiter.js';
import { CloseRank, type Lifecycle } from './lifecycle.js';
import { redactUrl } from '../config/defaults.js';
// loaded only when configured: a feature that is off costs no import (ioredis, grpc-js)
import type { HighAvailability } from '../ha/standby.js';
import type { FleetShare } from '../ha/fleet.js';
import type { FleetFlows } from '../flow/fleet-flows.js';
import type { KubernetesDiscovery } from '../k8s/discovery.js';
import type { BatchApi } from '../batch/api.js';
import type { BatchProcessor } from '../batch/processor.js';
import type { BatchQuotas } from '../batch/quota.js';
import type { Registry } from 'prom-client';

export interface AssembleOptions {
  config: RouterConfig;
  logger: Logger;
  /** Admission gate, or a factory given the endpoints. Default: flow control when config.flowControl is set, else admit everything. */
  gate?: AdmissionGate | ((endpoints: EndpointSet) => AdmissionGate);
  /** Upstream client. Default: by `proxy.client` (newUpstreamClient). */
  upstream?: UpstreamClient;
  /** Random source for pickers (tests may seed it). */
  random?: () => number;
  /** OpenTelemetry tracing; default: built when config.tracing.enabled, else off. */
  tracer?: RequestTracer | null;
  /** Wait for the first round of health checks and scrapes (default true). */
  waitForFirstScrape?: boolean;
  /** API-key authentication; default: built from config.auth (its key sources read now: src/auth/keys.ts), null without. */
  auth?: ApiKeyAuthenticator | null;
}

/** The components RouterCore serves with, built by assembleRouter. */
export interface RouterParts {
  readonly config: RouterConfig;
  readonly log: Logger;
  readonly endpoints: EndpointSet;
  /** Metrics scraping and health checks of every endpoint. */
  readonly dataLayer: DataLayer;
  /** Runtime endpoint changes (reload, admin API, other endpoint sources). */
  readonly live: LiveEndpoints;
  /** Session pins and turn records (the scheduler's session-affinity filter, the director's turn tracker). */
  readonly sessions: SessionTable;
  /** Precise prefix matching (KV-event feed, token source); null when no pool is precise. */
  readonly precise: Precise | null;
  readonly scheduler: Scheduler;
  readonly upstream: UpstreamClient;
  readonly gate: AdmissionGate;
  /** P/D disaggregation (config.disaggregation), or null. */
  readonly pd: Disaggregator | null;
  readonly metrics: RouterMetrics;
  readonly director: Director;
  /** The Responses API (null when `responses.enabled` is false). */
  readonly responses: ResponsesService | null;
  /** The Files and Batches API, started (null without `config.batch`; docs/batch.md). */
  readonly batchApi: BatchApi | null;
  /** A hot-standby pair's lease (src/ha/): /readyz answers 503 while this router is the standby. Null: no pair. */
  readonly leadership: { readonly leading: boolean } | null;
  /** API-key authentication (config.auth), or null; a reload replaces RouterCore.auth. */
  readonly auth: ApiKeyAuthenticator | null;
  /** Rate limits (config.rateLimits; src/limits/), or null; the gate above charges them, a reload reconfigures them. */
  readonly limiter: RateLimiter | null;
}

/** Everything assembleRouter built: the core's parts and the services that run beside the core. */
export interface Assembly {
  readonly parts: RouterParts;
  /** The hot-standby pair's coordinator (config.ha with mode standby), or null. */
  readonly ha: HighAvailability | null;
  /** Active-active sharing (config.ha with mode active-active), or null. */
  readonly fleet: FleetShare | null;
  /** Endpoint sources of pools with `discovery`, in pool order. */
  readonly discovery: readonly KubernetesDiscovery[];
  /** The async processor, when `config.batch` is set. */
  readonly batch: BatchProcessor | null;
}

/**
 * Builds the router's components and starts what runs before it listens, in
 * this order: the Responses store opened, the data layer's first round (unless
 * `waitForFirstScrape: false`), the shared session store, endpoint discovery,
 * the hot-standby lease, the batch processor and API. Each started service's
 * close is registered in `lifecycle` as it starts (the components themselves
 * under `parts`, closed after the listeners); on a failure the caller closes
 * the lifecycle, which closes what started.
 */
export async function assembleRouter(o: AssembleOptions, lifecycle: Lifecycle): Promise<Assembly> {
  const config = o.config;
  const log = o.logger;
  const inner = o.gate ?? (await flowGateFactory(config));
  // rate limits (config.rateLimits, and the auth keys' own limits, which a reload may add): a gate
  // around the router's own, charged before it (src/limits/)
  const limits = config.rateLimits !== undefined || config.auth !== undefined ? await buildLimits(config, log, lifecycle) : null;
  const gate: AssembleOptions['gate'] =
    limits === null
      ? inner
      : (set: EndpointSet) => limits.wrap(inner === undefined ? new PassThroughGate() : typeof inner === 'function' ? inner(set) : inner);
  // API keys (config.auth): the keys file and variable are read now, and again on every reload
  const auth = o.auth !== undefined ? o.auth : await loadAuth(config);
  // OpenTelemetry is loaded only when tracing is on
  const tracer = o.tracer ?? (config.tracing.enabled ? await (await import('../telemetry/tracing.js')).createTracer(config.tracing, VERSION, log) : null);
  // a collector that cannot be reached is one line; the router starts without waiting for it
  if (o.tracer === undefined && tracer !== null) void tracer.checkCollector();
  const parts = buildParts(config, log, gate, o.upstream, o.random, tracer);
  lifecycle.add('parts', CloseRank.parts, () => closeParts(parts));
  await parts.responses?.open(); // a sqlite file that cannot be opened stops the start
  const ready = parts.dataLayer.start();
  if (o.waitForFirstScrape !== false) await ready;
  // a shared session store (Redis): connected before the first request when it can be (bounded; without it, requests use the local view)
  await parts.sessions.shared?.ready();

  // pools with discovery: their pods become endpoints through parts.live (loaded only when configured)
  const discovery: KubernetesDiscovery[] = [];
  const discovered = config.pools.filter((p) => p.discovery !== undefined);
  if (discovered.length > 0) {
    const { KubernetesDiscovery, registerDiscoveryMetrics } = await import('../k8s/discovery.js');
    for (const pool of discovered) discovery.push(new KubernetesDiscovery(pool, log, config.pools.indexOf(pool)));
    registerDiscoveryMetrics(parts.metrics.registry, discovery);
    lifecycle.add('discovery', CloseRank.discovery, () => Promise.all(discovery.map((d) => d.close())).then(() => undefined));
    await Promise.all(discovery.map((d) => d.start(parts.live)));
  }

  let ha: HighAvailability | null = null;
  let fleet: FleetShare | null = null;
  if (config.ha?.mode === 'active-active') {
    // every replica serves (no lease: /readyz as without ha); prefix records and load shared through Redis
    const { FleetShare } = await import('../ha/fleet.js');
    // flow control's shares across the replicas (ha.shareFlows): only when a gate has flows to share
    let flows: FleetFlows | null = null;
    if (config.ha.shareFlows && parts.gate.attachFleet !== undefined) {
      const { FleetFlows } = await import('../flow/fleet-flows.js');
      const f = new FleetFlows(config.ha.flowHoldMs);
      if (parts.gate.attachFleet(f)) flows = f;
    }
    const started = await FleetShare.start(config.ha, { endpoints: parts.endpoints, scrapes: parts.dataLayer, store: parts.scheduler.prefix?.store ?? null, log, flows });
    lifecycle.add('share', CloseRank.share, () => started.close());
    started.registerMetrics(parts.metrics.registry);
    fleet = started;
  } else if (config.ha) {
    const { HighAvailability } = await import('../ha/standby.js');
    const started = await HighAvailability.start(config.ha, { endpoints: parts.endpoints, store: parts.scheduler.prefix?.store ?? null, log });
    lifecycle.add('lease', CloseRank.lease, () => started.close());
    started.registerMetrics(parts.metrics.registry);
    ha = started;
  }

  // the async processor and the Files and Batches API (docs/batch.md): loaded only when configured
  let batch: BatchProcessor | null = null;
  let batchApi: BatchApi | null = null;
  if (config.batch !== undefined) {
    const { BatchProcessor } = await import('../batch/processor.js');
    const quotas = await buildBatchQuotas(config, limits?.limiter ?? null, parts.metrics.registry, log, lifecycle);
    const processor = new BatchProcessor({ config: config.batch, director: parts.director, endpoints: parts.endpoints, log, band: config.batch.band ?? config.flowControl?.bands.at(-1), responses: parts.responses, quotas });
    batch = processor;
    const { BatchApi } = await import('../batch/api.js');
    const api = new BatchApi({ config: config.batch, log });
    lifecycle.add('batchApi', CloseRank.batchApi, () => api.close());
    lifecycle.add('batch', CloseRank.batch, (graceMs) => processor.close(graceMs));
    try {
      await processor.start();
      await api.start();
    } catch (err) {
      // one message naming the block and the address (ioredis says only "Connection is closed.")
      throw new Error(`batch: cannot use the Redis at ${redactUrl(config.batch.redis)} (batch.redis): ${(err as Error).message}`);
    }
    batchApi = api;
  }
  return { parts: { ...parts, batchApi, leadership: ha, auth, limiter: limits?.limiter ?? null }, ha, fleet, discovery, batch };
}

/** The parts built before anything starts (the batch API and the lease come later). */
type BuiltParts = Omit<RouterParts, 'batchApi' | 'leadership' | 'auth' | 'limiter'>;

/**
 * The rate limiter of config.rateLimits and its gate wrapper: counters in
 * this process, or shared in Redis (its client connected now, closed with
 * the parts). Loaded only when configured.
 */
async function buildLimits(config: RouterConfig, log: Logger, lifecycle: Lifecycle): Promise<{ limiter: RateLimiter; wrap: (g: AdmissionGate) => AdmissionGate }> {
  const rl = config.rateLimits ?? { tenants: {} };
  const { RateLimiter } = await import('../limits/limiter.js');
  const { RateLimitGate } = await import('../limits/gate.js');
  let shared = null;
  if (rl.redis !== undefined) {
    const { RedisCounters } = await import('../limits/redis-counters.js');
    const counters = new RedisCounters(rl.redis, log);
    lifecycle.add('rateLimits', CloseRank.parts, () => counters.close());
    await counters.ready();
    shared = counters;
  }
  const limiter = new RateLimiter(rl, { shared });
  return { limiter, wrap: (g) => new RateLimitGate(g, limiter) };
}

/**
 * The tenants' batch quotas (batch.quotas) on shared rate-limit counters:
 * those of `rateLimits.redis` when the router has them (one store and one
 * fail mode for every limit), else counters on the batch Redis itself
 * (`<batch.keyPrefix>:rl:`; fail closed: the line waits, as it would for any
 * batch Redis failure), so the routers of one consumer group share each
 * tenant's quota. Null when no tenant has a quota.
 */
async function buildBatchQuotas(config: RouterConfig, interactive: RateLimiter | null, registry: Registry, log: Logger, lifecycle: Lifecycle): Promise<BatchQuotas | null> {
  const b = config.batch!;
  const { BatchQuotas } = await import('../batch/quota.js');
  if (!BatchQuotas.configured(b.quotas)) return null;
  const { RateLimiter } = await import('../limits/limiter.js');
  const { countLimits } = await import('../limits/gate.js');
  const rl = config.rateLimits;
  let shared = interactive?.shared ?? null;
  let failClosed = rl?.redis?.failMode === 'closed';
  let own = false;
  if (shared === null) {
    const { RedisCounters } = await import('../limits/redis-counters.js');
    const counters = new RedisCounters({ url: b.redis, keyPrefix: `${b.keyPrefix}:rl:`, timeoutMs: b.commandTimeoutMs, failMode: 'closed' }, log);
    lifecycle.add('batchQuotas', CloseRank.parts, () => counters.close());
    await counters.ready();
    shared = counters;
    failClosed = true;
    own = true;
  }
  const limiter = new RateLimiter({ tenants: {}, maxSubjects: rl?.maxSubjects }, { shared, failClosed });
  const quotas = new BatchQuotas(b.quotas, limiter);
  const counters = shared;
  countLimits(registry, { refusals: (inc) => inc('batch-quota', quotas.refused), storeErrors: () => (own ? counters.errors : 0) });
  return quotas;
}

/** The components themselves (no I/O beyond the session table's sweep timer): what the RouterCore constructor built before. */
function buildParts(
  cfg: RouterConfig,
  log: Logger,
  g: AssembleOptions['gate'],
  upstreamOpt: UpstreamClient | undefined,
  random: (() => number) | undefined,
  tracer: RequestTracer | null,
): BuiltParts {
  const set = new EndpointSet(cfg.pools, cfg.dataLayer);
  set.adapterStats = new AdapterStats(cfg.metrics.maxLabelValues);
  // endpoint state changes, KV-event streams and upstream failures: one log line each (docs/observability.md, "Logs")
  const stateLog = new StateLog(log, set);
  const sessions = new SessionTable(set, cfg.sessions);
  if (cfg.sessions.store !== 'memory') sessions.shared = new RedisSessions(cfg.sessions.store, cfg.sessions.ttlMs, log);
  sessions.start();
  const precise = buildPrecise(cfg, set);
  const scheduler = new Scheduler(set, cfg.scheduling, { random, sessions, precise: precise?.feed, decodeProfile: cfg.disaggregation?.decode });
  if (precise !== null) {
    precise.feed.onConnection = (name, endpoint, connected) => stateLog.kvStream(name, endpoint, connected);
    precise.feed.onUnreachable = (name, endpoint, where, reason) => stateLog.kvStreamUnreachable(name, endpoint, where, reason);
    // an engine that may have lost its cache is not believed to hold anything by the approximate fallback either
    precise.feed.onEngineReset = (id) => {
      const ep = set.byId(id);
      if (ep !== undefined) scheduler.prefix?.clear(ep);
    };
  }
  const upstream = upstreamOpt ?? newUpstreamClient(cfg.proxy, set);
  const gate: AdmissionGate = g === undefined ? new PassThroughGate() : typeof g === 'function' ? g(set) : g;
  const dl = new DataLayer(set);
  dl.onCapacity((ep) => scheduler.onCapacity(ep));
  let pd: Disaggregator | null = null;
  const pdc = cfg.disaggregation;
  if (pdc !== undefined) {
    // the prefill profile: its own filters, scorers and picker (and its own prefix index) over the same endpoints
    const prefill = new Scheduler(set, { ...pdc.prefill, prefixBlockSize: cfg.scheduling.prefixBlockSize }, { random });
    dl.onCapacity((ep) => prefill.onCapacity(ep));
    pd = new Disaggregator(pdc, set, prefill, upstream, scheduler.prefix?.blockSize ?? 0, scheduler.prefix);
  }
  if (gate.onCapacity) {
    dl.onScrape((ep) => {
      for (const m of ep.models) gate.onCapacity!(m);
    });
  }
  const metrics = new RouterMetrics(set);
  stateLog.countUpstream = (id, kind) => metrics.countUpstreamError(id, kind);
  pd?.metrics.register(metrics.registry);
  const live = new LiveEndpoints(set, { graceMs: cfg.admin?.drainGraceMs });
  metrics.live = live.counters;
  // a removed endpoint's connections close (busy ones once their request ends): no descriptor stays open to it
  set.onRemoved((ep) => upstream.forget?.(ep));
  // the gate's families (flow control) join the router's registry
  gate.registerMetrics?.(metrics.registry);
  registerSessionMetrics(metrics.registry, sessions);
  precise?.registerMetrics(metrics.registry, () => scheduler.prefix);
  scheduler.registerMetrics(metrics.registry);
  const director = new Director({
    scheduler,
    upstream,
    gate,
    metrics,
    log,
    maxRetries: cfg.proxy.maxRetries,
    maxJsonDepth: cfg.limits.maxJsonDepth,
    parseOffloadBytes: cfg.limits.parseOffloadBytes,
    bodyScan: cfg.limits.bodyScan,
    parseWorkers: cfg.limits.parseWorkers,
    sessions,
    tracer,
    tokens: precise?.tokens ?? null,
    pd,
    scanUsage: cfg.logging.access, // the access log's `tokens`
    rewrites: new ModelRewriter(cfg.modelRewrites ?? []),
    adapterQueue: cfg.adapterQueue,
  });
  // an engine's lora_requests_info may show a slot free: requests held for one look again
  dl.onScrape(() => director.adapterHold.wake());
  metrics.registerAdapterHold(director.adapterHold);
  metrics.registerRewrites(director.rewrites);
  if (tracer) metrics.registerTracing(tracer.stats);
  const responses = cfg.responses.enabled
    ? new ResponsesService({ config: cfg.responses, director, log, countRequest: (m, e, s) => metrics.countRequest(m, e, s), registry: metrics.registry })
    : null;
  return { config: cfg, log, endpoints: set, dataLayer: dl, live, sessions, precise, scheduler, upstream, gate, pd, metrics, director, responses };
}

/** Closes the components, after the listeners have drained (the tail of the old RouterCore.close). */
async function closeParts(p: BuiltParts): Promise<void> {
  p.live.close();
  await p.gate.close?.();
  await p.director.close();
  await p.responses?.close();
  await p.scheduler.close();
  await p.sessions.close();
  await p.precise?.close();
  await p.pd?.prefill.close();
  await p.dataLayer.close();
  await p.upstream.close();
  await p.director.tracer?.close(); // the last spans go out (bounded by the export timeout)
}
