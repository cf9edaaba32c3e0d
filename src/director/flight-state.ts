// One request's state, shared by the layers of its Flight: flight-admit.ts
// (parse and admit) → flight-pick.ts (pick, dispatch, the P/D legs) →
// flight-retry.ts (retry, P/D re-pairing) → director.ts (the upstream sink's
// relay and the request's ends). Every field lives here, so one object of one
// shape carries a request (no per-request allocation besides it); the hooks a
// layer calls before the layer that defines them are abstract here.
import type { Logger } from 'pino';
import type { AbortLike, AdmissionGate, FinishedRequest, Rejected } from '../admission.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import type { Caller } from '../identity.js';
import type { SseErrorRewriter } from '../proxy/sse-errors.js';
import type { UpstreamCall, UpstreamClient } from '../proxy/upstream.js';
import type { Decision, Scheduler } from '../scheduler/scheduler.js';
import type { SchedRequest } from '../scheduler/types.js';
import type { SessionResolver } from '../sessions/resolve.js';
import type { SessionTable } from '../sessions/table.js';
import type { RequestTrace, RequestTracer } from '../telemetry/tracing.js';
import type { TokenSource } from '../tokenize/source.js';
import { KIND_PATHS, type Kind } from './kinds.js';
import type { ParseReply } from './parse-worker.js';
import type { PdAttempt } from './pd-attempt.js';
import type { Disaggregator } from './pd.js';
import type { ClientPort, DirectorMetrics } from './ports.js';
import type { PromptWriter } from './prompt.js';
import type { BodyScanner } from './body-scan.js';
import type { BodyPool } from './body-pool.js';

export const EMPTY: Readonly<Record<string, string>> = Object.freeze({});
export const EMPTY_BODY = Buffer.alloc(0);
/** Per-request latency objectives (llm-d's names), read when a latency plugin is configured. */
export const SLO_HEADERS = ['x-slo-ttft-ms', 'x-slo-tpot-ms'] as const;

/** What a flight uses of its director (src/director/director.ts: Director). */
export interface FlightHost {
  readonly scheduler: Scheduler;
  readonly upstream: UpstreamClient;
  readonly gate: AdmissionGate;
  readonly metrics: DirectorMetrics;
  readonly log: Logger;
  readonly maxRetries: number;
  readonly tracer: RequestTracer | null;
  readonly pd: Disaggregator | null;
  readonly prompt: PromptWriter;
  readonly schedRequest: SchedRequest;
  readonly parseOffloadBytes: number;
  /** The native body scan (limits.bodyScan: native), or null: every body parsed in JavaScript. */
  readonly scanner: BodyScanner | null;
  /** Bodies up to this size are scanned on the event loop (larger ones, and those the scan refuses, take the JavaScript path). */
  readonly scanOnLoopBytes: number;
  readonly maxJsonDepth: number;
  readonly wantsUsage: boolean;
  readonly tokens: TokenSource | null;
  readonly sessions: SessionTable;
  readonly resolver: SessionResolver;
  readonly soleModel: string;
  readonly rewrites: import('./model-rewrites.js').ModelRewriter;
  readonly adapterLoader: import('../endpoints/adapter-loader.js').AdapterLoader;
  /** Request bodies' reused buffers (src/director/body-pool.ts): the front ends take them, flights give them back. */
  readonly bodies: BodyPool;
  /** A flight gives its client's body back when it ends (the upstream client copies what it sends, no P/D legs). */
  readonly returnsBodies: boolean;
  /** Holds adapter requests while no candidate has a GPU adapter slot for them (src/director/adapter-hold.ts). */
  readonly adapterHold: import('./adapter-hold.js').AdapterHold;
  /** Parses a large body off the event loop; the answer goes to flight.parsed(). */
  parseOffLoop(f: { readonly kind: Kind; parsed(r: ParseReply): void }, raw: Buffer): void;
}

export abstract class FlightState implements Decision, FinishedRequest, AbortLike {
  // Decision
  endpoint!: Endpoint;
  seq = 0;
  promptBlocks = 0;
  matchedBlocks = 0;
  /** Uncached prompt tokens this attempt holds in its endpoint's prefill backlog (0: released). */
  prefillTokens = 0;
  /** Prefill tokens ahead of it at its endpoint at the pick, its own included (Decision). */
  aheadTokens = 0;
  adapter = '';
  // Decision's LatencyNote (written by latency plugins; numbers, no allocation)
  latPending = 0;
  latWork = 0;
  latOwn = 0;
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
  promptTokens = -1;
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

