// The router's HTTP transport on uWebSockets.js: routes, body limits and
// timeouts, the non-inference endpoints, and graceful shutdown. It owns the
// router's parts (endpoints, data layer, scheduler, upstream client, gate,
// director) and hands each inference request, once its body has arrived, to
// the director (src/director/), which knows nothing of uWS. The per-request
// transport object is HttpExchange (http-exchange.ts).
import { performance } from 'node:perf_hooks';
import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import type { LimitsConfig, RouterConfig } from '../config/schema.js';
import { PassThroughGate, type AdmissionGate } from '../admission.js';
import { Director, KIND_CHAT, KIND_COMPLETION, KIND_EMBEDDINGS, KIND_PATHS, SLO_HEADERS } from '../director/director.js';
import { SessionTable } from '../sessions/table.js';
import { RedisSessions } from '../sessions/redis.js';
import { registerSessionMetrics } from '../sessions/metrics.js';
import { DataLayer } from '../endpoints/data-layer.js';
import { EndpointSet, type Endpoint } from '../endpoints/endpoint.js';
import { LiveEndpoints } from '../endpoints/live.js';
import type { UpstreamClient } from '../proxy/upstream.js';
import { Scheduler } from '../scheduler/scheduler.js';
import { Disaggregator } from '../director/pd.js';
import { errorBody, statusLine } from './http-errors.js';
import { headerBytes, HttpExchange } from './http-exchange.js';
import { AcceptGuard } from './accept-guard.js';
import { lowestFreeFd, raiseFdLimit } from '../../bindings/index.js';
import { Counter, Gauge } from 'prom-client';
import { RouterMetrics } from './metrics.js';
import { ResponsesService } from '../responses/service.js';
import { KIND_RESPONSES, mountResponseReads, ResponsesExchange } from './responses-http.js';
import { mountBatchRoutes } from './batch-http.js';
import type { RequestTracer } from '../telemetry/tracing.js';
import { buildPrecise, type Precise } from './precise.js';
import { framingProblem, scanBaggage, scanTraceparent, scanTracestate } from './framing.js';
import { ReadingList } from './reading-list.js';
import { newUpstreamClient } from './upstream-choice.js';
import type { ApiKeyAuthenticator } from '../auth/authenticator.js';
import { UsageCounters } from '../auth/usage.js';
import { ANONYMOUS, isRefusal, type Caller, type HeaderGetter, type Refusal } from '../identity.js';
import { uws, type HttpRequest, type HttpResponse, type TemplatedApp, type us_listen_socket } from '../uws.js';

export interface RouterOptions {
  config: RouterConfig;
  logger: Logger;
  /** Admission gate, or a factory given the endpoints. Default: flow control when config.flowControl is set (startRouter builds it), else admit everything. */
  gate?: AdmissionGate | ((endpoints: EndpointSet) => AdmissionGate);
  /** Upstream client. Default: undici pools. */
  upstream?: UpstreamClient;
  /** Random source for pickers (tests may seed it). */
  random?: () => number;
  /** Raise the process's open-file soft limit to its hard limit when listening (default true). */
  raiseFdLimit?: boolean;
  /** OpenTelemetry tracing (startRouter builds it when config.tracing.enabled); absent = off. */
  tracer?: RequestTracer | null;
  /** API-key authentication (startRouter builds it from config.auth: src/auth/keys.ts); absent = none. */
  auth?: ApiKeyAuthenticator | null;
}

// the request whose headers the module-level getter reads (no closure per request)
let curReq: HttpRequest;
const getCurHeader: HeaderGetter = (name) => curReq.getHeader(name);

// Header names read on every inference request, as bytes: uWS converts a JS
// string argument into a fresh UTF-8 heap copy per call, a Buffer it reads in place.
// moved out of this file; re-exported for the callers that import them from here
export { framingProblem, ReadingList, newUpstreamClient };

const H_CONTENT_LENGTH = Buffer.from('content-length');
const H_REQUEST_ID = Buffer.from('x-request-id');
/** Bytes a header field value must not hold (controls other than HTAB). */
const FIELD_CTL = /[\0-\x08\n-\x1f\x7f]/;
const FIELD_CTLS = /[\0-\x08\n-\x1f\x7f]/g;
const CONTENT_TYPE_PREFIX = Buffer.from('content-type: ');

