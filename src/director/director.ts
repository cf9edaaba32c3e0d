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
import { countSseEvents, errorAnswer, MAX_ERROR_BODY, scanCompletionTokens, streamFailedEvent } from './relay.js';
import type { TokenSource } from '../tokenize/source.js';
import type { Disaggregator, PdFlight } from './pd.js';
import type { FlightHost } from './flight-state.js';
import { RetryingFlight } from './flight-retry.js';

export { Kind, KIND_CHAT, KIND_COMPLETION, KIND_EMBEDDINGS, KIND_PATHS, isPassthrough } from './kinds.js';
export { SLO_HEADERS } from './flight-state.js';

export type { ClientPort, DirectorMetrics, DirectorOptions } from './ports.js';
/** A transport that takes the decision rather than the bytes (see DecisionPortOf in ports.ts). */
export type DecisionPort = DecisionPortOf<Flight>;

/** Heap a parse worker may use; a body that needs more (millions of tiny objects) is refused, not parsed. */
const PARSE_WORKER_HEAP_MB = 512;

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
    this.parseOffloadBytes = o.parseOffloadBytes ?? 256 * 1024;
    this.#parseWorkers = Math.max(1, o.parseWorkers ?? 2);
    this.maxJsonDepth = o.maxJsonDepth ?? MAX_JSON_DEPTH;
    this.sessions = o.sessions ?? o.scheduler.sessions;
    this.resolver = new SessionResolver(this.sessions.config.sources);
    const models = o.scheduler.endpoints.models();
    this.soleModel = models.length === 1 ? models[0]! : '';
    this.tokens = o.tokens ?? null;
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

<<<<<<< HEAD
export class Flight implements Decision, UpstreamSink, FinishedRequest, AbortLike, PdFlight {
  // Decision
  endpoint!: Endpoint;
  seq = 0;
  promptBlocks = 0;
  matchedBlocks = 0;
  /** Uncached prompt tokens this attempt holds in its endpoint's prefill backlog (0: released). */
  prefillTokens = 0;
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
  // FinishedRequest (what release() may read)
  completionTokens = -1;
  responseBytes = 0;
  responseChunks = 0;
  /** The session header's value ('' when absent): a source of the session key. */
  sessionHeader = '';
  /** This request's spans when tracing is on and it was sampled; null otherwise. */
  trace: RequestTrace | null = null;
  /** P/D: the endpoint whose prefill this request's decode uses (x-switchyard-prefill-endpoint); null when none. */
  prefillEndpoint: Endpoint | null = null;
  /** Director.decide(): the pick goes to the port, the proxy dispatches, served() completes. */
  decideOnly = false;

  readonly director: Director;
  readonly port: ClientPort;
  readonly kind: Kind;
  /** Who sent the request (src/identity.ts): the gate's flow and band ceiling, the model allow-list. Never forwarded upstream. */
  readonly caller: Caller;
  #raw: Buffer | null = null;
  /** P/D: this request's legs (src/director/pd-attempt.ts); null until disaggregation takes it, and always for other requests. */
  #pd: PdAttempt | null = null;
  /** Prompt bytes copied out of the shared writer when admission is asynchronous. */
  #promptCopy: Uint8Array | null = null;
  #ticket: unknown = null;
  /** Precise mode: the prompt's tokens (null: none, score approximately), or their promise while tokenizing. */
  #tokens: Uint8Array | null = null;
  #tokensWait: Promise<Uint8Array | null> | null = null;
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
  /** performance.now() of the stream's previous chunk (the inter-chunk histogram); 0 before the first. */
  #lastChunkAt = 0;
  #upstreamLength = -1;
  /** Look for `"completion_tokens":` in the answer's chunks (the gate wants usage, and the answer carries it). */
  #scanUsage = false;
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
  /** Timing a non-streamed 200 answer for the latency plugins: total time and its usage's completion_tokens. */
  #timingWhole = false;
  #firstAt = 0;
  #lastAt = 0;
  #events = 0;