  /** What the flight uses of its director (the Director implements it). */
  readonly director: FlightHost;
  readonly port: ClientPort;
  readonly kind: Kind;
  /** Who sent the request (src/identity.ts): the gate's flow and band ceiling, the model allow-list. Never forwarded upstream. */
  readonly caller: Caller;
  protected raw: Buffer | null = null;
  /** The body as the client's exchange handed it over, given back to director.bodies at the end; null when something else may still read it. */
  protected clientRaw: Buffer | null = null;
  /** The body was scanned natively: `body` holds its top-level scalars only, the prompt is rendered again by a scan. */
  protected scanned = false;
  /** P/D: this request's legs (src/director/pd-attempt.ts); null until disaggregation takes it, and always for other requests. */
  protected pdState: PdAttempt | null = null;
  /** Prompt bytes copied out of the shared writer when admission is asynchronous. */
  protected promptCopy: Uint8Array | null = null;
  protected ticket: unknown = null;
  /** Precise mode: the prompt's tokens (null: none, score approximately), or their promise while tokenizing. */
  protected tokens: Uint8Array | null = null;
  protected tokensWait: Promise<Uint8Array | null> | null = null;
  protected admitted = false;
  protected picked = false;
  protected tried: Endpoint[] | null = null;
  /** The adapter hold: 0 never held, 1 held now, 2 let go by it (its check just ran: the pick uses its exclude). */
  protected held = 0;
  protected attempts = 0;
  /** Attempts after the first one (the access log's `retries`). */
  get retries(): number {
    return this.attempts;
  }
  protected call: UpstreamCall | null = null;
  protected dispatchedAt = 0;
  protected status = 0;
  protected contentType = '';
  /** The answer is an SSE stream with status 200: flat-shape error events in it are rewritten. */
  protected sse: SseErrorRewriter | null = null;
  protected isSse = false;
  /** performance.now() of the stream's previous chunk (the inter-chunk histogram); 0 before the first. */
  protected lastChunkAt = 0;
  protected upstreamLength = -1;
  /** Look for `"completion_tokens":` in the answer's chunks (the gate wants usage, and the answer carries it). */
  protected scanUsage = false;
  /** Bytes (or the head) went to the client: no retry from here on. */
  protected relayStarted = false;
  protected clientEnded = false;
  protected done = false;
  protected errorMessage = '';
  /** An upstream error answer (status >= 400, not SSE) being buffered to normalise its shape. */
  protected errorBody: Buffer[] | null = null;
  protected errorBytes = 0;
  /** The request's x-slo-* objectives, ms (0: none). */
  protected sloTtft = 0;
  protected sloTpot = 0;
  /** Timing a streamed answer for the scheduler's latency plugins: first and last chunk, SSE events after the first chunk. */
  protected timing = false;
  /** Timing a non-streamed 200 answer for the latency plugins: total time and its usage's completion_tokens. */
  protected timingWhole = false;
  protected firstAt = 0;
  protected lastAt = 0;
  protected events = 0;
  /** Why the last adapter load for this request failed ('' none): a pick that then finds no endpoint answers 503 with it (flight-pick.ts). */
  protected adapterLoadError = '';

  constructor(director: FlightHost, port: ClientPort, kind: Kind, requestId: string, caller: Caller, headers: Readonly<Record<string, string>>) {
    this.director = director;
    this.port = port;
    this.kind = kind;
    this.path = KIND_PATHS[kind];
    this.requestId = requestId;
    this.caller = caller;
    this.headers = headers;
  }

  // ---- hooks the later layers define ---------------------------------------------------

  /** A bug or a throwing plugin/gate: answer 500 and log (director.ts). */
  abstract internalError(err: unknown): void;
  /** Answers with an OpenAI error instead of the engine's answer and releases everything (director.ts). */
  protected abstract reply(status: number, message: string, param: string | null, rejection: Rejected | null): void;
  /** Picks an endpoint and sends the request (flight-pick.ts). */
  protected abstract dispatch(): void;
  /** The attempt's prefill is over: its endpoint's prefill backlog drops (director.ts). */
  protected abstract prefilled(ttftMs?: number): void;
  /** True when the answer's first body byte does not mark the end of the prefill (director.ts). */
  protected abstract answersAfterDecode(): boolean;
}
