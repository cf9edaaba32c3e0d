// The native front end: the router's routes on the addon's HTTP/1.1 server
// (native/front_server.cc through bindings/front-end.ts). The server parses
// strictly (400/413/417/431/501/505 answered natively), keeps answers in
// request order on a pipelined connection, and hands each whole request over
// once: method, target, body and the values of the fields the router reads
// (`wanted`: no JavaScript walk of the head). An inference request becomes a
// NativeExchange, the director's ClientPort; a streamed answer that the
// server reports FULL pauses the upstream read until its socket drains.
import { performance } from 'node:perf_hooks';
import { Gauge, Counter } from 'prom-client';
import type { Rejected } from '../admission.js';
import type { ClientPort } from '../director/director.js';
import { KIND_EMBEDDINGS, KIND_PATHS } from '../director/director.js';
import { BodyPool } from '../director/body-pool.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import { FrontServer, FULL, GONE, type FrontRequest } from '../../bindings/front-end.js';
import { SERVER_DEFAULTS } from '../config/schema.js';
import { errorBody } from './http-errors.js';
import type { ExchangeFlight } from './http-exchange.js';
import { KIND_RESPONSES, inputItems, remove, retrieve, runResponsesOp, type Op as ResponsesOp } from './responses-http.js';
import { BATCH_NOT_CONFIGURED, batchRoute, isBatchPath, runBatchOp } from './batch-http.js';
import type { FileStream } from '../batch/api.js';
import { knownPaths, type FrontEnd, type FrontHost } from './front-end.js';
import { isRefusal, type Caller, type Refusal } from '../identity.js';
import { SHUTDOWN_CODE, type InFlightRequest } from './drain.js';
import { IdTable } from '../id-table.js';
import { errorOutcome, OUTCOME_CANCELLED, OUTCOME_MID_STREAM, OUTCOME_SHUTDOWN, statusOutcome } from '../metrics/outcomes.js';

const KNOWN_PATHS = knownPaths(KIND_PATHS);
const EMPTY: Readonly<Record<string, string>> = Object.freeze({});
const JSON_LINES = 'content-type: application/json\r\n';

// indexes into FrontRequest.wanted (the router's header names follow)
const W_REQUEST_ID = 0;
const W_AUTHORIZATION = 1;
const W_CONTENT_TYPE = 2;
const W_TRACEPARENT = 3;
const W_TRACESTATE = 4;
const W_BAGGAGE = 5;
const W_SESSION = 6;
const W_FIRST_GATE = 7;
const FIXED_WANTED = ['x-request-id', 'authorization', 'content-type', 'traceparent', 'tracestate', 'baggage'];

/** A header field value for a head line: controls (other than HTAB) as spaces, so no client can split a line off. */
const FIELD_CTLS = /[\0-\x08\n-\x1f\x7f]/g;
function fieldValue(s: string): string {
  return s.replace(FIELD_CTLS, ' ');
}

export class NativeFrontEnd implements FrontEnd {
  readonly name = 'native' as const;
  readonly #h: FrontHost;
  readonly #server: FrontServer;
  /** Inference requests by the server's id, until they end (abort and drain notices). */
  /** Requests in flight by id (not a Map: src/id-table.ts says why). */
  readonly #live = new IdTable<NativeExchange>(256);
  /** Files being downloaded, by request id (rare: a Map, apart from the exchanges' table). */
  readonly #downloads = new Map<number, Download>();
  /** Field name (lower-case) -> index into wanted. */
  readonly #wantedAt = new Map<string, number>();
  /** headerBlock() Buffer -> the same bytes as a latin1 head string with ': ' appended. */
  readonly #blocks = new WeakMap<Buffer, string>();
  readonly #responses: Map<string, number>;
  #metricsRegistered = false;

