// The director: one request's orchestration, from a complete body to the last
// byte relayed. parse → admit → pick → dispatch → retry → release, over the
// admission contract (src/admission.ts), the scheduler and an upstream client.
// It knows nothing of the transport: a ClientPort (the uWS server today; an
// Envoy ext_proc stream later) carries its answers to the client.
//
// One Flight per request is at once the scheduler's Decision, the upstream
// sink, the gate's RequestInfo and its abort signal, so a request costs this
// object plus its transport's. Its steps are layers of one class, each in its
// own file: flight-state.ts (every field) → flight-admit.ts (parse, admit) →
// flight-pick.ts (pick, dispatch, the P/D legs' hooks) → flight-retry.ts
// (retry, P/D re-pairing) → Flight here (the upstream sink's relay, the ends).
import { performance } from 'node:perf_hooks';
import type { Logger } from 'pino';
import type { AdmissionGate, Rejected } from '../admission.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import type { Caller } from '../identity.js';
import { SseErrorRewriter } from '../proxy/sse-errors.js';
import type { UpstreamClient, UpstreamSink } from '../proxy/upstream.js';
import type { Outcome, Scheduler } from '../scheduler/scheduler.js';
import type { SchedRequest } from '../scheduler/types.js';
import type { RequestTracer } from '../telemetry/tracing.js';
import { Piscina } from 'piscina';
import { MAX_JSON_DEPTH } from './body.js';
import { Kind } from './kinds.js';
import { SessionResolver } from '../sessions/resolve.js';
import type { SessionTable } from '../sessions/table.js';
import type { ParseReply, ParseTask } from './parse-worker.js';
import type { ClientPort, DecisionPortOf, DirectorMetrics, DirectorOptions } from './ports.js';
import { PromptWriter } from './prompt.js';
import { BodyScanner } from './body-scan.js';
import { BodyPool } from './body-pool.js';
import { countSseEvents, errorAnswer, MAX_ERROR_BODY, scanCompletionTokens, scanPromptTokens, streamFailedEvent } from './relay.js';
import type { TokenSource } from '../tokenize/source.js';
import type { Disaggregator, PdFlight } from './pd.js';
import type { FlightHost } from './flight-state.js';
import { RetryingFlight } from './flight-retry.js';
import { ModelRewriter } from './model-rewrites.js';
import { AdapterLoader } from '../endpoints/adapter-loader.js';
import { AdapterHold } from './adapter-hold.js';

export { Kind, KIND_CHAT, KIND_COMPLETION, KIND_EMBEDDINGS, KIND_PATHS, isPassthrough } from './kinds.js';
export { SLO_HEADERS } from './flight-state.js';

export type { ClientPort, DirectorMetrics, DirectorOptions } from './ports.js';
/** A transport that takes the decision rather than the bytes (see DecisionPortOf in ports.ts). */
export type DecisionPort = DecisionPortOf<Flight>;

/** Heap a parse worker may use; a body that needs more (millions of tiny objects) is refused, not parsed. */
const PARSE_WORKER_HEAP_MB = 512;
/** Bodies up to this many times parseOffloadBytes are scanned natively on the event loop. */
const SCAN_ON_LOOP_FACTOR = 16;

export class Director implements FlightHost {
  readonly scheduler: Scheduler;
  readonly upstream: UpstreamClient;
  readonly gate: AdmissionGate;
  readonly metrics: DirectorMetrics;
  readonly log: Logger;
  readonly maxRetries: number;
  readonly tracer: RequestTracer | null;
  /** The prefill leg's collaborator, or null (no disaggregation configured). */
  readonly pd: Disaggregator | null;
  /** The prompt bytes of the request being scheduled: one buffer reused by every request (a pick is synchronous). */
  readonly prompt = new PromptWriter();
  readonly schedRequest: SchedRequest = { model: '', prompt: undefined, sloTtftMs: 0, sloTpotMs: 0, band: '' };
  readonly parseOffloadBytes: number;
  readonly scanner: BodyScanner | null;
  readonly scanOnLoopBytes: number;
  readonly maxJsonDepth: number;
  /** The gate reads usage at release (AdmissionGate.wantsUsage): answers are scanned for `"completion_tokens":`. */
  readonly wantsUsage: boolean;
  readonly tokens: TokenSource | null;
  readonly #parseWorkers: number;
  /** Session pins and turn records (shared with the scheduler's session-affinity filter). */
  readonly sessions: SessionTable;
  /** Derives a session key from the configured sources when the caller gave none. */
  readonly resolver: SessionResolver;
  /** The model a passthrough request without `model` goes to: the router's only model ('' when it serves several). */
  readonly soleModel: string;
  /** Model rewrites (weighted targets, sticky per session). */
  readonly rewrites: ModelRewriter;
  /** Loads LoRA adapters on engines that lack them (pools with adapterLoading). */
  readonly adapterLoader: AdapterLoader;
  readonly bodies = new BodyPool();
  readonly returnsBodies: boolean;
  /** Holds adapter requests while every candidate's GPU adapter slots are taken (config adapterQueue). */
  readonly adapterHold: AdapterHold;
  #pool: Piscina<ParseTask, ParseReply> | null = null;
  /** Bodies parsed in a worker since start. */
  offloadedParses = 0;

