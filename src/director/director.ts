// The director: one request's orchestration, from a complete body to the last
// byte relayed. parse → admit → pick → dispatch → retry → release, over the
// admission contract (src/admission.ts), the scheduler and an upstream client.
// It knows nothing of the transport: a ClientPort (the uWS server today; an
// Envoy ext_proc stream later) carries its answers to the client.
//
// One Flight per request is at once the scheduler's Decision, the upstream
// sink, the gate's RequestInfo and its abort signal, so a request costs this
// object plus its transport's.
import { performance } from 'node:perf_hooks';
import type { Logger } from 'pino';
import type { AbortLike, Admission, AdmissionGate, Rejected, RequestInfo } from '../admission.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import { errorBody, normalizeErrorBody } from '../proxy/error-shape.js';
import { SseErrorRewriter } from '../proxy/sse-errors.js';
import type { UpstreamCall, UpstreamClient, UpstreamSink } from '../proxy/upstream.js';
import type { Decision, Outcome, Scheduler } from '../scheduler/scheduler.js';
import type { SchedRequest } from '../scheduler/types.js';
import { Piscina } from 'piscina';
import { MAX_JSON_DEPTH, parseRequestBody, renderPrompt } from './body.js';
import { KIND_PATHS } from './kinds.js';
import type { ParseReply, ParseTask } from './parse-worker.js';
import { PromptWriter } from './prompt.js';

export { KIND_CHAT, KIND_COMPLETION, KIND_PATHS } from './kinds.js';

const EMPTY: Readonly<Record<string, string>> = Object.freeze({});
const SSE_DATA = 'data: ';
const SSE_DONE = '\n\ndata: [DONE]\n\n';
/** Largest upstream error body the router buffers to rewrite into the current shape. */
const MAX_ERROR_BODY = 65536;
/** Per-request latency objectives (llm-d's names), read when a latency plugin is configured. */
export const SLO_HEADERS = ['x-slo-ttft-ms', 'x-slo-tpot-ms'] as const;
/** An SSE event's start: counted in streamed chunks to time output tokens. */
const SSE_EVENT = Buffer.from('data:');

/**
 * What the director needs of a transport to answer one client. Calls come in
 * this order: head() (possibly again, before any write), write()*, then end()
 * or fail(); or error() alone; then done() once. Writes after the client left
 * are not made.
 */
export interface ClientPort {
  /** The answer's status, content type and serving endpoint; `contentLength` of the body, -1 when streamed. Written with the first body bytes. */
  head(status: number, contentType: string, endpoint: Endpoint, contentLength: number): void;
  /** A body chunk; copy it to keep it (the upstream client may reuse its memory). When the client is slower than the engine, the transport calls flight.pause() and later flight.resume(). */
  write(chunk: Buffer | string): void;
  /** The last body bytes (maybe empty): the answer is complete. */
  end(chunk: Buffer | string): void;
  /** The engine failed after the head went out: `sseEvent` is an error event to end a stream with; null: cut the connection. */
  fail(sseEvent: string | null): void;
  /** An error answer instead of the engine's: status, OpenAI error body, and for a gate's rejection its reason and Retry-After. */
  error(status: number, message: string, param: string | null, endpoint: Endpoint | undefined, rejection: Rejected | null): void;
  /** The request is over, whichever way (after the last write, or when the client left); `status` as counted. */
  done(status: number): void;
}

/** The counters the director keeps (the router's metrics, read at scrape time). */
export interface DirectorMetrics {
  decision: { observe(seconds: number): void };
  ttft: { observe(seconds: number): void }[];
  rejected: Map<string, number>;
  retries: number;
  promptBlocks: number;
  matchedBlocks: number;
  countRequest(model: string, endpointId: number, status: number): void;
}

export interface DirectorOptions {
  scheduler: Scheduler;
  upstream: UpstreamClient;
  gate: AdmissionGate;
  metrics: DirectorMetrics;
  log: Logger;
  /** Attempts after the first one, on another endpoint, before the first byte reaches the client. */
  maxRetries: number;
  /** Bodies larger than this are parsed in a worker thread, off the event loop (default 256 KiB). */
  parseOffloadBytes?: number;
  /** Worker threads for that (default 2). */
  parseWorkers?: number;
  /** Deepest nesting of arrays/objects in a body (default 128). */
  maxJsonDepth?: number;
}