  constructor(host: FrontHost) {
    this.#h = host;
    const server = host.config.server ?? SERVER_DEFAULTS;
    const wanted = [...FIXED_WANTED, host.sessionHeaderName === '' ? 'x-switchyard-no-session-header' : host.sessionHeaderName, ...host.headerNames];
    wanted.forEach((n, i) => {
      if (!this.#wantedAt.has(n)) this.#wantedAt.set(n, i);
    });
    this.#responses = new Map(KIND_PATHS.map((p, k) => [p, k]));
    if (host.responses !== null) this.#responses.set('/v1/responses', KIND_RESPONSES);
    const limits = host.limits;
    const bodies = host.director.bodies;
    this.#server = new FrontServer(
      (r) => this.#onRequest(r),
      (id) => {
        const x = this.#live.get(id);
        if (x !== undefined) x.onClientAbort();
        else this.#downloads.get(id)?.abort();
      },
      {
        maxHead: server.maxHeaderBytes,
        maxLines: server.maxHeaderLines,
        maxBody: limits.maxBodyBytes,
        maxFileBody: Math.max(limits.maxBodyBytes, host.config.batch?.maxFileBytes ?? 0),
        headMs: server.headerTimeoutMs,
        bodyMs: limits.requestBodyTimeoutMs,
        idleMs: server.idleTimeoutMs,
        maxConnections: server.maxConnections,
        wanted,
        onDrain: (id) => {
          const x = this.#live.get(id);
          if (x !== undefined) x.onDrained();
          else this.#downloads.get(id)?.drain();
        },
        // an answer the front end gave itself (400, 408, 413, …): counted as the uWS front end counts its own
        // (status and outcome; its duration is not known here, so it is left out of the histogram)
        onReject: (status) => {
          host.metrics.countRequest('', -1, status);
          host.metrics.countOutcome('', statusOutcome(status), '', -1, -1);
        },
        // bodies the director scans on the loop come through the transfer buffer into its reused buffers
        transferBody: Math.min(limits.maxBodyBytes, BodyPool.maxBytes),
        takeBody: (n) => bodies.take(n),
      },
    );
  }

  get server(): FrontServer {
    return this.#server;
  }

  listen(host: string, port: number): Promise<number> {
    try {
      const p = this.#server.listen(host, port);
      this.#registerMetrics();
      return Promise.resolve(p);
    } catch (err) {
      return Promise.reject(new Error(`cannot listen on ${host}:${port} (${(err as Error).message})`));
    }
  }

  pauseAccepting(): void {
    this.#server.setAccepting(false);
  }

