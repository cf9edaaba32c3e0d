// Background loops that keep endpoint state fresh: /metrics scraping (every
// 50 ms by default) and /health checks. Never on the request path. A failed
// or slow scrape only leaves the metrics to go stale; scorers then fall back
// to the router's own in-flight counts.
import { performance } from 'node:perf_hooks';
import { Client } from 'undici';
import type { Endpoint, EndpointSet, Health } from './endpoint.js';
import { readEngineMetrics } from './engine-metrics.js';

export type CapacityListener = (ep: Endpoint) => void;

/** Why a health check failed, for the log: the error's code and message (DNS, refused, timeout), its cause's when wrapped. */
export function checkFailure(err: unknown): string {
  const e = err as { code?: string; message?: string; cause?: { code?: string; message?: string } };
  const inner = e?.cause?.code !== undefined ? e.cause : e;
  const code = inner?.code ?? (e as Error)?.name;
  const msg = inner?.message ?? String(err);
  return code !== undefined && !msg.includes(code) ? `${code}: ${msg}` : msg;
}

/** Largest /metrics body read; a bigger one fails the scrape (real engines send well under 1 MiB). */
export const MAX_METRICS_BYTES = 16 * 1024 * 1024;
/** Largest GET /v1/models body read (an engine with many LoRA adapters lists each). */
const MAX_MODELS_BYTES = 1024 * 1024;

export class DataLayer {
  readonly #set: EndpointSet;
  /** Separate connections for /metrics and /health: a slow scrape must not hold up a health check. */
  readonly #scrapeClients: (Client | undefined)[] = [];
  readonly #healthClients: (Client | undefined)[] = [];
  readonly #scraping: boolean[] = [];
  readonly #checking: boolean[] = [];
  #scrapeTimer: NodeJS.Timeout | undefined;
  #healthTimer: NodeJS.Timeout | undefined;
  #capacityListeners: CapacityListener[] = [];
  #scrapeListeners: CapacityListener[] = [];
  #started = false;
  #closed = false;
  #warned = false;