  constructor(o: DirectorOptions) {
    this.scheduler = o.scheduler;
    this.upstream = o.upstream;
    this.gate = o.gate;
    this.wantsUsage = o.gate.wantsUsage === true || o.scanUsage === true;
    this.metrics = o.metrics;
    this.log = o.log;
    this.maxRetries = o.maxRetries;
    this.tracer = o.tracer ?? null;
    this.pd = o.pd ?? null;
    // P/D legs and undici may still hold a body when its flight ends: only the native client's bodies are reused
    this.returnsBodies = o.upstream.copiesBody === true && this.pd === null;
    this.parseOffloadBytes = o.parseOffloadBytes ?? 256 * 1024;
    this.scanner = o.bodyScan === 'javascript' ? null : new BodyScanner();
    // the scan reads ~1-2 GB/s where JSON.parse and the render read ~0.1 (bench/RESULTS.md, issue 37): the loop
    // scans bodies 16 times the size it would parse
    this.scanOnLoopBytes = this.parseOffloadBytes * SCAN_ON_LOOP_FACTOR;
    this.#parseWorkers = Math.max(1, o.parseWorkers ?? 2);
    this.maxJsonDepth = o.maxJsonDepth ?? MAX_JSON_DEPTH;
    this.sessions = o.sessions ?? o.scheduler.sessions;
    this.resolver = new SessionResolver(this.sessions.config.sources);
    const models = o.scheduler.endpoints.models();
    this.soleModel = models.length === 1 ? models[0]! : '';
    this.tokens = o.tokens ?? null;
    this.rewrites = o.rewrites ?? new ModelRewriter();
    this.adapterLoader = new AdapterLoader(o.scheduler.endpoints);
    this.adapterHold = new AdapterHold(o.scheduler.endpoints, o.adapterQueue);
    // an endpoint added, back from draining, or a model list read: a held request may go now
    o.scheduler.endpoints.onChange(() => this.adapterHold.wake());
  }

  /** Parses a large body in the worker pool (created on first use); the answer goes to flight.parsed(). */
  parseOffLoop(f: { readonly kind: Kind; parsed(r: ParseReply): void }, raw: Buffer): void {
    this.#pool ??= new Piscina<ParseTask, ParseReply>({
      filename: new URL('./parse-worker.js', import.meta.url).href,
      minThreads: 0,
      maxThreads: this.#parseWorkers,
      idleTimeout: 30_000,
      resourceLimits: { maxOldGenerationSizeMb: PARSE_WORKER_HEAP_MB },
    });
    this.offloadedParses++;
    // the worker gets a copy: the flight keeps the client's bytes to send upstream
    this.#pool.run({ raw, kind: f.kind, maxDepth: this.maxJsonDepth, modelOptional: this.rewrites.hasDefault }).then(
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
    this.adapterHold.close();
    const p = this.#pool;
    this.#pool = null;
    await p?.destroy();
  }

  /**
   * Takes over a request whose body has arrived: `kind` KIND_CHAT or
   * KIND_COMPLETION, `headers` those named by the gate's headerNames,
   * `sessionKey` the conversation when the caller knows it (the Responses
   * API: its chain); else one is derived from `sessions.sources`, reading
   * `sessionHeader` (the value of the `sessions.header` request header, ''
   * when absent) and the body. Never throws: every failure becomes an answer
   * through `port`.
   */
  begin(
    port: ClientPort,
    kind: Kind,
    requestId: string,
    caller: Caller,
    headers: Readonly<Record<string, string>>,
    body: Buffer,
    sessionKey = '',
    sessionHeader = '',
  ): Flight {
    const f = new Flight(this, port, kind, requestId, caller, headers);
    f.sessionKey = sessionKey;
    f.sessionHeader = sessionHeader;
    return this.#start(f, body);
  }

  /**
   * Like begin(), for a proxy that dispatches itself (Envoy ext_proc): the
   * same parse, admission, flow control and pick; the pick goes to
   * port.picked() and the flight waits for flight.served().
   */
  decide(
    port: DecisionPort,
    kind: Kind,
    requestId: string,
    caller: Caller,
    headers: Readonly<Record<string, string>>,
    body: Buffer,
    sessionKey = '',
  ): Flight {
    const f = new Flight(this, port, kind, requestId, caller, headers);
    f.sessionKey = sessionKey;
    f.decideOnly = true;
    return this.#start(f, body);
  }

  #start(f: Flight, body: Buffer): Flight {
    // head sampling: null (nothing allocated) unless this request is traced
    if (this.tracer !== null) f.trace = this.tracer.start(f.headers, f.kind, f.requestId, performance.now());
    try {
      f.start(body);
    } catch (err) {
      f.internalError(err);
    }
    return f;
  }
}