  resumeAccepting(): boolean {
    if (this.#h.draining) return true;
    this.#server.setAccepting(true);
    return true;
  }

  stopListening(): void {
    this.#server.unlisten();
  }

  close(): void {
    this.#server.close();
  }

  #registerMetrics(): void {
    if (this.#metricsRegistered) return;
    this.#metricsRegistered = true;
    const server = this.#server;
    const r = [this.#h.metrics.registry];
    new Gauge({
      name: 'switchyard_client_connections',
      help: 'Open client connections (native front end).',
      registers: r,
      collect() {
        this.set(server.stats().connections);
      },
    });
    new Counter({
      name: 'switchyard_client_connections_refused_total',
      help: 'Client connections closed at accept: over server.maxConnections, or while not accepting near the open-file limit (native front end).',
      registers: r,
      collect() {
        this.reset();
        this.inc(server.stats().refused);
      },
    });
  }

  /** The value of a request field: a wanted one from the server's list, another by a scan of the head (rare: the gate's identity). */
  header(r: FrontRequest, name: string): string {
    const lower = name.toLowerCase();
    const at = this.#wantedAt.get(lower);
    if (at !== undefined) return r.wanted[at] ?? '';
    const o = r.offsets;
    const hb = r.head;
    let out = '';
    for (let k = 0; k < o.length; k += 4) {
      if (o[k + 1] !== lower.length) continue;
      if (hb.toString('latin1', o[k]!, o[k]! + o[k + 1]!).toLowerCase() !== lower) continue;
      const v = hb.toString('latin1', o[k + 2]!, o[k + 2]! + o[k + 3]!);
      out = out === '' ? v : `${out},${v}`;
    }
    return out;
  }

  /** headerBlock(ep, ct) as a head string ending in 'x-request-id: ' (cached with the block). */
  headLines(ep: Endpoint, contentType: string): string {
    const b = this.#h.headerBlock(ep, contentType);
    let s = this.#blocks.get(b);
    if (s === undefined) {
      s = `${b.toString('latin1')}: `;
      this.#blocks.set(b, s);
    }
    return s;
  }

  ended(x: NativeExchange): void {
    this.#live.delete(x.id);
  }

  #onRequest(r: FrontRequest): void {
    try {
      this.#route(r);
    } catch (err) {
      this.#h.log.error({ err }, 'native front end: a request handler threw');
      this.#json(r.id, 500, errorBody(500, `internal error: ${(err as Error)?.message ?? String(err)}`));
    }
  }

  #route(r: FrontRequest): void {
    let path = r.target;
    if (path.charCodeAt(0) !== 47 /* / */) {
      // absolute-form (RFC 9112 3.2.2): the path after the authority
      const scheme = path.indexOf('://');
      const slash = scheme < 0 ? -1 : path.indexOf('/', scheme + 3);
      path = slash < 0 ? (scheme < 0 ? path : '/') : path.slice(slash);
    }
    const q = path.indexOf('?');
    const query = q < 0 ? '' : path.slice(q + 1);
    if (q >= 0) path = path.slice(0, q);
    const method = r.method;
    if (method === 'POST') {
      const kind = this.#responses.get(path);
      if (kind !== undefined) return this.#inference(r, kind);
    }
    if (method === 'GET' || method === 'HEAD') {
      const head = method === 'HEAD';
      switch (path) {
        case '/healthz':
          return this.#json(r.id, 200, head ? '' : '{"status":"ok"}');
        case '/readyz': {
          const [status, body] = this.#h.readiness();
          return this.#json(r.id, status, head ? '' : body);
        }
        case '/v1/models': {
          const caller = this.#h.callerOf((n) => this.header(r, n));
          if (isRefusal(caller)) return this.#unauthorized(r, caller);
          return this.#json(r.id, 200, head ? '' : this.#h.modelsBodyFor(caller));
        }
        case '/metrics':
          return this.#metrics(r.id, head);
      }
    }
    if (path.startsWith('/v1/responses/') && this.#h.responses !== null) {
      const rest = path.slice('/v1/responses/'.length);
      const slash = rest.indexOf('/');
      const id = slash < 0 ? rest : rest.slice(0, slash);
      const tail = slash < 0 ? '' : rest.slice(slash);
      let op: ResponsesOp | null = null;
      if (id !== '' && tail === '' && method === 'GET') op = retrieve;
      else if (id !== '' && tail === '' && method === 'DELETE') op = remove;
      else if (id !== '' && tail === '/input_items' && method === 'GET') op = inputItems;
      if (op !== null) {
        const caller = this.#h.callerOf((n) => this.header(r, n));
        if (isRefusal(caller)) return this.#unauthorized(r, caller);
        return runResponsesOp(this.#h, op, id, query, caller.tenant, (status, body) => this.#json(r.id, status, body));
      }
    }
    if (path.startsWith('/v1/files') || path.startsWith('/v1/batches')) {
      const b = batchRoute(method, path);
      if (b !== null) return this.#batch(r, b.op, b.withBody, b.param, query);
    }
    if (method === 'OPTIONS') return this.#options(r, path);
    this.#unrouted(r, method, path);
  }

  /** OPTIONS * and OPTIONS / (HAProxy's bare `option httpchk`): 204 with the server's methods; a known path: its own. */
  #options(r: FrontRequest, path: string): void {
    const known = KNOWN_PATHS[path];
    const allow = path === '*' || path === '/' ? 'GET, HEAD, POST, DELETE, OPTIONS' : known === 'GET' ? 'GET, HEAD, OPTIONS' : known !== undefined ? `${known}, OPTIONS` : '';
    if (allow === '') return this.#unrouted(r, 'OPTIONS', path);
    this.#h.metrics.countRequest('', -1, 204);
    this.#server.respond(r.id, 204, `allow: ${allow}\r\n`, null, true, this.#h.draining);
  }

  #unrouted(r: FrontRequest, method: string, path: string): void {
    let allowed: string | undefined = path === '/v1/responses' && this.#h.responses === null ? undefined : KNOWN_PATHS[path];
    if (allowed === undefined && path.startsWith('/v1/responses/') && this.#h.responses !== null) allowed = 'GET, DELETE';
    if (allowed === undefined && isBatchPath(path)) allowed = 'GET, POST, DELETE';
    const status = method === 'HEAD' && allowed === 'GET' ? 200 : allowed !== undefined ? 405 : 404;
    this.#h.metrics.countRequest('', -1, status);
    const lines = status === 405 ? `${JSON_LINES}allow: ${allowed}\r\n` : JSON_LINES;
    // a HEAD answer has headers only
    const body = method === 'HEAD' ? null : errorBody(status, status === 405 ? `method ${method} is not allowed on ${path} (use ${allowed})` : `no route for ${method} ${path}`);
    this.#server.respond(r.id, status, lines, body, true, this.#h.draining);
  }