/** Heap a parse worker may use; a body that needs more (millions of tiny objects) is refused, not parsed. */
const PARSE_WORKER_HEAP_MB = 512;

export class Director {
  readonly scheduler: Scheduler;
  readonly upstream: UpstreamClient;
  readonly gate: AdmissionGate;
  readonly metrics: DirectorMetrics;
  readonly log: Logger;
  readonly maxRetries: number;
  /** The prompt bytes of the request being scheduled: one buffer reused by every request (a pick is synchronous). */
  readonly prompt = new PromptWriter();
  readonly schedRequest: SchedRequest = { model: '', prompt: undefined, sloTtftMs: 0, sloTpotMs: 0, band: '' };
  readonly parseOffloadBytes: number;
  readonly maxJsonDepth: number;
  readonly #parseWorkers: number;
  #pool: Piscina<ParseTask, ParseReply> | null = null;
  /** Bodies parsed in a worker since start. */
  offloadedParses = 0;

  constructor(o: DirectorOptions) {
    this.scheduler = o.scheduler;
    this.upstream = o.upstream;
    this.gate = o.gate;
    this.metrics = o.metrics;
    this.log = o.log;
    this.maxRetries = o.maxRetries;
    this.parseOffloadBytes = o.parseOffloadBytes ?? 256 * 1024;
    this.#parseWorkers = Math.max(1, o.parseWorkers ?? 2);
    this.maxJsonDepth = o.maxJsonDepth ?? MAX_JSON_DEPTH;
  }

  /** Parses a large body in the worker pool (created on first use); the answer goes to flight.parsed(). */
  parseOffLoop(f: Flight, raw: Buffer): void {
    this.#pool ??= new Piscina<ParseTask, ParseReply>({
      filename: new URL('./parse-worker.js', import.meta.url).href,
      minThreads: 0,
      maxThreads: this.#parseWorkers,
      idleTimeout: 30_000,
      resourceLimits: { maxOldGenerationSizeMb: PARSE_WORKER_HEAP_MB },
    });
    this.offloadedParses++;
    // the worker gets a copy: the flight keeps the client's bytes to send upstream
    this.#pool.run({ raw, kind: f.kind, maxDepth: this.maxJsonDepth }).then(
      (r) => f.parsed(r),
      (err: Error) =>
        f.parsed({
          ok: false,
          status: 413,
          message: `the request body could not be parsed within the router's limits (${err.message})`,
          param: null,
        }),
    );
  }

  /** Stops the parse workers (in-flight parses fail). */
  async close(): Promise<void> {
    const p = this.#pool;
    this.#pool = null;
    await p?.destroy();
  }

  /**
   * Takes over a request whose body has arrived: `kind` KIND_CHAT or
   * KIND_COMPLETION, `headers` those named by the gate's headerNames,
   * `sessionKey` the conversation when the caller knows it (the Responses
   * API: its chain). Never throws: every failure becomes an answer through `port`.
   */
  begin(
    port: ClientPort,
    kind: number,
    requestId: string,
    authorization: string,
    headers: Readonly<Record<string, string>>,
    body: Buffer,
    sessionKey = '',
  ): Flight {
    const f = new Flight(this, port, kind, requestId, authorization, headers);
    f.sessionKey = sessionKey;
    try {
      f.start(body);
    } catch (err) {
      f.internalError(err);
    }
    return f;
  }
}