export class Flight extends RetryingFlight implements UpstreamSink, PdFlight {
  declare readonly director: Director;

  // ---- upstream sink ------------------------------------------------------------------

  override onUpstreamHeaders(status: number, contentType: string, contentLength: number): void {
    if (this.aborted) return;
    const p = this.pdState;
    if (p !== null && p.paired && !this.relayStarted && this.director.pd !== null) {
      if (status >= 500) {
        // SGLang: the decode endpoint could not get its room's KV (the prefill side failed, or never
        // reached it): not the decode endpoint's fault; a new pair (or decode alone on a both endpoint)
        this.pairFailed('decode-transfer', p.leg?.endpoint ?? this.prefillEndpoint);
        return;
      }
      if (status < 400) this.director.pd.paired();
    }
    if (status >= 500) this.endpoint.events?.upstreamFailed(this.endpoint, `answered HTTP ${status}`, false);
    if (status >= 500 && this.canRetry()) {
      if (this.trace !== null) this.trace.legFirstByte(performance.now(), status);
      this.retry(`endpoint ${this.endpoint.name} answered HTTP ${status}`);
      return;
    }
    const now = performance.now();
    this.director.metrics.ttft[this.endpoint.id].observe((now - this.dispatchedAt) / 1000);
    if (this.trace !== null) this.trace.legFirstByte(now, status);
    this.status = status;
    this.contentType = contentType === '' ? 'application/json' : contentType;
    this.isSse = contentType.startsWith('text/event-stream');
    if (this.isSse && status === 200) (this.sse ??= new SseErrorRewriter());
    this.lastChunkAt = 0;
    this.upstreamLength = contentLength;
    this.scanUsage = this.director.wantsUsage && status === 200 && (!this.isSse || this.streamsUsage());
    this.errorBytes = 0;
    this.timing = status === 200 && this.isSse && this.director.scheduler.latency;
    this.timingWhole = status === 200 && !this.isSse && this.director.scheduler.latency;
    if (this.timingWhole) this.scanUsage = true;
    this.firstAt = 0;
    this.events = 0;
    this.errorBody = status >= 400 && !this.isSse && contentLength <= MAX_ERROR_BODY ? [] : null;
    this.port.head(status, this.contentType, this.endpoint, contentLength);
  }

  /** The request asked for usage in its stream (`stream_options.include_usage`). */
  protected streamsUsage(): boolean {
    const so = this.body.stream_options;
    return typeof so === 'object' && so !== null && (so as Record<string, unknown>).include_usage === true;
  }

