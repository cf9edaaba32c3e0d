// The router's server side: it serves with the router's parts (endpoints,
// data layer, scheduler, upstream client, gate, director, ...), which
// assemble.ts builds and hands it, and owns the answers that are not
// inference (readiness, models), the 408 sweep, the accept guard and graceful
// shutdown. Client connections are a FrontEnd's (front-end.ts):
// uWebSockets.js (front-uws.ts) or the native HTTP/1.1 front end
// (front-native.ts), chosen by server.frontEnd; each hands every inference
// request, once its body has arrived, to the director (src/director/).
import { performance } from 'node:perf_hooks';
import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import type { LimitsConfig, RouterConfig, ShutdownConfig } from '../config/schema.js';
import type { AdmissionGate } from '../admission.js';
import { type Director, SLO_HEADERS } from '../director/director.js';
import type { SessionTable } from '../sessions/table.js';
import type { DataLayer } from '../endpoints/data-layer.js';
import type { EndpointSet, Endpoint } from '../endpoints/endpoint.js';
import type { LiveEndpoints } from '../endpoints/live.js';
import type { UpstreamClient } from '../proxy/upstream.js';
import type { Scheduler } from '../scheduler/scheduler.js';
import type { Disaggregator } from '../director/pd.js';
import type { HttpExchange } from './http-exchange.js';
import { AcceptGuard } from './accept-guard.js';
import { lowestFreeFd, raiseFdLimit } from '../../bindings/index.js';
import { Counter, Gauge } from 'prom-client';
import type { RouterMetrics } from './metrics.js';
import type { ResponsesService } from '../responses/service.js';
import type { Precise } from './precise.js';
import { framingProblem } from './framing.js';
import { ReadingList } from './reading-list.js';
import { ActiveList, type InFlightRequest } from './drain.js';
import { newUpstreamClient } from './upstream-choice.js';
import { chooseFrontEnd, type FrontEnd, type FrontHost } from './front-end.js';
import { UwsFrontEnd } from './front-uws.js';
import { NativeFrontEnd } from './front-native.js';
import type { RouterParts } from './assemble.js';
import type { ApiKeyAuthenticator } from '../auth/authenticator.js';
import { UsageCounters } from '../auth/usage.js';
import type { RateLimiter } from '../limits/limiter.js';
import { ANONYMOUS, isRefusal, type Caller, type HeaderGetter, type Refusal } from '../identity.js';

export interface CoreOptions {
  /** Raise the process's open-file soft limit to its hard limit when listening (default true). */
  raiseFdLimit?: boolean;
}

// moved out of this file; re-exported for the callers that import them from here
export { framingProblem, ReadingList, newUpstreamClient };

/** Bytes a header field value must not hold (controls other than HTAB). */
const FIELD_CTL = /[\0-\x08\n-\x1f\x7f]/;
const FIELD_CTLS = /[\0-\x08\n-\x1f\x7f]/g;
const CONTENT_TYPE_PREFIX = Buffer.from('content-type: ');

export class RouterCore implements FrontHost {
  readonly config: RouterConfig;
  readonly log: Logger;
  readonly endpoints: EndpointSet;
  /** Metrics scraping and health checks of every endpoint (started by startRouter). */
  readonly dataLayer: DataLayer;
  /** Runtime endpoint changes (reload, admin API, other endpoint sources). */
  readonly live: LiveEndpoints;
  readonly scheduler: Scheduler;
  /** Precise prefix matching (KV-event feed, token source); null when no pool is precise. */
  readonly precise: Precise | null;
  readonly upstream: UpstreamClient;
  readonly gate: AdmissionGate;
  readonly director: Director;
  /** Session pins and turn records (the scheduler's session-affinity filter, the director's turn tracker). */
  readonly sessions: SessionTable;
  /** The Responses API (null when `responses.enabled` is false). */
  readonly responses: ResponsesService | null;
  /** The Files and Batches API (when `config.batch` is set; docs/batch.md). */
  readonly batchApi: import('../batch/api.js').BatchApi | null;
  /** P/D disaggregation (config.disaggregation), or null. */
  readonly pd: Disaggregator | null;

