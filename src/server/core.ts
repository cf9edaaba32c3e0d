// The router's HTTP server on uWebSockets.js: routes, body limits and
// timeouts, the admission gate seam, the non-inference endpoints, and
// graceful shutdown. Per-request work lives in request.ts.
import { performance } from 'node:perf_hooks';
import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import { hostIsIp, type LimitsConfig, type ProxyConfig, type RouterConfig } from '../config/schema.js';
import { EndpointSet, type Endpoint } from '../endpoints/endpoint.js';
import { UndiciUpstreamClient } from '../proxy/undici-client.js';
import { H1UpstreamClient } from '../proxy/h1-client.js';
import { NativeUpstreamClient } from '../proxy/native-client.js';
import type { UpstreamClient } from '../proxy/upstream.js';
import { Scheduler } from '../scheduler/scheduler.js';
import type { SchedRequest } from '../scheduler/types.js';
import { PassThroughGate, type AdmissionGate } from './gate.js';
import { errorBody, statusLine } from './http-errors.js';
import { RouterMetrics } from './metrics.js';
import { PromptWriter } from './prompt.js';
import { headerBytes, KIND_CHAT, KIND_COMPLETION, ProxyRequest } from './request.js';
import { uws, type HttpRequest, type HttpResponse, type TemplatedApp, type us_listen_socket } from './uws.js';

export interface RouterOptions {
  config: RouterConfig;
  logger: Logger;
  /** Admission gate (flow control), or a factory given the endpoints. Default: admit everything. */
  gate?: AdmissionGate | ((endpoints: EndpointSet) => AdmissionGate);
  /** Upstream client. Default: undici pools. */
  upstream?: UpstreamClient;
  /** Random source for pickers (tests may seed it). */
  random?: () => number;
}

// Header names read on every inference request, as bytes: uWS converts a JS
// string argument into a fresh UTF-8 heap copy per call, a Buffer it reads in place.
const H_CONTENT_LENGTH = Buffer.from('content-length');
const H_REQUEST_ID = Buffer.from('x-request-id');
const H_AUTHORIZATION = Buffer.from('authorization');
/** Bytes a header field value must not hold (controls other than HTAB). */
const FIELD_CTL = /[\0-\x08\n-\x1f\x7f]/;
const FIELD_CTLS = /[\0-\x08\n-\x1f\x7f]/g;
const CONTENT_TYPE_PREFIX = Buffer.from('content-type: ');

const KNOWN_PATHS: Record<string, string> = {
  '/v1/chat/completions': 'POST',
  '/v1/completions': 'POST',
  '/v1/models': 'GET',
  '/healthz': 'GET',
  '/readyz': 'GET',
  '/metrics': 'GET',
};

/**
 * The requests still reading their body: an array with swap-remove through an
 * index kept on each request. A Set would rehash as it grows and shrinks with
 * every request; this allocates nothing per request.
 */
export class ReadingList {
  readonly #items: ProxyRequest[] = [];

  get size(): number {
    return this.#items.length;
  }

  add(r: ProxyRequest): void {
    if (r.readSlot >= 0) return;
    r.readSlot = this.#items.length;
    this.#items.push(r);
  }

  delete(r: ProxyRequest): void {
    const i = r.readSlot;
    if (i < 0) return;
    r.readSlot = -1;
    const last = this.#items.pop()!;
    if (last !== r) {
      this.#items[i] = last;
      last.readSlot = i;
    }
  }

  has(r: ProxyRequest): boolean {
    return r.readSlot >= 0 && this.#items[r.readSlot] === r;
  }

  /** Those whose body reading began before `deadline` (a new array: the sweep is not on the request path). */
  startedBefore(deadline: number): ProxyRequest[] {
    return this.#items.filter((r) => r.readStart < deadline);
  }
}

/**
 * The upstream client `proxy.client` names. `auto`: undici if any endpoint is
 * https; else the native client when every endpoint's host is an IP address
 * (it does no DNS lookups; `localhost` goes to h1, which tries both ::1 and
 * 127.0.0.1); else h1.
 */
export function newUpstreamClient(cfg: ProxyConfig, set: EndpointSet): UpstreamClient {
  const c = cfg.client;
  if (c === 'undici' || (c === 'auto' && set.all.some((ep) => ep.url.startsWith('https:')))) return new UndiciUpstreamClient(cfg);
  if (c === 'native' || (c === 'auto' && set.all.every((ep) => hostIsIp(ep.url)))) return new NativeUpstreamClient(cfg);
  return new H1UpstreamClient(cfg);
}

export class RouterCore {
  readonly config: RouterConfig;
  readonly log: Logger;
  readonly scheduler: Scheduler;
  readonly upstream: UpstreamClient;
  readonly gate: AdmissionGate;
  readonly metrics: RouterMetrics;
  readonly limits: LimitsConfig;
  readonly maxRetries: number;
  readonly prompt = new PromptWriter();
  readonly schedRequest: SchedRequest = { model: '', prompt: undefined };
  /** Requests still reading their body (for the 408 sweep). */
  readonly reading = new ReadingList();
  /** Set just before a gate rejection reply; read by reply(). */
  rejectReason = '';
  retryAfter = 0;
  /** performance.now() at the last body-timeout sweep: requests stamp their start with it (no clock read per request). */
  clock = performance.now();
  #active = 0;
  #idPrefix = randomBytes(4).toString('hex');
  #idCounter = 0;
  #debug: boolean;
  #app: TemplatedApp;
  #listenSocket: us_listen_socket | null = null;
  #sweep: NodeJS.Timeout;
  #sweepEvery: number;
  #modelsBody: string;
  #drainWaiters: (() => void)[] = [];
  /**
   * close() began: /readyz answers 503, and every answer closes its connection
   * (clients reconnect elsewhere instead of sending more on a socket about to close).
   */
  draining = false;
  /** Per endpoint id: content type -> the response header block of headerBlock(). */
  readonly #headerBlocks: Map<string, Buffer>[] = [];
  port = 0;