  /** 401 invalid_api_key for a request authentication refused (src/identity.ts). */
  #unauthorized(r: FrontRequest, refusal: Refusal): void {
    this.#h.metrics.countRequest('', -1, 401);
    this.#json(r.id, 401, errorBody(401, refusal.refused));
  }

  #json(id: number, status: number, body: string, contentType = JSON_LINES): void {
    this.#server.respond(id, status, contentType, body === '' ? null : body, true, this.#h.draining);
  }

  #metrics(id: number, head: boolean): void {
    const h = this.#h;
    const ct = `content-type: ${h.metrics.registry.contentType}\r\n`;
    // prom-client renders asynchronously: an answer for a request that is gone is a no-op (GONE)
    h.metrics.text().then(
      (body) => this.#json(id, 200, head ? '' : body, ct),
      (err: unknown) => {
        h.log.error({ err }, '/metrics: rendering failed');
        this.#json(id, 500, errorBody(500, 'metrics rendering failed'));
      },
    );
  }

  #batch(r: FrontRequest, op: Parameters<typeof runBatchOp>[2], withBody: boolean, param: string, query: string): void {
    const h = this.#h;
    const id = r.id;
    const write = (status: number, body: string | Buffer, contentType = 'application/json') => {
      h.metrics.countRequest('', -1, status);
      this.#server.respond(id, status, `content-type: ${fieldValue(contentType)}\r\n`, body, true, h.draining);
    };
    // the caller's tenant scopes every file and batch (another tenant's objects answer 404)
    const caller = h.callerOf((n) => this.header(r, n));
    if (isRefusal(caller)) return this.#unauthorized(r, caller);
    const tenant = caller.tenant;
    const api = h.batchApi;
    if (api === null) return write(404, BATCH_NOT_CONFIGURED());
    const body = withBody ? r.body : null;
    if (body !== null && body.length > api.maxFileBytes) {
      return write(
        413,
        errorBody(413, `request body of ${body.length} bytes exceeds the limit of ${api.maxFileBytes} bytes (batch.maxFileBytes)`, 'file', 'file_too_large'),
      );
    }
    runBatchOp(h, api, op, param, query, r.wanted[W_CONTENT_TYPE] ?? '', body, tenant, write, (status, type, pieces) => void this.#download(id, status, type, pieces));
  }

  /** A download: chunked, a piece at a time, the next one read once the socket took the last (FULL, then onDrain). */
  async #download(id: number, status: number, type: string, pieces: FileStream): Promise<void> {
    const h = this.#h;
    h.metrics.countRequest('', -1, status);
    const d = new Download(id);
    this.#downloads.set(id, d);
    try {
      let r = this.#server.respond(id, status, `content-type: ${fieldValue(type)}\r\n`, null, false, h.draining);
      for (;;) {
        if (r === GONE || d.aborted) return;
        // FULL: wait for onDrain (also sent when a slot that waited behind a pipelined answer goes out whole)
        if (r === FULL && !(await d.drained())) return;
        const piece = await pieces.next();
        if (d.aborted) return;
        if (piece === null) {
          this.#server.write(id, null, true);
          return;
        }
        r = this.#server.write(id, piece, false);
      }
    } catch (err) {
      // the data went away mid-download: the answer is cut (its chunked framing never ends), never passed off as whole
      h.log.warn({ err: (err as Error).message }, 'batch api: a download was cut');
      if (!d.aborted) this.#server.abort(id);
    } finally {
      this.#downloads.delete(id);
    }
  }

  #inference(r: FrontRequest, kind: number): void {
    const h = this.#h;
    const w = r.wanted;
    let requestId = w[W_REQUEST_ID] ?? '';
    if (requestId === '' || requestId.length > 256) requestId = h.newRequestId();
    const caller = h.callerOf((n) => (n === 'authorization' ? (w[W_AUTHORIZATION] ?? '') : this.header(r, n)));
    if (isRefusal(caller)) return this.#unauthorized(r, caller);
    const x = new NativeExchange(this, h, this.#server, r.id, kind, requestId, caller);
    const names = h.headerNames;
    let hd: Record<string, string> | null = null;
    if (names.length > 0) {
      hd = {};
      for (let i = 0; i < names.length; i++) hd[names[i]!] = w[W_FIRST_GATE + i] ?? '';
    }
    if (h.sessionHeaderName !== '' && kind < KIND_EMBEDDINGS) x.sessionHeader = w[W_SESSION] ?? '';
    const tp = w[W_TRACEPARENT] ?? '';
    const ts = w[W_TRACESTATE] ?? '';
    const bg = w[W_BAGGAGE] ?? '';
    if (tp !== '' || ts !== '' || bg !== '') {
      hd ??= {};
      if (tp !== '') hd.traceparent = tp;
      if (ts !== '') hd.tracestate = ts;
      if (bg !== '') hd.baggage = bg;
    }
    if (hd !== null) x.headers = hd;
    h.requestBegan(x);
    this.#live.set(x);
    // an answer given inside begin() (a bad body, no endpoint) is reported once begin() returns: the metrics see the flight's model
    x.beginning = true;
    try {
      x.flight = kind === KIND_RESPONSES ? h.responses!.begin(x, caller, requestId, x.headers, r.body) : h.director.begin(x, kind, requestId, caller, x.headers, r.body, '', x.sessionHeader);
    } finally {
      x.beginning = false;
    }
    if (x.endedStatus >= 0) h.requestEnded(x, x.endedStatus);
  }
}