const H_TRANSFER_ENCODING = Buffer.from('transfer-encoding');

const KNOWN_PATHS: Record<string, string> = {
  '/v1/chat/completions': 'POST',
  '/v1/completions': 'POST',
  '/v1/responses': 'POST',
  '/v1/models': 'GET',
  '/healthz': 'GET',
  '/readyz': 'GET',
  '/metrics': 'GET',
};
for (const path of KIND_PATHS) KNOWN_PATHS[path] = 'POST';

function localPort(sock: us_listen_socket): number {
  return uws.us_socket_local_port(sock as unknown as Parameters<typeof uws.us_socket_local_port>[0]);
}

export class RouterCore {
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
  /** The Files and Batches API (set by startRouter when `config.batch` is; docs/batch.md). */
  batchApi: import('../batch/api.js').BatchApi | null = null;
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
  #auth: ApiKeyAuthenticator | null = null;
  /** Requests and in-flight counts per tenant and per key (GET /admin/tenants). */
  readonly usage: UsageCounters;
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

  /** Answers 401 for a refused request (OpenAI's body: invalid_request_error, code invalid_api_key). */
  unauthorized(res: HttpResponse, refusal: Refusal, declaredLength = ''): void {
    // a body declared over the limit is not worth reading: answer after uWS is done with this read, then close
    if (declaredLength !== '' && Number(declaredLength) > this.limits.maxBodyBytes) this.#deferredError(res, 401, refusal.refused);
    else this.#error(res, 401, refusal.refused, false);
  }
  readonly metrics: RouterMetrics;
  readonly limits: LimitsConfig;
  /** Requests still reading their body (for the 408 sweep). */
  readonly reading = new ReadingList();
  /** performance.now() at the last body-timeout sweep: requests stamp their start with it (no clock read per request). */
  clock = performance.now();
  #active = 0;
  #idPrefix = randomBytes(4).toString('hex');
  #idCounter = 0;
  /** The session header's name as bytes, or null when the header is no session source. */
  readonly #sessionHeader: Buffer | null;
  #debug: boolean;
  #app: TemplatedApp;
  #listenSocket: us_listen_socket | null = null;
  #host = '';
  readonly #raiseFdLimit: boolean;
  /** Stops accepting near the open-file limit (null until listening). */
  acceptGuard: AcceptGuard | null = null;
  #sweep: NodeJS.Timeout;
  #sweepEvery: number;
  #modelsBody: string;
  /** /v1/models bodies of callers with a model allow-list (cleared when endpoints or keys change). */
  readonly #modelsFor = new Map<Caller, string>();
  #modelsOf: (allowed: ReadonlySet<string> | null) => string;
  #drainWaiters: (() => void)[] = [];
  /**
   * close() began: /readyz answers 503, and every answer closes its connection
   * (clients reconnect elsewhere instead of sending more on a socket about to close).
   */
  draining = false;
  /** A hot-standby pair's lease (src/ha/): /readyz answers 503 while this router is the standby. Null: no pair. */
  leadership: { readonly leading: boolean } | null = null;
  /** Per endpoint id: content type -> the response header block of headerBlock(). */
  readonly #headerBlocks: Map<string, Buffer>[] = [];
  /** Request headers handed to the director: the gate's, plus the SLO headers when a latency plugin reads them. */
  readonly #headerNames: readonly string[];
  port = 0;