  constructor(set: EndpointSet) {
    this.#set = set;
    for (const ep of set.all) this.#open(ep);
    // endpoints added at runtime are checked and scraped at once; removed ones lose their connections
    set.onAdded((ep) => {
      if (this.#closed) return;
      this.#open(ep);
      if (!this.#started) return;
      const cfg = set.dataLayer;
      if (cfg.healthIntervalMs > 0) void this.#check(ep);
      if (cfg.scrapeIntervalMs > 0) void this.#scrape(ep);
    });
    set.onRemoved((ep) => this.#shut(ep));
  }

  #open(ep: Endpoint): void {
    const cfg = this.#set.dataLayer;
    const client = () =>
      new Client(ep.url, {
        pipelining: 1,
        keepAliveTimeout: 30_000,
        connectTimeout: cfg.healthTimeoutMs,
        headersTimeout: cfg.healthTimeoutMs,
        bodyTimeout: cfg.healthTimeoutMs,
      });
    this.#scrapeClients[ep.id] = client();
    this.#healthClients[ep.id] = client();
    this.#scraping[ep.id] = false;
    this.#checking[ep.id] = false;
  }

  #shut(ep: Endpoint): void {
    const a = this.#scrapeClients[ep.id];
    const b = this.#healthClients[ep.id];
    this.#scrapeClients[ep.id] = undefined;
    this.#healthClients[ep.id] = undefined;
    void a?.destroy().catch(() => {});
    void b?.destroy().catch(() => {});
  }

  /** Called when an endpoint's KV-cache geometry is first learnt or changes. */
  onCapacity(fn: CapacityListener): void {
    this.#capacityListeners.push(fn);
  }

  /** Called after every successful scrape of an endpoint. */
  onScrape(fn: CapacityListener): void {
    this.#scrapeListeners.push(fn);
  }

  /** Starts both loops; resolves after one round of health checks and scrapes. */
  async start(): Promise<void> {
    const cfg = this.#set.dataLayer;
    this.#started = true;
    const first: Promise<void>[] = [];
    for (const ep of this.#set.all) {
      if (cfg.healthIntervalMs > 0) first.push(this.#check(ep));
      if (cfg.scrapeIntervalMs > 0) first.push(this.#scrape(ep));
    }
    await Promise.all(first);
    if (this.#closed) return;
    if (cfg.scrapeIntervalMs > 0) {
      this.#scrapeTimer = setInterval(() => {
        for (const ep of this.#set.all) if (!this.#scraping[ep.id]) void this.#scrape(ep);
      }, cfg.scrapeIntervalMs);
      this.#scrapeTimer.unref();
    }
    if (cfg.healthIntervalMs > 0) {
      this.#healthTimer = setInterval(() => {
        for (const ep of this.#set.all) if (!this.#checking[ep.id]) void this.#check(ep);
      }, cfg.healthIntervalMs);
      this.#healthTimer.unref();
    }
  }

  async #scrape(ep: Endpoint): Promise<void> {
    const client = this.#scrapeClients[ep.id];
    if (client === undefined) return;
    this.#scraping[ep.id] = true;
    const dispatchedBefore = ep.dispatched;
    const sentAt = performance.now();
    // healthTimeoutMs bounds the whole scrape, not only the gaps between body chunks
    const signal = AbortSignal.timeout(this.#set.dataLayer.healthTimeoutMs);
    try {
      const res = await client.request({ path: '/metrics', method: 'GET', signal });
      if (res.statusCode !== 200) {
        await res.body.dump();
        return;
      }
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const chunk of res.body as AsyncIterable<Buffer>) {
        size += chunk.length;
        if (size > MAX_METRICS_BYTES) throw new RangeError('metrics body too large');
        chunks.push(chunk);
      }
      const text = Buffer.concat(chunks, size).toString('utf8');
      const prevBlocks = ep.metrics.cacheBlocks;
      const prevTokens = ep.metrics.cacheBlockTokens;
      if (readEngineMetrics(text, ep.metrics)) {
        ep.metricsAt = performance.now();
        ep.scrapeSentAt = sentAt;
        // requests sent after this scrape left are not in its figures
        ep.sinceScrape = ep.dispatched - dispatchedBefore;
        ep.onScrape();
      }
      if (ep.metrics.cacheBlocks !== prevBlocks || ep.metrics.cacheBlockTokens !== prevTokens) {
        for (const fn of this.#capacityListeners) this.#call(fn, ep);
      }
      for (const fn of this.#scrapeListeners) this.#call(fn, ep);
    } catch {
      // unreachable or slow: the metrics go stale and scorers fall back
    } finally {
      this.#scraping[ep.id] = false;
    }
  }

  /**
   * Runs one listener: a throwing one (a plugin's bug) must not skip the others,
   * or a capacity change would be lost for good (the next scrape sees the same
   * figures and calls no one). Reported once per data layer as a process warning.
   */
  #call(fn: CapacityListener, ep: Endpoint): void {
    try {
      fn(ep);
    } catch (err) {
      if (this.#warned) return;
      this.#warned = true;
      process.emitWarning(`a data-layer listener threw for endpoint ${ep.name}: ${(err as Error)?.message ?? String(err)} (further ones are not reported)`, { code: 'SWITCHYARD_LISTENER_ERROR' });
    }
  }

  async #check(ep: Endpoint): Promise<void> {
    const client = this.#healthClients[ep.id];
    if (client === undefined) return;
    this.#checking[ep.id] = true;
    try {
      const signal = AbortSignal.timeout(this.#set.dataLayer.healthTimeoutMs);
      const res = await client.request({ path: '/health', method: 'GET', signal });
      await res.body.dump();
      const was = ep.health;
      this.#health(ep, res.statusCode === 200 ? 'up' : 'down', `GET /health answered HTTP ${res.statusCode}`);
      // which models it serves: at its first good check, when it comes back (it may have restarted with another), and every modelCheckIntervalMs
      const every = this.#set.dataLayer.modelCheckIntervalMs ?? 30_000;
      if (ep.health === 'up' && every > 0 && (was !== 'up' || performance.now() - ep.modelsCheckedAt >= every)) await this.#checkModels(ep, client);
    } catch (err) {
      // a removed endpoint's connection was closed under the check: not a health verdict
      if (ep.removed) return;
      this.#health(ep, 'down', checkFailure(err));
    } finally {
      ep.healthAt = performance.now();
      this.#checking[ep.id] = false;
    }
  }

  /**
   * Reads GET /v1/models: the pool's models the engine does not list are
   * missing there. An engine without the route, or an answer that is not an
   * OpenAI model list, tells nothing (nothing is marked missing).
   */
  async #checkModels(ep: Endpoint, client: Client): Promise<void> {
    ep.modelsCheckedAt = performance.now();
    let served: string[] | null = null;
    let adapters: { id: string; parent: string }[] = [];
    try {
      const res = await client.request({ path: '/v1/models', method: 'GET', signal: AbortSignal.timeout(this.#set.dataLayer.healthTimeoutMs) });
      if (res.statusCode !== 200) {
        await res.body.dump();
        return;
      }
      let size = 0;
      const chunks: Buffer[] = [];
      for await (const chunk of res.body as AsyncIterable<Buffer>) {
        size += chunk.length;
        if (size > MAX_MODELS_BYTES) throw new RangeError('model list too large');
        chunks.push(chunk);
      }
      const j = JSON.parse(Buffer.concat(chunks, size).toString('utf8')) as { data?: unknown };
      if (!Array.isArray(j.data)) return;
      served = j.data.map((m) => (m as { id?: unknown })?.id).filter((id): id is string => typeof id === 'string');
      // LoRA adapters: listed with the base model as `parent` (vLLM)
      adapters = (j.data as { id?: unknown; parent?: unknown }[]).filter((m): m is { id: string; parent: string } => typeof m?.id === 'string' && typeof m.parent === 'string' && m.parent !== '');
    } catch {
      return; // unreachable meanwhile, or not a model list: the health check has its own verdict
    }
    if (ep.removed || this.#closed) return;
    this.#set.learnAdapters(ep, adapters);
    const missing = ep.models.filter((m) => !served.includes(m));
    const before = ep.missingModels ?? [];
    ep.missingModels = missing.length > 0 ? missing : null;
    if (missing.join('\0') !== before.join('\0')) ep.events?.models(ep, missing, served.slice(0, 32).map((m) => (m.length > 256 ? `${m.slice(0, 256)}…` : m))); // the engine's text, bounded for the log
  }

  #health(ep: Endpoint, to: Health, reason: string): void {
    const from = ep.health;
    ep.health = to;
    if (from !== to && !this.#closed) ep.events?.health(ep, from, to, reason);
  }

  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#scrapeTimer);
    clearInterval(this.#healthTimer);
    const clients = [...this.#scrapeClients, ...this.#healthClients].filter((c): c is Client => c !== undefined);
    await Promise.all(clients.map((c) => c.destroy().catch(() => {})));
  }
}