/** One inference request on the native front end: the director's (or a Responses turn's) ClientPort. */
export class NativeExchange implements ClientPort, InFlightRequest {
  readonly id: number;
  readonly kind: number;
  readonly requestId: string;
  /** Who sent the request (src/identity.ts). */
  readonly caller: Caller;
  headers: Readonly<Record<string, string>> = EMPTY;
  sessionHeader = '';
  flight: ExchangeFlight | null = null;
  /** Position in the router's in-flight list (src/server/drain.ts); -1 otherwise. */
  activeSlot = -1;
  /** How the request ended (src/metrics/outcomes.ts; -1 until decided) and a rejection's reason. */
  outcome = -1;
  rejectReason = '';
  /** performance.now() when the request arrived, and when its answer's first bytes went out (0: not yet). */
  readonly startedAt = performance.now();
  firstByteAt = 0;
  /** Inside begin(): done() is reported after it returns (`endedStatus`, -1: not ended). */
  beginning = false;
  endedStatus = -1;
  readonly #fe: NativeFrontEnd;
  readonly #h: FrontHost;
  readonly #server: FrontServer;
  #status = 200;
  #contentType = '';
  #endpoint: Endpoint | undefined;
  #started = false;
  #aborted = false;
  #done = false;
  #paused = false;

  /** The request's route. */
  get path(): string {
    return KIND_PATHS[this.kind] ?? '/v1/responses';
  }

  /** The request's tenant ('' = the anonymous scope): its caller's. */
  get tenant(): string {
    return this.caller.tenant;
  }

  constructor(fe: NativeFrontEnd, h: FrontHost, server: FrontServer, id: number, kind: number, requestId: string, caller: Caller) {
    this.#fe = fe;
    this.#h = h;
    this.#server = server;
    this.id = id;
    this.kind = kind;
    this.requestId = requestId;
    this.caller = caller;
  }