  constructor(opts: RouterOptions) {
    const cfg = (this.config = opts.config);
    this.log = opts.logger;
    this.#debug = this.log.isLevelEnabled('debug');
    const set = new EndpointSet(cfg.pools, cfg.dataLayer);
    this.scheduler = new Scheduler(set, cfg.scheduling, { random: opts.random });
    this.upstream = opts.upstream ?? newUpstreamClient(cfg.proxy, set);
    const g = opts.gate;
    this.gate = g === undefined ? new PassThroughGate() : typeof g === 'function' ? g(set) : g;
    const gate = this.gate;
    if (gate.onCapacity) {
      this.scheduler.onScrape((ep) => {
        for (const m of ep.models) gate.onCapacity!(m);
      });
    }
    this.metrics = new RouterMetrics(set);
    this.limits = cfg.limits;
    this.maxRetries = cfg.proxy.maxRetries;
    const created = Math.floor(Date.now() / 1000);
    this.#modelsBody = JSON.stringify({
      object: 'list',
      data: set.models().map((id) => ({ id, object: 'model', created, owned_by: 'switchyard' })),
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
    app.get('/v1/models', (res) => this.#json(res, 200, this.#modelsBody));
    app.get('/healthz', (res) => this.#json(res, 200, '{"status":"ok"}'));
    app.get('/readyz', (res) => this.#readyz(res));
    // the gate's families (flow control) join the router's registry once, with the route
    this.gate.registerMetrics?.(this.metrics.registry);
    app.get('/metrics', (res) => {
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
      const url = req.getUrl();
      const method = req.getMethod().toUpperCase();
      const allowed = KNOWN_PATHS[url];
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
      const hasBody = method !== 'GET';
      if (allowed !== undefined) {
        this.#error(res, 405, `method ${method} is not allowed on ${url} (use ${allowed})`, hasBody, allowed);
      } else {
        this.#error(res, 404, `no route for ${method} ${url}`, hasBody);
      }
    });
    return app;
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
    const set = this.scheduler.endpoints;
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
    const clText = req.getHeader(H_CONTENT_LENGTH);
    const contentLength = clText === '' ? -1 : Number(clText);
    let id = req.getHeader(H_REQUEST_ID);
    let idHeader: string | Buffer;
    if (id === '' || id.length > 256) idHeader = id = this.newRequestId();
    else idHeader = headerBytes(id);
    const ctx = new ProxyRequest(this, res, kind, id, idHeader, req.getHeader(H_AUTHORIZATION), contentLength);
    const names = this.gate.headerNames;
    if (names.length > 0) {
      const h: Record<string, string> = {};
      for (let i = 0; i < names.length; i++) h[names[i]] = req.getHeader(names[i]);
      ctx.headers = h;
    }
    this.#active++;
    // bound methods, not arrow closures: uWS calls onData once per request, and a
    // fresh closure pays V8's lazy-code install on its first call
    res.onAborted(ctx.onClientAbort.bind(ctx));
    if (contentLength > this.limits.maxBodyBytes) {
      ctx.reply(413, `request body of ${contentLength} bytes exceeds the limit of ${this.limits.maxBodyBytes} bytes`, null, true);
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
      ctx.reply(408, `the request body did not arrive within ${this.limits.requestBodyTimeoutMs} ms`, null, true);
    }
  }

  /** Called once per inference request when it ends (any way). */
  requestEnded(ctx: ProxyRequest, status: number): void {
    this.#active--;
    if (this.#debug) {
      this.log.debug({ id: ctx.requestId, model: ctx.model, endpoint: ctx.endpoint?.name, status, path: ctx.path }, 'request');
    }
    if (this.#active === 0 && this.#drainWaiters.length > 0) {
      for (const w of this.#drainWaiters.splice(0)) w();
    }
  }

  get activeRequests(): number {
    return this.#active;
  }

  listen(host: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      this.#app.listen(host, port, (sock) => {
        if (!sock) {
          reject(new Error(`cannot listen on ${host}:${port} (address in use or not available)`));
          return;
        }
        this.#listenSocket = sock;
        this.port = uws.us_socket_local_port(sock as unknown as Parameters<typeof uws.us_socket_local_port>[0]);
        resolve(this.port);
      });
    });
  }

  /** Stops accepting, waits up to `graceMs` for in-flight requests, then closes everything. */
  async close(graceMs = 10_000): Promise<void> {
    this.draining = true;
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
    (this.#app as unknown as { close(): void }).close();
    await this.gate.close?.();
    await this.scheduler.close();
    await this.upstream.close();
  }
}