export class Flight implements Decision, UpstreamSink, RequestInfo, AbortLike {
  // Decision
  endpoint!: Endpoint;
  seq = 0;
  promptBlocks = 0;
  matchedBlocks = 0;
  // Decision's LatencyNote (written by latency plugins; numbers, no allocation)
  latPending = 0;
  latWork = 0;
  latRunning = 0;
  latPredTtftMs = 0;
  latPredTpotMs = 0;
  latSloTtftMs = 0;
  latSloTpotMs = 0;
  latBand = -1;
  // AbortLike
  aborted = false;
  onabort: (() => void) | null = null;
  // RequestInfo
  readonly requestId: string;
  model = '';
  readonly path: string;
  body: Readonly<Record<string, unknown>> = EMPTY;
  readonly headers: Readonly<Record<string, string>>;
  bodyBytes = 0;
  promptBytes = 0;
  sessionKey = '';
  continuation = false;

  readonly director: Director;
  readonly port: ClientPort;
  readonly kind: number;
  readonly authorization: string;
  #raw: Buffer | null = null;
  /** Prompt bytes copied out of the shared writer when admission is asynchronous. */
  #promptCopy: Uint8Array | null = null;
  #ticket: unknown = null;
  #admitted = false;
  #picked = false;
  #tried: Endpoint[] | null = null;
  #attempts = 0;
  #call: UpstreamCall | null = null;
  #dispatchedAt = 0;
  #status = 0;
  #contentType = '';
  /** The answer is an SSE stream with status 200: flat-shape error events in it are rewritten. */
  #sse: SseErrorRewriter | null = null;
  #isSse = false;
  #upstreamLength = -1;
  /** Bytes (or the head) went to the client: no retry from here on. */
  #started = false;
  #clientEnded = false;
  #done = false;
  #errorMessage = '';
  /** An upstream error answer (status >= 400, not SSE) being buffered to normalise its shape. */
  #errorBody: Buffer[] | null = null;
  #errorBytes = 0;
  /** The request's x-slo-* objectives, ms (0: none). */
  #sloTtft = 0;
  #sloTpot = 0;
  /** Timing a streamed answer for the scheduler's latency plugins: first and last chunk, SSE events after the first chunk. */
  #timing = false;
  #firstAt = 0;
  #lastAt = 0;
  #events = 0;

  constructor(director: Director, port: ClientPort, kind: number, requestId: string, authorization: string, headers: Readonly<Record<string, string>>) {
    this.director = director;
    this.port = port;
    this.kind = kind;
    this.path = KIND_PATHS[kind];
    this.requestId = requestId;
    this.authorization = authorization;
    this.headers = headers;
  }

  /** A bug or a throwing plugin/gate: answer 500 and log, never crash the process. */
  internalError(err: unknown): void {
    this.director.log.error({ err, id: this.requestId }, 'internal error while handling a request');
    this.#reply(500, `internal error: ${(err as Error)?.message ?? String(err)}`, null, null);
  }

  // ---- parse and admit ----------------------------------------------------------

  start(raw: Buffer): void {
    this.#raw = raw;
    this.bodyBytes = raw.length;
    const d = this.director;
    if (raw.length > d.parseOffloadBytes) {
      d.parseOffLoop(this, raw);
      return;
    }
    const r = parseRequestBody(raw, this.kind, d.prompt, d.maxJsonDepth);
    if (!r.ok) {
      this.#reply(r.status, r.message, r.param, null);
      return;
    }
    this.body = r.body;
    this.model = r.model;
    this.promptBytes = d.prompt.length;
    this.#admit();
  }

  /** The worker's answer for a body parsed off the event loop. */
  parsed(r: ParseReply): void {
    if (this.aborted || this.#done) return;
    try {
      if (!r.ok) {
        this.#reply(r.status, r.message, r.param, null);
        return;
      }
      this.body = r.fields;
      this.model = r.model;
      this.#promptCopy = r.prompt; // the body's other fields stay in the worker: never rendered again here
      this.promptBytes = r.prompt.length;
      this.#admit();
    } catch (err) {
      this.internalError(err);
    }
  }

  #renderPrompt(): void {
    renderPrompt(this.director.prompt, this.kind, this.body);
  }