  /** The server saw the client leave (or the connection was cut). */
  onClientAbort(): void {
    if (this.#aborted) return;
    this.#aborted = true;
    if (this.flight !== null && !this.#done) {
      this.flight.clientAborted();
      return;
    }
    if (!this.#done) {
      this.outcome = OUTCOME_CANCELLED;
      this.#h.metrics.countRequest('', -1, 499);
      this.done(499);
    }
  }

  /**
   * A drain's grace is over: a stream whose head went out ends with `sseEvent`
   * (a chunked answer that is not SSE is cut), an answer not begun is a 503;
   * the director's side is aborted with status 503.
   */
  cutForShutdown(sseEvent: string, message: string): void {
    if (this.#done || this.#aborted) return;
    this.outcome = OUTCOME_SHUTDOWN;
    if (this.#started) {
      if (this.#contentType.startsWith('text/event-stream')) this.#send(this.flight?.shutdownEvents?.(SHUTDOWN_CODE, message) ?? sseEvent, true);
      else this.#server.abort(this.id);
    } else this.error(503, message, null, this.#endpoint, null, SHUTDOWN_CODE);
    this.#aborted = true; // the flight's later writes are dropped
    if (this.flight !== null) this.flight.clientAborted(503);
    else {
      this.#h.metrics.countRequest('', -1, 503);
      this.done(503);
    }
  }

  /** The socket took the bytes that were waiting: the upstream may be read again. */
  onDrained(): void {
    if (!this.#paused) return;
    this.#paused = false;
    this.flight?.resume();
  }

  head(status: number, contentType: string, endpoint: Endpoint): void {
    this.#status = status;
    this.#contentType = contentType;
    this.#endpoint = endpoint;
  }

  #lines(): string {
    let s = this.#fe.headLines(this.#endpoint!, this.#contentType) + this.requestId + '\r\n';
    const pf = this.flight?.prefillEndpoint;
    if (pf) s += `x-switchyard-prefill-endpoint: ${Buffer.from(pf.name).toString('latin1')}\r\n`;
    const rl = this.#h.rateHeaders(this.caller);
    if (rl !== '') s += rl;
    return s;
  }

  #send(b: Buffer | string, end: boolean): void {
    // a string goes over as it is (the server writes its UTF-8): no Buffer per chunk
    let r: number;
    if (!this.#started) {
      this.#started = true;
      this.firstByteAt = performance.now();
      // draining: the connection closes after this answer (a stream says so in its head)
      r = this.#server.respond(this.id, this.#status, this.#lines(), b, end, this.#h.draining);
    } else r = this.#server.write(this.id, b, end);
    if (r === FULL && !end && !this.#paused) {
      // the client is slower than the engine: stop reading upstream until the socket drains
      this.#paused = true;
      this.#h.metrics.pauses++;
      this.flight?.pause();
    } else if (r === GONE && !this.#aborted) this.onClientAbort();
  }

  write(chunk: Buffer | string): void {
    if (this.#aborted) return;
    this.#send(chunk, false);
  }

  end(chunk: Buffer | string): void {
    if (this.#aborted) return;
    this.#send(chunk, true);
  }

  fail(sseEvent: string | null): void {
    if (this.outcome < 0) this.outcome = OUTCOME_MID_STREAM;
    if (this.#aborted) return;
    if (sseEvent !== null) this.#send(sseEvent, true);
    else this.#server.abort(this.id); // cut: the client sees the stream end without its last chunk
  }

  error(status: number, message: string, param: string | null, ep: Endpoint | undefined, rejection: Rejected | null, code?: string): void {
    if (this.outcome < 0) {
      this.outcome = errorOutcome(status, message, ep !== undefined, rejection !== null);
      if (rejection !== null) this.rejectReason = rejection.reason ?? '';
    }
    if (this.#aborted) return;
    let s = `${JSON_LINES}x-request-id: ${this.requestId}\r\n`;
    if (ep) s += `x-switchyard-endpoint: ${Buffer.from(ep.name).toString('latin1')}\r\n`;
    const pf = this.flight?.prefillEndpoint;
    if (pf) s += `x-switchyard-prefill-endpoint: ${Buffer.from(pf.name).toString('latin1')}\r\n`;
    if (rejection !== null) {
      if (rejection.reason) s += `x-switchyard-dropped-reason: ${fieldValue(rejection.reason)}\r\n`;
      const ra = rejection.retryAfterSeconds ?? 0;
      if (ra > 0) s += `retry-after: ${Math.ceil(ra)}\r\n`;
    }
    s += this.#h.rateHeaders(this.caller);
    this.#started = true;
    this.#server.respond(this.id, status, s, errorBody(status, message, param, code, rejection?.errorType), true, this.#h.draining);
  }

  done(status: number): void {
    if (this.#done) return;
    this.#done = true;
    if (this.outcome < 0) this.outcome = statusOutcome(status);
    this.#fe.ended(this);
    if (this.beginning) this.endedStatus = status;
    else this.#h.requestEnded(this, status);
  }
}

/** A download in progress on the native front end: told when its socket drains or its client leaves. */
class Download {
  readonly id: number;
  aborted = false;
  #wake: ((go: boolean) => void) | null = null;

  constructor(id: number) {
    this.id = id;
  }

  /** Resolves true when the socket took the bytes waiting, false when the client left. */
  drained(): Promise<boolean> {
    if (this.aborted) return Promise.resolve(false);
    return new Promise((resolve) => {
      this.#wake = resolve;
    });
  }

  drain(): void {
    const w = this.#wake;
    this.#wake = null;
    w?.(true);
  }

  abort(): void {
    this.aborted = true;
    const w = this.#wake;
    this.#wake = null;
    w?.(false);
  }
}