  constructor(director: Director, port: ClientPort, kind: Kind, requestId: string, caller: Caller, headers: Readonly<Record<string, string>>) {
    this.director = director;
    this.port = port;
    this.kind = kind;
    this.path = KIND_PATHS[kind];
    this.requestId = requestId;
    this.caller = caller;
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
    let model = this.model;
    if (model === '') {
      // a passthrough body without `model` (the engine would default to its own)
      if (d.soleModel === '') {
        this.#reply(400, "missing required field 'model' (the router serves several models)", 'model', null);
        return;
      }
      model = this.model = d.soleModel;
    }
    // a model outside the caller's allow-list is answered exactly as one that does not exist (existence does not leak)
    if (!d.scheduler.hasModel(model) || (this.caller.models !== null && !this.caller.models.has(model))) {
      this.#reply(404, `The model \`${model}\` does not exist.`, 'model', null);
      return;
    }
    if (d.scheduler.latency && !this.#readSlo()) return;
    if (isPassthrough(this.kind)) {
      this.sessionKey = '';
      this.#admitGate();
      return;
    }
    if (this.sessionKey === '') this.sessionKey = d.resolver.resolve(this.sessionHeader, this.body);
    const key = this.sessionKey;
    if (key !== '') {
      // the turn tracker: a continuation of an active conversation (turn priority); with a
      // shared store (Redis) the session is read through first (the pick never waits for it)
      const sessions = d.sessions;
      const load = sessions.load(key, Date.now());
      if (load !== null) {
        this.#promptCopy ??= Uint8Array.prototype.slice.call(d.prompt.view());
        load.then(() => {
          if (this.aborted || this.#done) return;
          try {
            this.continuation = sessions.continues(key, Date.now());
            this.#admitGate();
          } catch (err) {
            this.internalError(err);
          }
        });
        return;
      }
      this.continuation = sessions.continues(key, Date.now());
    }
    this.#admitGate();
  }

  #admitGate(): void {
    const d = this.director;
    const tr = this.trace;
    if (tr !== null) {
      tr.parsed(this.model, this.body);
      tr.admissionStart(performance.now());
    }
    // tokenize while admission runs; the pick waits for it (never inside the pick)
    if (d.tokens !== null && !isPassthrough(this.kind)) this.#tokenize(d.tokens);
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
    if (this.trace !== null) this.trace.admissionEnd(performance.now(), a.admitted, a.admitted ? '' : a.reason);
    if (a.admitted) {
      if (this.aborted || this.#done) {
        this.director.gate.release(a.ticket, 'aborted');
        return;
      }
      this.#admitted = true;
      this.#ticket = a.ticket;
      if (this.#tokensWait !== null) {
        void this.#tokensWait.then(() => {
          if (this.aborted || this.#done) {
            this.director.gate.release(this.#ticket, 'aborted');
            return;
          }
          try {
            this.#dispatch();
          } catch (err) {
            this.internalError(err);
          }
        });
        return;
      }
      this.#dispatch();
      return;
    }
    if (this.aborted || this.#done) return;
    const rejected = this.director.metrics.rejected;
    rejected.set(a.reason, (rejected.get(a.reason) ?? 0) + 1);
    this.#reply(a.status, a.message, null, a);
  }

  #tokenize(src: TokenSource): void {
    const b = this.body as Record<string, unknown>;
    if (!src.has(this.model)) return;
    const r = src.tokens({ model: this.model, messages: b.messages, prompt: b.prompt }, this.#promptCopy ?? this.director.prompt.view());
    if (r instanceof Promise) {
      this.#tokensWait = r.then((v) => {
        this.#tokens = v;
        this.#tokensWait = null;
        return v;
      });
    } else this.#tokens = r;
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
    sreq.tokens = this.#tokens ?? undefined;
    sreq.pair = this.prefillEndpoint; // a decode retry stays in the prefill's revision
    sreq.role = null;
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
    d.metrics.decision.observe((t1 - t0) / 1000);
    if (this.trace !== null) {
      const s = d.scheduler;
      this.trace.scheduled(t0, t1, picked === null ? null : this.endpoint, s.lastCandidates, s.lastScore, this.promptBlocks, this.matchedBlocks);
    }
    if (picked === null) {
      sreq.prompt = undefined;
      sreq.tokens = undefined;
      if (this.#pd !== null && this.#pd.noPair) this.#reply(503, `no ready endpoint for model \`${this.model}\`: no revision has a ready prefill endpoint for its SGLang decode endpoints (they refuse a request without a bootstrap room) or a ready both endpoint`, null, null);
      else if (this.#tried !== null) this.#reply(502, `all endpoints tried for model \`${this.model}\` failed: ${this.#errorMessage}`, null, null);
      else this.#reply(503, `no ready endpoint for model \`${this.model}\``, null, null);
      return;
    }
    this.#picked = true;
    // its first body byte is the whole answer, long after the prefill: not in the backlog
    if (this.prefillTokens !== 0 && this.#answersAfterDecode()) d.scheduler.prefilled(this);
    d.metrics.promptBlocks += this.promptBlocks;
    d.metrics.matchedBlocks += this.matchedBlocks;
    this.#dispatchedAt = t1;
    if (this.decideOnly) {
      // the proxy dispatches (and retries down its own fallback list): nothing to retry here;
      // the router never sees its first byte, so it holds no prefill backlog either
      d.scheduler.prefilled(this);
      this.#started = true;
      (this.port as DecisionPort).picked(this);
      return;
    }
    const pd = d.pd;
    // NIXL: a retry reuses the prefill's transfer parameters; SGLang: a decode-role endpoint only takes pairs
    if (pd !== null && (this.#attempts === 0 || pd.needsRoom(this.endpoint)) && pd.begin(this, sreq)) {
      // the prefill leg computes the prompt (counted in its prefill endpoint's backlog): the decode endpoint gets its KV
      this.#prefilled();
      sreq.prompt = undefined;
      sreq.tokens = undefined; // a prefill leg runs first (or both legs are out): the collaborator calls sendDecode
      return;
    }
    sreq.prompt = undefined;
    sreq.tokens = undefined;
    this.#send(this.#pd?.retryBody ?? this.#raw);
  }

  #send(body: Buffer | null): void {
    const call = this.director.upstream.send(this.endpoint, { method: 'POST', path: this.path, headers: this.legHeaders(this.endpoint), body }, this);
    // a client may fail the call synchronously (a closed pool): the nested retry or end already took over
    if (this.#call === null && !this.#done) this.#call = call;
  }

  /**
   * Appends the trace headers (traceparent, tracestate, baggage) one upstream
   * leg to `endpoint` carries and returns `headers`. Every leg calls it: this
   * dispatch, each retry, a prefill leg before the decode leg. When the
   * request is traced it also starts the leg's span (ended by the next leg or
   * the request's end) and the engine gets that span as parent.
   */
  traceLeg(headers: string[], endpoint: Endpoint, now: number): string[] {
    const tr = this.trace;
    if (tr !== null) return appendTraceHeaders(headers, this.headers, tr.legStart(now, endpoint));
    return this.headers === EMPTY ? headers : appendTraceHeaders(headers, this.headers);
  }

  /**
   * The headers of an upstream request to `endpoint`: every leg of a request
   * (dispatch, retry, a P/D prefill leg) gets the same ones (one x-request-id)
   * plus its trace headers (traceLeg).
   */
  legHeaders(endpoint: Endpoint): string[] {
    return this.traceLeg(
      // the client's Authorization never goes upstream: the endpoint's pool key (upstreamAuth), if any
      endpoint.upstreamAuthorization !== ''
        ? ['content-type', 'application/json', 'x-request-id', this.requestId, 'authorization', endpoint.upstreamAuthorization]
        : ['content-type', 'application/json', 'x-request-id', this.requestId],
      endpoint,
      this.trace !== null ? performance.now() : 0,
    );
  }

  // ---- P/D legs (src/director/pd.ts calls these) ---------------------------------------

  get rawBody(): Buffer {
    return this.#raw ?? EMPTY_BODY;
  }

  get started(): boolean {
    return this.#started;
  }

  setLeg(leg: PrefillLeg | null): void {
    if (leg !== null || this.#pd !== null) this.#pdAttempt().leg = leg;
  }

  /** The decode leg, after the prefill leg (or at once, SGLang); `retryBody` is what a retry elsewhere sends. */
  sendDecode(body: Buffer, retryBody: Buffer): void {
    if (this.aborted || this.#done) return;
    const p = this.#pdAttempt();
    p.retryBody = retryBody;
    p.paired = body !== retryBody;
    this.#dispatchedAt = performance.now();
    try {
      this.#send(body);
    } catch (err) {
      this.internalError(err);
    }
  }

  /** The prefill leg answered 4xx: that is the client's answer. */
  prefillRejected(status: number, message: string): void {
    // the decode endpoint never saw the prompt: its slot is released (no breaker outcome) and the blocks its pick recorded go
    this.#unpick();
    this.#reply(status, message, null, null);
  }

  /** This request's P/D state, created on first use (only P/D requests get here). */
  #pdAttempt(): PdAttempt {
    return (this.#pd ??= new PdAttempt());
  }

  get triedPrefill(): readonly Endpoint[] | null {
    return this.#pd?.triedPrefill ?? null;
  }

  /**
   * SGLang: the pair failed before decode sent a byte (`prefill`: its prefill
   * endpoint). A `both` decode endpoint decodes alone (it prefills itself); a
   * decode-role one refuses a request without a room, so, within the retry
   * budget, a new pair with a fresh room (another prefill endpoint when there
   * is one, this decode endpoint: it was not at fault) or a `both` endpoint;
   * otherwise a clean 502.
   */
  pairFailed(reason: FallbackReason, prefill: Endpoint | null): void {
    if (this.aborted || this.#done || this.#started) return;
    const pd = this.director.pd!;
    const p = this.#pdAttempt();
    this.prefillEndpoint = null;
    p.dropLeg();
    this.#call?.abort();
    this.#call = null;
    this.#status = 0;
    this.#errorBody = null;
    if (this.trace !== null) this.trace.legEnd(performance.now(), reason);
    if (!pd.needsRoom(this.endpoint)) {
      pd.countFallback(reason);
      this.sendDecode(this.rawBody, this.rawBody);
      return;
    }
    const why = `the pair of decode endpoint ${this.endpoint.name} with prefill endpoint ${prefill?.name ?? '?'} failed (${reason})`;
    if (this.#attempts >= this.director.maxRetries) {
      this.unservable(502, `upstream P/D pair for model \`${this.model}\` failed: ${why}`);
      return;
    }
    this.#attempts++;
    this.director.metrics.retries++;
    pd.countNewPair(reason);
    this.#errorMessage = why;
    if (prefill !== null) p.notePrefillFailed(prefill);
    const sreq = this.#schedRequest(true);
    try {
      pd.repair(this, sreq, why);
    } catch (err) {
      this.internalError(err);
    } finally {
      sreq.prompt = undefined;
      sreq.tokens = undefined;
      sreq.role = null;
    }
  }

  /**
   * SGLang: moves the pick to a `both` endpoint of the picked endpoint's pool
   * and revision (the decode-role endpoint first picked would refuse the
   * request alone). The new pick is made first, so a false answer (none ready)
   * changes nothing; on success the first pick is released (no breaker
   * outcome) and the prefix blocks it recorded are forgotten. Cold path.
   */
  toBoth(sreq: SchedRequest): boolean {
    const d = this.director;
    if (!this.#picked || d.pd === null || !d.pd.hasBoth(this.endpoint)) return false;
    const old: Decision & LatencyNote = {
      endpoint: this.endpoint,
      seq: this.seq,
      promptBlocks: this.promptBlocks,
      matchedBlocks: this.matchedBlocks,
      latPending: this.latPending,
      latWork: this.latWork,
      latRunning: this.latRunning,
      latPredTtftMs: this.latPredTtftMs,
      latPredTpotMs: this.latPredTpotMs,
      latSloTtftMs: this.latSloTtftMs,
      latSloTpotMs: this.latSloTpotMs,
      latBand: this.latBand,
    };
    const pair = sreq.pair;
    sreq.role = 'both';
    sreq.pair = old.endpoint;
    let picked: Decision | null;
    try {
      picked = d.scheduler.pick(sreq, this.#tried, this);
    } finally {
      sreq.role = null;
      sreq.pair = pair;
    }
    if (picked === null) return false;
    if (this.prefillTokens !== 0 && this.#answersAfterDecode()) d.scheduler.prefilled(this);
    d.scheduler.complete(old, 'aborted');
    if (d.scheduler.prefix !== null && old.promptBlocks > old.matchedBlocks && sreq.prompt !== undefined) d.scheduler.prefix.forget(old.endpoint, old, sreq);
    return true;
  }

  /** SGLang: this revision cannot pair its decode endpoints: pick again without them (503 when nothing is left). */
  noPairInRevision(): void {
    const ep = this.endpoint;
    this.#pdAttempt().noPair = true;
    this.#unpick();
    const tried = (this.#tried ??= []);
    for (const e of this.director.scheduler.endpoints.all) if (e.pool === ep.pool && e.revision === ep.revision && e.role !== 'both' && !tried.includes(e)) tried.push(e);
    if (!tried.includes(ep)) tried.push(ep);
    this.#dispatch();
  }

  /** SGLang: nothing can serve the request: `status` before any byte; the decode pick is released without a breaker failure. */
  unservable(status: number, message: string): void {
    if (this.aborted || this.#done) return;
    this.#unpick();
    this.#reply(status, message, null, null);
  }

  /** Releases the current pick as never sent (no breaker outcome) and forgets the prefix blocks it recorded. */
  #unpick(): void {
    if (!this.#picked) return;
    this.#picked = false;
    const scheduler = this.director.scheduler;
    scheduler.complete(this, 'aborted');
    if (scheduler.prefix !== null && this.promptBlocks > this.matchedBlocks) {
      const sreq = this.#schedRequest(true);
      try {
        scheduler.prefix.forget(this.endpoint, this, sreq);
      } finally {
        sreq.prompt = undefined;
        sreq.tokens = undefined;
      }
    }
  }

  #canRetry(): boolean {
    return !this.#started && !this.aborted && this.#attempts < this.director.maxRetries;
  }

  #retry(reason: string): void {
    this.#errorMessage = reason;
    if (this.trace !== null) this.trace.legEnd(performance.now(), reason);
    // SGLang: the prefill leg of the failed decode leg's room goes with it (a retry forms a new pair)
    this.#pd?.dropLeg();
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
=======
export class Flight extends RetryingFlight implements UpstreamSink, PdFlight {
  declare readonly director: Director;
>>>>>>> main

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
    if (this.prefillTokens !== 0) this.prefilled();
    this.responseBytes += chunk.length;
    this.responseChunks++;
    if (this.scanUsage) {
      const n = scanCompletionTokens(chunk);
      if (n >= 0) this.completionTokens = n;
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
  protected override prefilled(): void {
    const d = this.director;
    if (d.scheduler.prefilled(this) > 0) d.gate.onCapacity?.(this.model);
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
    // the body is no longer needed (no retry after this)
    this.raw = null;
    this.promptCopy = null;
    this.release(outcome);
    const d = this.director;
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