  #admit(): void {
    const d = this.director;
    const model = this.model;
    if (!d.scheduler.hasModel(model)) {
      this.#reply(404, `The model \`${model}\` does not exist.`, 'model', null);
      return;
    }
    if (d.scheduler.latency && !this.#readSlo()) return;
    const a = d.gate.admit(this, this);
    if (typeof (a as Promise<Admission>).then === 'function') {
      this.#promptCopy ??= Uint8Array.prototype.slice.call(d.prompt.view());
      (a as Promise<Admission>).then(
        (r) => {
          try {
            this.#onAdmission(r);
          } catch (err) {
            this.internalError(err);
          }
        },
        (err: Error) => {
          try {
            this.#onAdmission({ admitted: false, status: 503, message: `admission failed: ${err.message}`, reason: 'gate-error' });
          } catch (e) {
            this.internalError(e);
          }
        },
      );
    } else this.#onAdmission(a as Admission);
  }

  #onAdmission(a: Admission): void {
    if (a.admitted) {
      if (this.aborted || this.#done) {
        this.director.gate.release(a.ticket, 'aborted');
        return;
      }
      this.#admitted = true;
      this.#ticket = a.ticket;
      this.#dispatch();
      return;
    }
    if (this.aborted || this.#done) return;
    const rejected = this.director.metrics.rejected;
    rejected.set(a.reason, (rejected.get(a.reason) ?? 0) + 1);
    this.#reply(a.status, a.message, null, a);
  }