  override onUpstreamData(chunk: Buffer): void {
    if (this.aborted || this.clientEnded) return;
    // the first byte of an answer still counted in the backlog ends its prefill (streamed, or one token): the endpoint's speed learns from a 200's
    if (this.prefillTokens !== 0) this.prefilled(this.status === 200 ? performance.now() - this.dispatchedAt : -1);
    this.responseBytes += chunk.length;
    this.responseChunks++;
    if (this.scanUsage) {
      const n = scanCompletionTokens(chunk);
      if (n >= 0) {
        this.completionTokens = n;
        const p = scanPromptTokens(chunk);
        if (p >= 0) this.promptTokens = p;
      }
    }
    if (this.timing) this.timeChunk(chunk);
    const eb = this.errorBody;
    if (eb !== null) {
      this.errorBytes += chunk.length;
      if (this.errorBytes <= MAX_ERROR_BODY) {
        eb.push(Buffer.from(chunk)); // a copy: the client may reuse the chunk's memory
        return;
      }
      // too large to be an error object: relay what was held, then stream on
      this.errorBody = null;
      for (const held of eb) this.write(held);
    } else if (this.sse !== null) {
      const itl = this.director.metrics.itl;
      if (itl !== undefined) {
        const now = performance.now();
        if (this.lastChunkAt > 0) itl[this.endpoint.id].observe((now - this.lastChunkAt) / 1000);
        this.lastChunkAt = now;
      }
      chunk = this.sse.push(chunk);
      if (chunk.length === 0) return;
    }
    this.write(chunk);
  }

  /**
   * True when the answer's first body byte does not mark the end of the
   * prefill: a non-streamed generation of more than one token, whose only
   * chunk comes after the whole decode. Such a request is not counted in its
   * endpoint's prefill backlog (released at the pick, like an ext_proc
   * decision): counted until its answer, it would make the flow-control term
   * hold the next request through a decode while the engine has no prefill
   * queued, down to two requests per engine when the outputs are long
   * (bench/RESULTS.md, issue 13 session 8, "what the prefill-backlog term
   * costs").
   */
  protected override answersAfterDecode(): boolean {
    const b = this.body;
    if (b.stream === true) return false;
    const m = this.kind === Kind.Chat ? (b.max_completion_tokens ?? b.max_tokens) : b.max_tokens;
    return !(typeof m === 'number' && m <= 1);
  }

  /**
   * The attempt's prefill is over (its first body byte, or a P/D prefill leg
   * took it): its endpoint's prefill backlog drops, and flow control may
   * dispatch a request it held for it.
   */
  protected override prefilled(ttftMs = -1): void {
    const d = this.director;
    if (d.scheduler.prefilled(this, ttftMs) > 0) d.gate.onCapacity?.(this.model);
  }

  /** Times a streamed chunk: the first one is the first token; later ones count their SSE events (tokens). */
  protected timeChunk(chunk: Buffer): void {
    const now = performance.now();
    if (this.firstAt === 0) {
      this.firstAt = now;
      this.director.scheduler.firstToken(this, now - this.dispatchedAt);
      return;
    }
    this.lastAt = now;
    this.events += countSseEvents(chunk);
  }

  protected write(chunk: Buffer): void {
    this.relayStarted = true;
    // the whole answer in one chunk: one end() with a content-length, not a chunked stream
    if (this.upstreamLength === chunk.length && !this.clientEnded) {
      this.clientEnded = true;
      this.port.end(chunk);
    } else this.port.write(chunk);
  }

  override onUpstreamEnd(): void {
    if (this.aborted) return;
    if (!this.clientEnded) {
      const held = this.sse?.flush() ?? null;
      if (held !== null) {
        this.relayStarted = true;
        this.port.write(held);
      }
      let last: Buffer | string = '';
      const eb = this.errorBody;
      if (eb !== null) {
        this.errorBody = null;
        last = errorAnswer(eb, this.status);
        if (typeof last === 'string') this.port.head(this.status, 'application/json', this.endpoint, -1);
      }
      this.relayStarted = true;
      this.clientEnded = true;
      this.port.end(last);
    }
    // tokens after the first chunk: its events less the closing [DONE]
    if (this.timing && this.events > 1) this.director.scheduler.streamEnd(this, this.events - 1, this.lastAt - this.firstAt);
    else if (this.timingWhole && this.completionTokens > 0) this.director.scheduler.wholeAnswer(this, performance.now() - this.dispatchedAt, this.completionTokens);
    this.finish(this.status >= 500 ? 'failed' : 'ok', this.status);
  }