  /**
   * API-key authentication (config.auth), or null. Replaced whole on a config
   * reload: new requests see the new keys at once, a request that resolved its
   * caller keeps it to its end.
   */
  get auth(): ApiKeyAuthenticator | null {
    return this.#auth;
  }
  set auth(a: ApiKeyAuthenticator | null) {
    this.#auth = a;
    this.#modelsFor.clear();
  }
  #auth: ApiKeyAuthenticator | null;
  /** Requests and in-flight counts per tenant and per key (GET /admin/tenants). */
  readonly usage: UsageCounters;
  /** Rate limits (config.rateLimits; src/limits/), or null: its counters give every answer its x-ratelimit-* headers. */
  readonly limiter: RateLimiter | null;

  rateHeaders(caller: Caller): string {
    return this.limiter === null ? '' : this.limiter.headers(caller);
  }
  /** Callers by tenant without auth (flow control's tenants): one shared object per tenant. */
  readonly #tenantCallers = new Map<string, Caller>();

  /**
   * Who a request is (src/identity.ts), decided once as it arrives: with
   * `auth` its key's caller, or a Refusal (401); without, the flow-control
   * tenant (an API key of flowControl.tenants, or a trusted header) or the
   * anonymous caller.
   */
  callerOf(get: HeaderGetter): Caller | Refusal {
    if (this.#auth !== null) return this.#auth.authenticate(get);
    const id = this.gate.identity;
    if (id === undefined) return ANONYMOUS;
    const tenant = id.tenantOf(get);
    if (tenant === '') return ANONYMOUS;
    let c = this.#tenantCallers.get(tenant);
    if (c === undefined) {
      if (this.#tenantCallers.size >= 4096) this.#tenantCallers.clear();
      c = Object.freeze({ ...ANONYMOUS, tenant });
      this.#tenantCallers.set(tenant, c);
    }
    return c;
  }

  /** The tenant a request belongs to ('' = the anonymous scope, also for a refused request). */
  tenantOf(get: HeaderGetter): string {
    const c = this.callerOf(get);
    return isRefusal(c) ? '' : c.tenant;
  }

  /** GET /v1/models's body for a caller: only its models when it has an allow-list. */
  modelsBodyFor(caller: Caller): string {
    if (caller.models === null) return this.modelsBody;
    let b = this.#modelsFor.get(caller);
    if (b === undefined) {
      if (this.#modelsFor.size >= 4096) this.#modelsFor.clear();
      b = this.#modelsOf(caller.models);
      this.#modelsFor.set(caller, b);
    }
    return b;
  }
  /** /v1/models bodies of callers with a model allow-list (cleared when endpoints or keys change). */
  readonly #modelsFor = new Map<Caller, string>();
  readonly #modelsOf: (allowed: ReadonlySet<string> | null) => string;
  readonly metrics: RouterMetrics;
  readonly limits: LimitsConfig;
  /** The drain's grace and delay (config.shutdown; a reload replaces it). */
  shutdown: ShutdownConfig;
  /** Requests still reading their body (for the 408 sweep). */
  readonly reading = new ReadingList();
  /** performance.now() at the last body-timeout sweep: requests stamp their start with it (no clock read per request). */
  clock = performance.now();
  /** Inference requests in flight (a drain cuts those left at its grace's end). */
  readonly #inFlight = new ActiveList<InFlightRequest>();
  #idPrefix = randomBytes(4).toString('hex');
  #idCounter = 0;
  /** The session header's name as bytes, or null when the header is no session source. */
  readonly sessionHeaderBytes: Buffer | null;
  /** The session header's name ('' when the header is no session source). */
  readonly sessionHeaderName: string;
  #debug: boolean;
  /** logging.access (a reload changes it) and its sample share. */
  #access: boolean;
  #accessSample: number;
  /** The client listener (server.frontEnd): uWebSockets.js or the native HTTP/1.1 front end. */
  readonly frontEnd: FrontEnd;
  readonly #raiseFdLimit: boolean;
  /** Stops accepting near the open-file limit (null until listening). */
  acceptGuard: AcceptGuard | null = null;
  #sweep: NodeJS.Timeout;
  #sweepEvery: number;
  /** GET /v1/models's body (rebuilt when the endpoints change). */
  modelsBody: string;
  #drainWaiters: (() => void)[] = [];
  /**
   * close() began: /readyz answers 503, and every answer closes its connection
   * (clients reconnect elsewhere instead of sending more on a socket about to close).
   */
  draining = false;
  /** A hot-standby pair's lease (src/ha/): /readyz answers 503 while this router is the standby. Null: no pair. */
  readonly leadership: { readonly leading: boolean } | null;
  /** Per endpoint id: content type -> the response header block of headerBlock(). */
  readonly #headerBlocks: Map<string, Buffer>[] = [];
  /** Request headers handed to the director: the gate's, plus the SLO headers when a latency plugin reads them. */
  readonly headerNames: readonly string[];
  port = 0;

  constructor(parts: RouterParts, opts: CoreOptions = {}) {
    const cfg = (this.config = parts.config);
    this.log = parts.log;
    this.#raiseFdLimit = opts.raiseFdLimit !== false;
    this.#debug = this.log.isLevelEnabled('debug');
    this.#access = cfg.logging.access;
    this.#accessSample = cfg.logging.accessSample;
    const set = (this.endpoints = parts.endpoints);
    this.dataLayer = parts.dataLayer;
    this.live = parts.live;
    this.sessions = parts.sessions;
    this.precise = parts.precise;
    this.scheduler = parts.scheduler;
    this.upstream = parts.upstream;
    const gate = (this.gate = parts.gate);
    this.pd = parts.pd;
    this.metrics = parts.metrics;
    this.director = parts.director;
    this.responses = parts.responses;
    this.batchApi = parts.batchApi;
    this.leadership = parts.leadership;
    this.sessionHeaderName = cfg.sessions.sources.includes('header') ? cfg.sessions.header.toLowerCase() : '';
    this.sessionHeaderBytes = this.sessionHeaderName !== '' ? Buffer.from(cfg.sessions.header) : null;
    // latency plugins read the request's objectives (x-slo-ttft-ms, x-slo-tpot-ms) besides the gate's headers
    this.headerNames = this.scheduler.latency ? [...gate.headerNames, ...SLO_HEADERS] : gate.headerNames;
    this.limits = cfg.limits;
    this.#auth = parts.auth;
    this.limiter = parts.limiter;
    this.usage = new UsageCounters(cfg.metrics.maxLabelValues);
    this.shutdown = cfg.shutdown;
    const created = Math.floor(Date.now() / 1000);
    const modelsBody = (this.#modelsOf = (allowed: ReadonlySet<string> | null) =>
      JSON.stringify({
        object: 'list',
        data: [
          ...set
            .models()
            .filter((id) => allowed === null || allowed.has(id))
            .map((id) => ({ id, object: 'model', created, owned_by: 'switchyard' })),
          // LoRA adapters, with their base model as parent (as vLLM lists them)
          ...set
            .adapters()
            .filter(([id]) => allowed === null || allowed.has(id))
            .map(([id, parent]) => ({ id, object: 'model', created, owned_by: 'switchyard', parent })),
        ],
      }));
    this.modelsBody = modelsBody(null);
    set.onChange(() => {
      this.modelsBody = modelsBody(null);
      this.#modelsFor.clear();
    });
    const sweepEvery = (this.#sweepEvery = Math.max(10, Math.min(1000, Math.floor(cfg.limits.requestBodyTimeoutMs / 4))));
    this.#sweep = setInterval(() => this.#sweepSlowBodies(), sweepEvery);
    this.#sweep.unref();
    this.frontEnd = chooseFrontEnd(cfg.server, this.log) === 'native' ? new NativeFrontEnd(this) : new UwsFrontEnd(this);
  }

  /**
   * `content-type: <ct>\r\nx-switchyard-endpoint: <name>\r\nx-request-id` as
   * bytes (UTF-8, as uWS encodes header strings): an answer's headers take one
   * writeHeader(block, requestId) instead of three calls, each converting two
   * strings. Cached per endpoint and content type (a few of each).
   */
  headerBlock(ep: Endpoint, contentType: string): Buffer {
    const m = (this.#headerBlocks[ep.id] ??= new Map());
    let b = m.get(contentType);
    if (b === undefined) {
      if (m.size >= 16) m.clear();
      // an upstream's value may hold controls a field value must not (the h1 and native
      // parsers pass a bare CR or a NUL through): as spaces (RFC 9112 2.2), or a lenient
      // client would split a header off. Checked here, once per cached block.
      const ct = FIELD_CTL.test(contentType) ? contentType.replace(FIELD_CTLS, ' ') : contentType;
      // the upstream clients hand the value over one char per byte: written back as those
      // bytes (latin1), so a non-ASCII content type is relayed as the engine sent it; the
      // endpoint name is the operator's text, written as UTF-8
      b = Buffer.concat([
        CONTENT_TYPE_PREFIX,
        Buffer.from(ct, 'latin1'),
        Buffer.from(`\r\nx-switchyard-endpoint: ${ep.name}\r\nx-request-id`),
      ]);
      m.set(contentType, b);
    }
    return b;
  }

  newRequestId(): string {
    return `${this.#idPrefix}-${(++this.#idCounter).toString(36)}`;
  }

  /** GET /readyz's answer (both front ends): status and body. */
  readiness(): [number, string] {
    // draining: a load balancer that checks over a kept-alive connection must take the router out
    if (this.draining) return [503, '{"status":"shutting down"}'];
    if (this.leadership !== null && !this.leadership.leading) return [503, '{"status":"standby"}'];
    const set = this.endpoints;
    const now = performance.now();
    const checks = set.dataLayer.healthIntervalMs > 0;
    const notReady: string[] = [];
    for (const m of set.models()) {
      if (!set.forModel(m)!.some((ep) => ep.ready(now, checks) && ep.serves(m))) notReady.push(m);
    }
    if (notReady.length === 0) return [200, '{"status":"ready"}'];
    // why, per model: each endpoint's problem (not-ready path only)
    const reasons: Record<string, string[]> = {};
    for (const m of notReady) {
      const eps = set.forModel(m)!;
      reasons[m] =
        eps.length === 0
          ? ['no active endpoint']
          : eps.map((ep) =>
              !ep.serves(m)
                ? `${ep.name}: the engine does not serve "${m}" (its /v1/models does not list it)`
                : ep.health === 'down'
                  ? `${ep.name}: health check failing`
                  : ep.breakerOpen(now)
                    ? `${ep.name}: circuit breaker open`
                    : `${ep.name}: not checked yet`,
            );
    }
    return [503, JSON.stringify({ status: 'not ready', models_without_ready_endpoint: notReady, reasons })];
  }

  /** An inference request began (the front end's side of requestEnded): it is in flight until then, counted for its caller's tenant and key. */
  requestBegan(x: InFlightRequest): void {
    this.#inFlight.add(x);
    const caller = x.caller;
    const t = this.usage.tenant(caller.tenant);
    t.requests++;
    t.inFlight++;
    const k = this.usage.key(caller.keyId);
    if (k !== null) {
      k.requests++;
      k.inFlight++;
    }
  }

  /** The access log is on (the front ends read the tenant for it). */
  get accessLog(): boolean {
    return this.#access;
  }

  #sweepSlowBodies(): void {
    const now = (this.clock = performance.now());
    if (this.reading.size === 0) return;
    // readStart is the clock of the sweep before the request began: allow one sweep period so none ends early
    const deadline = now - this.limits.requestBodyTimeoutMs - this.#sweepEvery;
    const late = this.reading.startedBefore(deadline);
    for (const ctx of late) {
      this.reading.delete(ctx);
      ctx.reject(408, `the request body did not arrive within ${this.limits.requestBodyTimeoutMs} ms`);
    }
  }

  /** Called once per inference request when it ends (any way). */
  requestEnded(ctx: InFlightRequest, status: number): void {
    this.#inFlight.delete(ctx);
    this.usage.tenant(ctx.caller.tenant).inFlight--;
    const k = this.usage.key(ctx.caller.keyId);
    if (k !== null) k.inFlight--;
    const now = performance.now();
    this.metrics.countOutcome(ctx.flight?.model ?? '', ctx.outcome, ctx.rejectReason, (now - ctx.startedAt) / 1000, ctx.firstByteAt > 0 ? (ctx.firstByteAt - ctx.startedAt) / 1000 : -1);
    if (this.#access ? this.#accessSample >= 1 || Math.random() < this.#accessSample : this.#debug) this.#accessLine(ctx, status);
    if (this.#inFlight.size === 0 && this.#drainWaiters.length > 0) {
      for (const w of this.#drainWaiters.splice(0)) w();
    }
  }

  /**
   * The access log's line of one finished request (logging.access: at info;
   * without it at debug): who, what, where, how it ended and how long it
   * took. Never a key, a header value other than the request id, or a body.
   */
  #accessLine(ctx: InFlightRequest, status: number): void {
    const f = ctx.flight;
    const now = performance.now();
    const line = {
      event: 'access',
      id: ctx.requestId,
      method: 'POST',
      path: f?.path ?? ctx.path,
      status,
      duration_ms: Math.round((now - ctx.startedAt) * 10) / 10,
      ttft_ms: ctx.firstByteAt > 0 ? Math.round((ctx.firstByteAt - ctx.startedAt) * 10) / 10 : null,
      tenant: ctx.tenant,
      // the client's text: bounded (a body may name a model of megabytes)
      model: f?.model ? (f.model.length > 256 ? `${f.model.slice(0, 256)}…` : f.model) : null,
      endpoint: f?.endpoint?.name ?? null,
      prefill_endpoint: f?.prefillEndpoint?.name ?? null,
      tokens: f !== null && f.completionTokens !== undefined && f.completionTokens >= 0 ? f.completionTokens : null,
      bytes: f?.responseBytes ?? 0,
      retries: f?.retries ?? 0,
    };
    if (this.#access) this.log.info(line, 'request');
    else this.log.debug(line, 'request');
  }

  /**
   * Sets the logger's level (a config reload's logging.level) and refreshes the
   * cached debug flag the per-request path reads; `logging` the access log's switch.
   */
  setLogLevel(level: string, logging?: RouterConfig['logging']): void {
    this.log.level = level;
    this.#debug = this.log.isLevelEnabled('debug');
    if (logging !== undefined) {
      this.#access = logging.access;
      this.#accessSample = logging.accessSample;
    }
  }

  get activeRequests(): number {
    return this.#inFlight.size;
  }

  /**
   * A drain begins: /readyz answers 503 and answers close their connections,
   * while the router keeps accepting (a balancer notices before it stops).
   */
  beginDrain(): void {
    this.draining = true;
  }

  /**
   * Ends every request still in flight (a drain's grace is over, or a second
   * signal): streams get an SSE error event, the rest a 503; logged with their
   * ids (the first 50). `graceMs` names the grace that ran out (0: none).
   */
  cutInFlight(graceMs: number): number {
    if (this.#inFlight.size === 0) return 0;
    const { count, ids } = this.#inFlight.cutAll(graceMs);
    this.log.warn({ cut: count, grace_ms: graceMs, request_ids: ids }, `shutdown: ${count} request(s) still in flight ended (streams with an SSE error event, others with a 503)`);
    return count;
  }

  /** Listens on the front end (config.server.frontEnd, see chooseFrontEnd); resolves the port. */
  async listen(host: string, port: number): Promise<number> {
    this.port = await this.frontEnd.listen(host, port);
    this.#startAcceptGuard();
    return this.port;
  }

  /**
   * Near the file-descriptor limit, stop accepting (uWS: close the listening
   * socket, as it would otherwise retry a failing accept() in a busy loop;
   * native: close each new connection at once) and
   * keep serving the connections already open; listen again once some close.
   */
  #startAcceptGuard(): void {
    if (this.acceptGuard !== null) return;
    let limit = Infinity;
    try {
      // raise the soft limit to the hard one first (many systems start at 1024), as nginx's worker_rlimit_nofile
      limit = this.#raiseFdLimit ? raiseFdLimit().soft : Infinity;
    } catch (err) {
      this.log.warn({ err }, 'could not raise the open-file limit');
    }
    let failedAt = 0;
    const guard = new AcceptGuard({
      limit,
      probe: lowestFreeFd,
      pause: (inUse) => {
        this.frontEnd.pauseAccepting();
        this.log.warn(
          { open_fds: inUse, limit, reserve: guard.reserve },
          'at the open-file limit: not accepting new connections until some close (connections already open are served)',
        );
      },
      resume: (inUse) => {
        if (this.draining) return true;
        const ok = this.frontEnd.resumeAccepting();
        if (ok) {
          failedAt = 0;
          this.log.info({ open_fds: inUse, limit }, 'below the open-file limit again: accepting connections');
        } else if (failedAt === 0 || Date.now() - failedAt > 10_000) {
          failedAt = Date.now();
          this.log.error({ port: this.port }, 'cannot listen again after pausing at the open-file limit (retrying every 100 ms)');
        }
        return ok;
      },
    });
    this.acceptGuard = guard;
    if (!guard.enabled) return;
    guard.start();
    const r = [this.metrics.registry];
    new Gauge({
      name: 'switchyard_accept_paused',
      help: '1 while the router does not accept new connections because it is near its open-file limit.',
      registers: r,
      collect() {
        this.set(guard.paused ? 1 : 0);
      },
    });
    new Counter({
      name: 'switchyard_accept_pauses_total',
      help: 'Times the router stopped accepting connections near its open-file limit.',
      registers: r,
      collect() {
        this.reset();
        this.inc(guard.pauses);
      },
    });
    new Gauge({
      name: 'switchyard_open_fds_limit',
      help: 'The open-file soft limit the router runs under (raised to the hard limit at start).',
      registers: r,
      collect() {
        this.set(guard.limit);
      },
    });
  }

  /** Stops accepting, waits up to `graceMs` for in-flight requests, then closes the HTTP app. */
  async close(graceMs = 10_000): Promise<void> {
    this.draining = true;
    this.acceptGuard?.stop();
    this.frontEnd.stopListening();
    if (this.#inFlight.size > 0) {
      this.log.info({ in_flight: this.#inFlight.size, grace_ms: graceMs }, 'draining: waiting for in-flight requests');
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, graceMs);
        this.#drainWaiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
      // the grace is over: what still runs ends with an error the client can read, not a reset
      if (this.cutInFlight(graceMs) > 0) await new Promise((r) => setTimeout(r, 50)); // the last bytes leave before the sockets close
    }
    clearInterval(this.#sweep);
    this.frontEnd.close();
    // the components it served with close after every listener has drained (the lifecycle's `parts`, assemble.ts)
  }
}