  /** Reads x-slo-ttft-ms / x-slo-tpot-ms; false after answering 400 for a value that is not a positive number. */
  #readSlo(): boolean {
    const h = this.headers;
    for (let i = 0; i < SLO_HEADERS.length; i++) {
      const name = SLO_HEADERS[i];
      const v = h[name];
      if (v === undefined || v === '') continue;
      const ms = Number(v);
      if (!(ms > 0) || !Number.isFinite(ms)) {
        this.#reply(400, `header ${name} must be a positive number of milliseconds (got ${JSON.stringify(v.slice(0, 64))})`, name, null);
        return false;
      }
      if (i === 0) this.#sloTtft = ms;
      else this.#sloTpot = ms;
    }
    return true;
  }

  // ---- pick and dispatch ------------------------------------------------------------

  /** The prompt for the scheduler: the shared writer's bytes (rendered again after a retry reused it), or the copy an async admission kept. */
  #schedRequest(rerender: boolean): SchedRequest {
    const d = this.director;
    const sreq = d.schedRequest;
    sreq.model = this.model;
    sreq.sessionKey = this.sessionKey;
    if (d.scheduler.latency) {
      sreq.sloTtftMs = this.#sloTtft;
      sreq.sloTpotMs = this.#sloTpot;
      sreq.band = this.#admitted ? (d.gate.bandName?.(this.#ticket) ?? '') : '';
    }
    if (this.#promptCopy !== null) sreq.prompt = this.#promptCopy;
    else {
      if (rerender) this.#renderPrompt();
      sreq.prompt = d.prompt.view();
    }
    return sreq;
  }

  #dispatch(): void {
    const d = this.director;
    const sreq = this.#schedRequest(this.#attempts > 0); // the first pick follows the render at once
    const t0 = performance.now();
    const picked = d.scheduler.pick(sreq, this.#tried, this, t0);
    const t1 = performance.now();
    sreq.prompt = undefined;
    d.metrics.decision.observe((t1 - t0) / 1000);
    if (picked === null) {
      if (this.#tried !== null) this.#reply(502, `all endpoints tried for model \`${this.model}\` failed: ${this.#errorMessage}`, null, null);
      else this.#reply(503, `no ready endpoint for model \`${this.model}\``, null, null);
      return;
    }
    this.#picked = true;
    d.metrics.promptBlocks += this.promptBlocks;
    d.metrics.matchedBlocks += this.matchedBlocks;
    this.#dispatchedAt = t1;
    const headers = this.authorization
      ? ['content-type', 'application/json', 'x-request-id', this.requestId, 'authorization', this.authorization]
      : ['content-type', 'application/json', 'x-request-id', this.requestId];
    const call = d.upstream.send(this.endpoint, { method: 'POST', path: this.path, headers, body: this.#raw }, this);
    // a client may fail the call synchronously (a closed pool): the nested retry or end already took over
    if (this.#call === null && !this.#done) this.#call = call;
  }

  #canRetry(): boolean {
    return !this.#started && !this.aborted && this.#attempts < this.director.maxRetries;
  }

  #retry(reason: string): void {
    this.#errorMessage = reason;
    // nothing of the failed attempt's answer (status, a buffered error body) carries over
    this.#status = 0;
    this.#errorBody = null;
    this.#call?.abort();
    this.#call = null;
    this.#release('failed');
    (this.#tried ??= []).push(this.endpoint);
    this.#attempts++;
    this.director.metrics.retries++;
    // runs inside upstream socket callbacks: a throwing plugin or gate must answer 500, not crash
    try {
      this.#dispatch();
    } catch (err) {
      this.internalError(err);
    }
  }

  /** Completes the scheduler's accounting for the current attempt (once). */
  #release(outcome: Outcome): void {
    if (!this.#picked) return;
    this.#picked = false;
    const scheduler = this.director.scheduler;
    if (outcome === 'failed' && (!this.#started || this.#status >= 500) && this.promptBlocks > this.matchedBlocks) {
      // cold path: the engine never took the prompt, so the prefix producer
      // forgets the blocks this pick recorded (it needs the prompt again)
      const sreq = this.#schedRequest(true);
      try {
        scheduler.complete(this, outcome, sreq);
      } finally {
        sreq.prompt = undefined;
      }
      return;
    }
    scheduler.complete(this, outcome);
  }

  // ---- upstream sink ------------------------------------------------------------------

  onUpstreamHeaders(status: number, contentType: string, contentLength: number): void {
    if (this.aborted) return;
    if (status >= 500 && this.#canRetry()) {
      this.#retry(`endpoint ${this.endpoint.name} answered HTTP ${status}`);
      return;
    }
    this.director.metrics.ttft[this.endpoint.id].observe((performance.now() - this.#dispatchedAt) / 1000);
    this.#status = status;
    this.#contentType = contentType === '' ? 'application/json' : contentType;
    this.#isSse = contentType.startsWith('text/event-stream');
    if (this.#isSse && status === 200) (this.#sse ??= new SseErrorRewriter());
    this.#upstreamLength = contentLength;
    this.#errorBytes = 0;
    this.#timing = status === 200 && this.#isSse && this.director.scheduler.latency;
    this.#firstAt = 0;
    this.#events = 0;
    this.#errorBody = status >= 400 && !this.#isSse && contentLength <= MAX_ERROR_BODY ? [] : null;
    this.port.head(status, this.#contentType, this.endpoint, contentLength);
  }

  onUpstreamData(chunk: Buffer): void {
    if (this.aborted || this.#clientEnded) return;
    if (this.#timing) this.#time(chunk);
    const eb = this.#errorBody;
    if (eb !== null) {
      this.#errorBytes += chunk.length;
      if (this.#errorBytes <= MAX_ERROR_BODY) {
        eb.push(Buffer.from(chunk)); // a copy: the client may reuse the chunk's memory
        return;
      }
      // too large to be an error object: relay what was held, then stream on
      this.#errorBody = null;
      for (const held of eb) this.#write(held);
    } else if (this.#sse !== null) {
      chunk = this.#sse.push(chunk);
      if (chunk.length === 0) return;
    }
    this.#write(chunk);
  }

  /** Times a streamed chunk: the first one is the first token; later ones count their SSE events (tokens). */
  #time(chunk: Buffer): void {
    const now = performance.now();
    if (this.#firstAt === 0) {
      this.#firstAt = now;
      this.director.scheduler.firstToken(this, now - this.#dispatchedAt);
      return;
    }
    this.#lastAt = now;
    let n = 0;
    for (let i = chunk.indexOf(SSE_EVENT); i >= 0; i = chunk.indexOf(SSE_EVENT, i + 5)) n++;
    this.#events += n;
  }

  #write(chunk: Buffer): void {
    this.#started = true;
    // the whole answer in one chunk: one end() with a content-length, not a chunked stream
    if (this.#upstreamLength === chunk.length && !this.#clientEnded) {
      this.#clientEnded = true;
      this.port.end(chunk);
    } else this.port.write(chunk);
  }

  onUpstreamEnd(): void {
    if (this.aborted) return;
    if (!this.#clientEnded) {
      const held = this.#sse?.flush() ?? null;
      if (held !== null) {
        this.#started = true;
        this.port.write(held);
      }
      let last: Buffer | string = '';
      const eb = this.#errorBody;
      if (eb !== null) {
        this.#errorBody = null;
        const raw = eb.length === 1 ? eb[0]! : Buffer.concat(eb);
        const fixed = normalizeErrorBody(raw.toString('utf8'), this.#status);
        if (fixed !== null) {
          last = fixed;
          this.port.head(this.#status, 'application/json', this.endpoint, -1);
        } else last = raw;
      }
      this.#started = true;
      this.#clientEnded = true;
      this.port.end(last);
    }
    // tokens after the first chunk: its events less the closing [DONE]
    if (this.#timing && this.#events > 1) this.director.scheduler.streamEnd(this, this.#events - 1, this.#lastAt - this.#firstAt);
    this.#finish(this.#status >= 500 ? 'failed' : 'ok', this.#status);
  }

  onUpstreamError(err: Error): void {
    if (this.aborted || this.#done) return;
    if (this.#canRetry()) {
      this.#retry(`endpoint ${this.endpoint.name}: ${err.message}`);
      return;
    }
    this.#release('failed');
    if (!this.#started) {
      this.#reply(502, `upstream endpoint ${this.endpoint.name} failed: ${err.message}`, null, null);
      return;
    }
    this.#errorMessage = err.message;
    if (!this.#clientEnded) {
      const held = this.#sse?.flush() ?? null;
      if (held !== null) this.port.write(held);
      this.#clientEnded = true;
      const msg = `upstream endpoint ${this.endpoint.name} failed mid-response: ${err.message}`;
      this.port.fail(this.#isSse ? SSE_DATA + errorBody(502, msg) + SSE_DONE : null);
    }
    this.#finish('failed', this.#status);
  }

  // ---- backpressure (called by the transport) ---------------------------------------

  /** The client is slower than the engine: stop reading upstream. */
  pause(): void {
    this.#call?.pause();
  }

  resume(): void {
    this.#call?.resume();
  }

  // ---- ends -----------------------------------------------------------------------------

  #finish(outcome: Outcome, status: number): void {
    if (this.#done) return;
    this.#done = true;
    // the body is no longer needed (no retry after this)
    this.#raw = null;
    this.#promptCopy = null;
    this.#release(outcome);
    const d = this.director;
    if (this.#admitted) {
      this.#admitted = false;
      d.gate.release(this.#ticket, outcome);
    }
    d.metrics.countRequest(this.model, this.endpoint ? this.endpoint.id : -1, status);
    this.port.done(status);
  }

  /** Answers with an OpenAI error instead of the engine's answer and releases everything. */
  #reply(status: number, message: string, param: string | null, rejection: Rejected | null): void {
    if (this.#done || this.aborted) return;
    this.#call?.abort();
    this.#call = null;
    const failed = status >= 500;
    this.#release(failed ? 'failed' : 'ok');
    this.#clientEnded = true;
    this.port.error(status, message, param, this.endpoint, rejection);
    this.#finish(failed ? 'failed' : 'ok', status);
  }

  /** The client went away (the transport saw it): abort upstream, release all accounting. */
  clientAborted(): void {
    if (this.aborted) return;
    this.aborted = true;
    this.#call?.abort();
    this.#call = null;
    if (!this.#done) {
      this.#done = true;
      this.#release('aborted');
      if (this.#admitted) {
        this.#admitted = false;
        this.director.gate.release(this.#ticket, 'aborted');
      }
      this.director.metrics.countRequest(this.model, this.endpoint ? this.endpoint.id : -1, 499);
      this.port.done(499);
    }
    const cb = this.onabort;
    this.onabort = null;
    cb?.();
  }
}