  override onUpstreamError(err: Error): void {
    if (this.aborted || this.done) return;
    this.endpoint.events?.upstreamFailed(this.endpoint, err.message, this.relayStarted);
    if (this.canRetry()) {
      this.retry(`endpoint ${this.endpoint.name}: ${err.message}`);
      return;
    }
    this.release('failed');
    if (!this.relayStarted) {
      this.reply(502, `upstream endpoint ${this.endpoint.name} failed: ${err.message}`, null, null);
      return;
    }
    this.errorMessage = err.message;
    if (!this.clientEnded) {
      const held = this.sse?.flush() ?? null;
      if (held !== null) this.port.write(held);
      this.clientEnded = true;
      this.port.fail(this.isSse ? streamFailedEvent(this.endpoint.name, err.message) : null);
    }
    this.finish('failed', this.status);
  }

  /** The client is slower than the engine: stop reading upstream. */
  pause(): void {
    this.call?.pause();
  }

  resume(): void {
    this.call?.resume();
  }

  // ---- ends -----------------------------------------------------------------------------

  /** A bug or a throwing plugin/gate: answer 500 and log, never crash the process. */
  override internalError(err: unknown): void {
    this.director.log.error({ err, id: this.requestId }, 'internal error while handling a request');
    this.reply(500, `internal error: ${(err as Error)?.message ?? String(err)}`, null, null);
  }

  protected finish(outcome: Outcome, status: number): void {
    if (this.done) return;
    this.done = true;
    if (this.sessionKey !== '' && this.dispatchedAt !== 0) this.director.sessions.turnEnded(this.sessionKey, Date.now());
    this.pdState?.leg?.abort();
    // the body is no longer needed (no retry after this); the upstream client that copies what it sends
    // holds none of it now: its buffer goes back to the pool for the next request
    const d = this.director;
    if (this.clientRaw !== null && d.returnsBodies) d.bodies.give(this.clientRaw);
    this.clientRaw = null;
    this.raw = null;
    this.promptCopy = null;
    this.release(outcome);
    if (this.admitted) {
      this.admitted = false;
      d.gate.release(this.ticket, outcome, this);
    }
    d.metrics.countRequest(this.model, this.endpoint ? this.endpoint.id : -1, status);
    if (this.trace !== null) this.trace.end(performance.now(), status, outcome === 'failed' ? this.errorMessage || `HTTP ${status}` : '');
    this.port.done(status);
  }

  /** Answers with an OpenAI error instead of the engine's answer and releases everything. */
  protected override reply(status: number, message: string, param: string | null, rejection: Rejected | null): void {
    if (this.done || this.aborted) return;
    this.call?.abort();
    this.call = null;
    const failed = status >= 500;
    this.release(failed ? 'failed' : 'ok');
    this.clientEnded = true;
    this.port.error(status, message, param, this.endpoint, rejection);
    this.finish(failed ? 'failed' : 'ok', status);
  }

  /**
   * Decide mode: the proxy's answer is over with `status` (0: no answer).
   * `servedBy`: the endpoint that served it when the proxy says so; another
   * than the pick (a fallback after the pick failed) counts the pick as
   * failed, which forgets the prefix blocks its pick recorded.
   */
  served(status: number, servedBy?: Endpoint | null): void {
    if (!this.decideOnly || this.done || this.aborted || !this.picked) return;
    const failed = status === 0 || status >= 500;
    this.status = failed ? (status === 0 ? 502 : status) : status;
    if (servedBy != null && servedBy !== this.endpoint && !failed) {
      this.status = 502; // the pick itself failed
      this.release('failed');
      this.status = status;
    }
    this.finish(failed ? 'failed' : 'ok', status === 0 ? 502 : status);
  }

  /** The client went away (the transport saw it; `status` 499), or the router cut the request (503 at a drain's end): abort upstream, release all accounting. */
  clientAborted(status = 499): void {
    if (this.aborted) return;
    this.aborted = true;
    this.call?.abort();
    this.call = null;
    this.pdState?.leg?.abort();
    if (!this.done) {
      this.done = true;
      if (this.sessionKey !== '' && this.dispatchedAt !== 0) this.director.sessions.turnEnded(this.sessionKey, Date.now());
      this.release('aborted');
      if (this.admitted) {
        this.admitted = false;
        this.director.gate.release(this.ticket, 'aborted', this);
      }
      this.director.metrics.countRequest(this.model, this.endpoint ? this.endpoint.id : -1, status);
      if (this.trace !== null) this.trace.end(performance.now(), status, status === 499 ? 'client closed the request' : 'cut by the router (shutdown)');
      this.port.done(status);
    }
    const cb = this.onabort;
    this.onabort = null;
    cb?.();
  }
}