  constructor(opts: RouterOptions) {
    const cfg = (this.config = opts.config);
    this.log = opts.logger;
    this.#raiseFdLimit = opts.raiseFdLimit !== false;
    this.#debug = this.log.isLevelEnabled('debug');
    const set = (this.endpoints = new EndpointSet(cfg.pools, cfg.dataLayer));
    const sessions = (this.sessions = new SessionTable(set, cfg.sessions));
    if (cfg.sessions.store !== 'memory') sessions.shared = new RedisSessions(cfg.sessions.store, cfg.sessions.ttlMs, this.log);
    sessions.start();
    this.#sessionHeader = cfg.sessions.sources.includes('header') ? Buffer.from(cfg.sessions.header) : null;
    const precise = (this.precise = buildPrecise(cfg, set));
    this.scheduler = new Scheduler(set, cfg.scheduling, { random: opts.random, sessions, precise: precise?.feed, decodeProfile: cfg.disaggregation?.decode });
    if (precise !== null) {
      // an engine that may have lost its cache is not believed to hold anything by the approximate fallback either
      precise.feed.onEngineReset = (id) => {
        const ep = set.byId(id);
        if (ep !== undefined) this.scheduler.prefix?.clear(ep);
      };
    }
    this.upstream = opts.upstream ?? newUpstreamClient(cfg.proxy, set);
    const g = opts.gate;
    const gate: AdmissionGate = (this.gate = g === undefined ? new PassThroughGate() : typeof g === 'function' ? g(set) : g);
    const dl = (this.dataLayer = new DataLayer(set));
    dl.onCapacity((ep) => this.scheduler.onCapacity(ep));
    const pdc = cfg.disaggregation;
    if (pdc !== undefined) {
      // the prefill profile: its own filters, scorers and picker (and its own prefix index) over the same endpoints
      const prefill = new Scheduler(set, { ...pdc.prefill, prefixBlockSize: cfg.scheduling.prefixBlockSize }, { random: opts.random });
      dl.onCapacity((ep) => prefill.onCapacity(ep));
      this.pd = new Disaggregator(pdc, set, prefill, this.upstream, this.scheduler.prefix?.blockSize ?? 0, this.scheduler.prefix);
    } else this.pd = null;
    if (gate.onCapacity) {
      dl.onScrape((ep) => {
        for (const m of ep.models) gate.onCapacity!(m);
      });
    }
    this.metrics = new RouterMetrics(set);
    this.pd?.metrics.register(this.metrics.registry);
    this.live = new LiveEndpoints(set, { graceMs: cfg.admin?.drainGraceMs });
    this.metrics.live = this.live.counters;
    // a removed endpoint's connections close (busy ones once their request ends): no descriptor stays open to it
    set.onRemoved((ep) => this.upstream.forget?.(ep));
    // the gate's families (flow control) join the router's registry
    gate.registerMetrics?.(this.metrics.registry);
    registerSessionMetrics(this.metrics.registry, sessions);
    precise?.registerMetrics(this.metrics.registry, () => this.scheduler.prefix);
    this.scheduler.registerMetrics(this.metrics.registry);
    // latency plugins read the request's objectives (x-slo-ttft-ms, x-slo-tpot-ms) besides the gate's headers
    this.#headerNames = this.scheduler.latency ? [...gate.headerNames, ...SLO_HEADERS] : gate.headerNames;
    this.limits = cfg.limits;
    this.director = new Director({
      scheduler: this.scheduler,
      upstream: this.upstream,
      gate,
      metrics: this.metrics,
      log: this.log,
      maxRetries: cfg.proxy.maxRetries,
      maxJsonDepth: cfg.limits.maxJsonDepth,
      parseOffloadBytes: cfg.limits.parseOffloadBytes,
      parseWorkers: cfg.limits.parseWorkers,
      sessions,
      tracer: opts.tracer ?? null,
      tokens: precise?.tokens ?? null,
      pd: this.pd,
    });
    if (opts.tracer) this.metrics.registerTracing(opts.tracer.stats);
    this.responses = cfg.responses.enabled
      ? new ResponsesService({ config: cfg.responses, director: this.director, log: this.log, countRequest: (m, e, s) => this.metrics.countRequest(m, e, s), registry: this.metrics.registry })
      : null;
    this.#auth = opts.auth ?? null;
    this.usage = new UsageCounters(cfg.metrics.maxLabelValues);
    const created = Math.floor(Date.now() / 1000);
    const modelsBody = (this.#modelsOf = (allowed: ReadonlySet<string> | null) =>
      JSON.stringify({
        object: 'list',
        data: set
          .models()
          .filter((id) => allowed === null || allowed.has(id))
          .map((id) => ({ id, object: 'model', created, owned_by: 'switchyard' })),
      }));
    this.#modelsBody = modelsBody(null);
    set.onChange(() => {
      this.#modelsBody = modelsBody(null);
      this.#modelsFor.clear();
    });
    const sweepEvery = (this.#sweepEvery = Math.max(10, Math.min(1000, Math.floor(cfg.limits.requestBodyTimeoutMs / 4))));
    this.#sweep = setInterval(() => this.#sweepSlowBodies(), sweepEvery);
    this.#sweep.unref();
    this.#app = this.#routes(uws.App());
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

  #routes(app: TemplatedApp): TemplatedApp {
    app.post('/v1/chat/completions', (res, req) => this.#inference(res, req, KIND_CHAT));
    app.post('/v1/completions', (res, req) => this.#inference(res, req, KIND_COMPLETION));
    // passthrough routes (embeddings, vLLM's score/rerank/tokenize/detokenize): same path, same handling, load-aware routing
    for (let kind = KIND_EMBEDDINGS; kind < KIND_PATHS.length; kind++) app.post(KIND_PATHS[kind]!, (res, req) => this.#inference(res, req, kind));
    if (this.responses !== null) {
      app.post('/v1/responses', (res, req) => this.#inference(res, req, KIND_RESPONSES));
      mountResponseReads(app, this);
    }
    mountBatchRoutes(app, this);
    app.get('/v1/models', (res, req) => {
      if (this.#badlyFramed(res, req)) return;
      curReq = req;
      const caller = this.callerOf(getCurHeader);
      if (isRefusal(caller)) return this.unauthorized(res, caller);
      this.#json(res, 200, caller.models === null ? this.#modelsBody : this.#modelsBodyOf(caller));
    });
    app.get('/healthz', (res, req) => {
      if (!this.#badlyFramed(res, req)) this.#json(res, 200, '{"status":"ok"}');
    });
    app.get('/readyz', (res, req) => {
      if (!this.#badlyFramed(res, req)) this.#readyz(res);
    });
    app.get('/metrics', (res, req) => {
      if (this.#badlyFramed(res, req)) return;
      // prom-client renders asynchronously: the response may be gone before the text is
      let aborted = false;
      res.onAborted(() => {
        aborted = true;
      });
      const contentType = this.metrics.registry.contentType;
      this.metrics.text().then(
        (body) => {
          if (aborted) return;
          res.cork(() => {
            res.writeStatus('200 OK').writeHeader('content-type', contentType).end(body, this.draining);
          });
        },
        (err: unknown) => {
          this.log.error({ err }, '/metrics: rendering failed');
          if (aborted) return;
          res.cork(() => {
            res.writeStatus(statusLine(500)).writeHeader('content-type', 'application/json');
            res.end(errorBody(500, 'metrics rendering failed'), this.draining);
          });
        },
      );
    });
    app.any('/*', (res, req) => {
      if (this.#badlyFramed(res, req)) return;
      const url = req.getUrl();
      const method = req.getMethod().toUpperCase();
      const allowed = url === '/v1/responses' && this.responses === null ? undefined : KNOWN_PATHS[url];
      if (method === 'HEAD') {
        // a HEAD answer has headers only, or the keep-alive connection goes out of sync
        const status = allowed === 'GET' ? 200 : allowed !== undefined ? 405 : 404;
        res.cork(() => {
          res.writeStatus(statusLine(status));
          if (status === 405) res.writeHeader('allow', allowed!);
          res.endWithoutBody();
        });
        return;
      }
      // uWS reads and drops the body of a request it has no onData for (by its
      // Content-Length or chunks), so the connection stays in step and can stay
      // open. Only a declared body over the limit closes it (not worth reading);
      // that answer is deferred, as a "Connection: close" written inside the
      // handler does not stop uWS from serving a request pipelined behind it.
      const cl = req.getHeader(H_CONTENT_LENGTH);
      const close = cl !== '' && Number(cl) > this.limits.maxBodyBytes;
      const [status, message] =
        allowed !== undefined ? [405, `method ${method} is not allowed on ${url} (use ${allowed})`] : [404, `no route for ${method} ${url}`];
      if (close) this.#deferredError(res, status, message, allowed);
      else this.#error(res, status, message, false, allowed);
    });
    return app;
  }

  /**
   * Rejects ambiguous body framing (framingProblem) with 400 and a closed
   * connection; true if it did. GET routes check only when a Content-Length
   * or Transfer-Encoding is present (two header lookups, no header walk).
   */
  #badlyFramed(res: HttpResponse, req: HttpRequest, always = false): boolean {
    if (!always && req.getHeader(H_CONTENT_LENGTH) === '' && req.getHeader(H_TRANSFER_ENCODING) === '') return false;
    const problem = framingProblem(req);
    if (problem === '') return false;
    this.#deferredError(res, 400, `bad request framing: ${problem}`);
    return true;
  }

  /**
   * Answers `status` and closes the connection, after uWS has finished with
   * the bytes of this read. An answer written inside the handler is lost when
   * uWS then closes the socket itself (a body it cannot parse: the write is
   * still in its cork buffer), and uWS clears the close flag when the next
   * pipelined request of the same read starts, so it would serve that one.
   * Deferred, the request is still pending when uWS meets a pipelined one:
   * uWS closes the connection (no answer rather than a served hidden request).
   */
  #deferredError(res: HttpResponse, status: number, message: string, allow?: string): void {
    this.metrics.countRequest('', -1, status);
    let gone = false;
    res.onAborted(() => {
      gone = true;
    });
    setImmediate(() => {
      if (gone) return;
      res.cork(() => {
        res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json');
        if (allow) res.writeHeader('allow', allow);
        res.end(errorBody(status, message), true);
      });
    });
  }

  /** /v1/models for a caller with an allow-list: only its models. */
  #modelsBodyOf(caller: Caller): string {
    let b = this.#modelsFor.get(caller);
    if (b === undefined) {
      if (this.#modelsFor.size >= 4096) this.#modelsFor.clear();
      b = this.#modelsOf(caller.models);
      this.#modelsFor.set(caller, b);
    }
    return b;
  }

  #json(res: HttpResponse, status: number, body: string): void {
    res.cork(() => {
      res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json').end(body, this.draining);
    });
  }

  #error(res: HttpResponse, status: number, message: string, close: boolean, allow?: string): void {
    this.metrics.countRequest('', -1, status);
    res.cork(() => {
      res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json');
      if (allow) res.writeHeader('allow', allow);
      res.end(errorBody(status, message), close || this.draining);
    });
  }

  #readyz(res: HttpResponse): void {
    // draining: a load balancer that checks over a kept-alive connection must take the router out
    if (this.draining) return this.#json(res, 503, '{"status":"shutting down"}');
    if (this.leadership !== null && !this.leadership.leading) return this.#json(res, 503, '{"status":"standby"}');
    const set = this.endpoints;
    const now = performance.now();
    const checks = set.dataLayer.healthIntervalMs > 0;
    const notReady: string[] = [];
    for (const m of set.models()) {
      if (!set.forModel(m)!.some((ep) => ep.ready(now, checks))) notReady.push(m);
    }
    if (notReady.length === 0) this.#json(res, 200, '{"status":"ready"}');
    else this.#json(res, 503, JSON.stringify({ status: 'not ready', models_without_ready_endpoint: notReady }));
  }

  #inference(res: HttpResponse, req: HttpRequest, kind: number): void {
    if (this.#badlyFramed(res, req, true)) return;
    const clText = req.getHeader(H_CONTENT_LENGTH);
    curReq = req;
    const caller = this.callerOf(getCurHeader);
    if (isRefusal(caller)) return this.unauthorized(res, caller, clText);
    const contentLength = clText === '' ? -1 : Number(clText);
    let id = req.getHeader(H_REQUEST_ID);
    let idHeader: string | Buffer;
    if (id === '' || id.length > 256) idHeader = id = this.newRequestId();
    else idHeader = headerBytes(id);
    const ctx = kind === KIND_RESPONSES ? new ResponsesExchange(this, res, kind, id, idHeader, caller, contentLength) : new HttpExchange(this, res, kind, id, idHeader, caller, contentLength);
    const tc = (ctx.tenantCounts = this.usage.tenant(caller.tenant));
    tc.requests++;
    tc.inFlight++;
    const kc = (ctx.keyCounts = this.usage.key(caller.keyId));
    if (kc !== null) {
      kc.requests++;
      kc.inFlight++;
    }
    const names = this.#headerNames;
    let h: Record<string, string> | null = null;
    if (names.length > 0) {
      h = {};
      for (let i = 0; i < names.length; i++) h[names[i]] = req.getHeader(names[i]);
    }
    if (this.#sessionHeader !== null && kind < KIND_EMBEDDINGS) ctx.sessionHeader = req.getHeader(this.#sessionHeader);
    // the trace headers framingProblem() collected (#badlyFramed ran it): for every upstream leg
    if (scanTraceparent !== '' || scanTracestate !== '' || scanBaggage !== '') {
      h ??= {};
      if (scanTraceparent !== '') h.traceparent = scanTraceparent;
      if (scanTracestate !== '') h.tracestate = scanTracestate;
      if (scanBaggage !== '') h.baggage = scanBaggage;
    }
    if (h !== null) ctx.headers = h;
    this.#active++;
    // bound methods, not arrow closures: uWS calls onData once per request, and a
    // fresh closure pays V8's lazy-code install on its first call
    res.onAborted(ctx.onClientAbort.bind(ctx));
    if (contentLength > this.limits.maxBodyBytes) {
      ctx.reject(413, `request body of ${contentLength} bytes exceeds the limit of ${this.limits.maxBodyBytes} bytes`);
      return;
    }
    ctx.readStart = this.clock;
    this.reading.add(ctx);
    res.onData(ctx.onBodyChunk.bind(ctx));
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
  requestEnded(ctx: HttpExchange, status: number): void {
    this.#active--;
    if (this.#debug) {
      const f = ctx.flight;
      this.log.debug({ id: ctx.requestId, model: f?.model, endpoint: f?.endpoint?.name, status, path: f?.path }, 'request');
    }
    if (this.#active === 0 && this.#drainWaiters.length > 0) {
      for (const w of this.#drainWaiters.splice(0)) w();
    }
  }

  /**
   * Sets the logger's level (a config reload's logging.level) and refreshes the
   * cached debug flag the per-request path reads.
   */
  setLogLevel(level: string): void {
    this.log.level = level;
    this.#debug = this.log.isLevelEnabled('debug');
  }

  get activeRequests(): number {
    return this.#active;
  }

  listen(host: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      const done = (sock: us_listen_socket | false): void => {
        if (!sock) {
          reject(new Error(`cannot listen on ${host}:${port} (address in use or not available)`));
          return;
        }
        this.#listenSocket = sock;
        this.port = localPort(sock);
        this.#host = host;
        this.#startAcceptGuard();
        resolve(this.port);
      };
      if (port !== 0) {
        this.#app.listen(host, port, done);
        return;
      }
      // An OS-picked port: uWS sets SO_REUSEADDR only on a listening socket given a port, and
      // without it the connections accepted on it keep a new listening socket from binding
      // there (listening again after a pause at the open-file limit). So: learn a free port,
      // then listen on it as on any configured port (a few tries in case another process takes it).
      for (let attempt = 0; attempt < 5; attempt++) {
        let picked = 0;
        this.#app.listen(host, 0, (probe) => {
          if (!probe) return;
          picked = localPort(probe);
          uws.us_listen_socket_close(probe);
        });
        if (picked === 0) break;
        let sock: us_listen_socket | false = false;
        this.#app.listen(host, picked, (s) => {
          sock = s;
        });
        if (sock) return done(sock);
      }
      done(false);
    });
  }

  /**
   * Near the file-descriptor limit, stop accepting (close the listening
   * socket: uWS would otherwise retry a failing accept() in a busy loop) and
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
        if (this.#listenSocket) uws.us_listen_socket_close(this.#listenSocket);
        this.#listenSocket = null;
        this.log.warn(
          { open_fds: inUse, limit, reserve: guard.reserve },
          'at the open-file limit: not accepting new connections until some close (connections already open are served)',
        );
      },
      resume: (inUse) => {
        if (this.draining) return true;
        let ok = false;
        // uWS calls back synchronously
        this.#app.listen(this.#host, this.port, (sock) => {
          if (!sock) return;
          this.#listenSocket = sock;
          ok = true;
        });
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

  /** Stops accepting, waits up to `graceMs` for in-flight requests, then closes everything. */
  async close(graceMs = 10_000): Promise<void> {
    this.draining = true;
    this.acceptGuard?.stop();
    if (this.#listenSocket) {
      uws.us_listen_socket_close(this.#listenSocket);
      this.#listenSocket = null;
    }
    if (this.#active > 0) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, graceMs);
        this.#drainWaiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
    clearInterval(this.#sweep);
    this.live.close();
    (this.#app as unknown as { close(): void }).close();
    await this.gate.close?.();
    await this.director.close();
    await this.responses?.close();
    await this.scheduler.close();
    await this.sessions.close();
    await this.precise?.close();
    await this.pd?.prefill.close();
    await this.dataLayer.close();
    await this.upstream.close();
    await this.director.tracer?.close(); // the last spans go out (bounded by the export timeout)
  }
}
