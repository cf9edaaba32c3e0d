// One inference request on the uWS transport: reads the body (bounded),
// hands it to the director, and writes what the director answers (head, body
// chunks with backpressure, error answers). Knows nothing of scheduling.
// Writes made from upstream socket callbacks are corked through module-level
// functions (no closure per write).
import { performance } from 'node:perf_hooks';
import type { Rejected } from '../admission.js';
import type { ClientPort } from '../director/director.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import { errorBody } from '../proxy/error-shape.js';
import type { HttpResponse } from '../uws.js';
import type { LimitsConfig } from '../config/schema.js';
import type { Director } from '../director/director.js';
import type { Caller } from '../identity.js';
import { KIND_PATHS } from '../director/kinds.js';
import { statusLine } from './http-errors.js';
import { SHUTDOWN_CODE, type Cuttable } from './drain.js';
import type { ExchangeFlight } from './exchange-flight.js';
import { errorOutcome, OUTCOME_CANCELLED, OUTCOME_CLIENT_ERROR, OUTCOME_MID_STREAM, OUTCOME_SHUTDOWN, OUTCOME_TIMEOUT, statusOutcome } from '../metrics/outcomes.js';

const EMPTY: Readonly<Record<string, string>> = Object.freeze({});

/** What an exchange needs of the server that made it (RouterCore), so this module does not import it back. */
export interface ExchangeHost {
  readonly limits: LimitsConfig;
  readonly director: Director;
  /** close() began: answers close their connection. */
  readonly draining: boolean;
  readonly reading: { delete(x: HttpExchange): void };
  readonly metrics: { pauses: number; countRequest(model: string, endpointId: number, status: number): void };
  /** The content-type / x-switchyard-endpoint / x-request-id header block for one writeHeader call. */
  headerBlock(ep: Endpoint, contentType: string): Buffer;
  /** Called once per request when it ends (any way). */
  requestEnded(x: HttpExchange, status: number): void;
  /** The x-ratelimit-* header lines of an answer to `caller` (each ending in CRLF; '' without rate limits). */
  rateHeaders(caller: Caller): string;
}

/**
 * Writes header lines (`name: value\r\n`...) in one uWS call: uWS writes a
 * header's name and value verbatim, so the first name and the rest as its
 * value are the same bytes.
 */
export function writeHeaderLines(res: HttpResponse, lines: string): void {
  const colon = lines.indexOf(': ');
  res.writeHeader(lines.slice(0, colon), lines.slice(colon + 2, lines.length - 2));
}

export type { ExchangeFlight } from './exchange-flight.js';

/** uWS hands header values over one char per byte: echo non-ASCII ones as their original bytes. */
export function headerBytes(s: string): string | Buffer {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0x7f) return Buffer.from(s, 'latin1');
  return s;
}

// Module-level cork targets: uWS cork takes a callback; these avoid a closure per write.
let cur: HttpExchange;
let curChunk: Buffer | string = '';
function corkedWrite(): void {
  cur.writeCorked(curChunk);
}
function corkedEnd(): void {
  cur.endCorked(curChunk);
}
let curEvent: string | null = null;
function corkedFail(): void {
  cur.failCorked(curEvent);
}
let curStatus = 0;
let curMessage = '';
let curParam: string | null = null;
let curEndpoint: Endpoint | undefined;
let curRejection: Rejected | null = null;
let curClose = false;
let curCode: string | undefined;
function corkedError(): void {
  cur.errorCorked(curStatus, curMessage, curParam, curEndpoint, curRejection, curClose, curCode);
}

export class HttpExchange implements ClientPort, Cuttable {
  readonly core: ExchangeHost;
  readonly res: HttpResponse;
  readonly kind: number;
  readonly requestId: string;
  /** The x-request-id value as written back to the client (see headerBytes). */
  readonly requestIdHeader: string | Buffer;
  /** Who sent the request (resolved before the body was read; src/identity.ts). */
  readonly caller: Caller;
  readonly contentLength: number;
  /** Headers the admission gate asked for (lower-case names; '' when absent). */
  headers: Readonly<Record<string, string>> = EMPTY;
  /** The session header's value ('' when absent or not read). */
  sessionHeader = '';
  /** performance.now() when the request's headers arrived, and when its answer's first bytes went out (0: not yet). */
  readonly startedAt = performance.now();
  firstByteAt = 0;
  /** How the request ended (src/metrics/outcomes.ts; -1 until decided) and a rejection's reason. */
  outcome = -1;
  rejectReason = '';
  readStart = 0;
  /** Position in core.reading while the body is being read; -1 otherwise. */
  readSlot = -1;
  /** Position in the router's in-flight list (src/server/drain.ts); -1 otherwise. */
  activeSlot = -1;
  /** The director's side of this request (or a Responses turn's), once the body has arrived. */
  flight: ExchangeFlight | null = null;
  #raw: Buffer | null = null;
  #received = 0;
  // the answer's head, written with its first bytes
  #status = 200;
  #contentType = '';
  #endpoint: Endpoint | undefined;
  #started = false;
  #aborted = false;
  #done = false;
  #inBegin = false;
  /** done()'s status while inside begin(); -1: none. */
  #endedStatus = -1;
  #paused = false;
  #onWritable: ((offset: number) => boolean) | null = null;

  /** The request's route (the access log's, before a flight knows it). */
  get path(): string {
    return KIND_PATHS[this.kind] ?? '/v1/responses';
  }

  /** The request's tenant ('' = the anonymous scope): its caller's (the Responses API and the access log read it). */
  get tenant(): string {
    return this.caller.tenant;
  }

  constructor(core: ExchangeHost, res: HttpResponse, kind: number, requestId: string, requestIdHeader: string | Buffer, caller: Caller, contentLength: number) {
    this.core = core;
    this.res = res;
    this.kind = kind;
    this.requestId = requestId;
    this.requestIdHeader = requestIdHeader;
    this.caller = caller;
    this.contentLength = contentLength;
  }

  // ---- request body -------------------------------------------------------------

  onBodyChunk(ab: ArrayBuffer, isLast: boolean): void {
    if (this.#done || this.flight !== null) return;
    const n = ab.byteLength;
    const limit = this.core.limits.maxBodyBytes;
    if (this.#received + n > limit) {
      this.core.reading.delete(this);
      this.reject(413, `request body exceeds the limit of ${limit} bytes`);
      return;
    }
    // the body's buffers come from the director's pool (src/director/body-pool.ts): its flight gives the
    // last one back when it ends, a buffer outgrown here goes back at once
    const bodies = this.core.director.bodies;
    if (isLast && this.#received === 0) {
      const b = bodies.take(n);
      b.set(new Uint8Array(ab));
      this.#raw = b;
      this.#received = n;
    } else if (n > 0) {
      let raw = this.#raw;
      if (raw === null || raw.length < this.#received + n) {
        // Grow by 4x, or to the declared Content-Length once a quarter of it has arrived: the
        // client's claim reserves at most 4x what it sent (or 64 KiB), so idle connections
        // that announce large bodies cannot reserve memory.
        const got = this.#received + n;
        const cl = this.contentLength;
        const want = Math.min(limit, cl >= got && cl <= got * 4 ? cl : Math.max(Math.min(cl, 65536), got * 4, 16384));
        const next = bodies.take(want);
        if (raw !== null) {
          raw.copy(next, 0, 0, this.#received);
          bodies.give(raw);
        }
        this.#raw = raw = next;
      }
      raw.set(new Uint8Array(ab), this.#received);
      this.#received += n;
    }
    if (!isLast) return;
    this.core.reading.delete(this);
    const raw = this.#raw === null ? Buffer.alloc(0) : this.#raw.length === this.#received ? this.#raw : this.#raw.subarray(0, this.#received);
    this.#raw = null;
    // an answer given inside begin() (a bad body, no endpoint) ends the request before `flight` is set:
    // its end is reported once begin() returns, so the metrics and the access log see the flight's model
    this.#inBegin = true;
    try {
      this.flight = this.begin(raw);
    } finally {
      this.#inBegin = false;
    }
    if (this.#endedStatus >= 0) this.core.requestEnded(this, this.#endedStatus);
  }

  /** Hands the complete body over: to the director (a subclass may hand it elsewhere). */
  begin(raw: Buffer): ExchangeFlight {
    return this.core.director.begin(this, this.kind, this.requestId, this.caller, this.headers, raw, '', this.sessionHeader);
  }

  /** An error answer from the transport itself (413, 408), before the director took the request; closes the connection. */
  reject(status: number, message: string): void {
    if (this.#done || this.#aborted) return;
    this.outcome = status === 408 ? OUTCOME_TIMEOUT : OUTCOME_CLIENT_ERROR;
    this.#error(status, message, null, undefined, null, true);
    this.core.metrics.countRequest('', -1, status);
    this.done(status);
  }

  /** uWS onAborted: the client went away. */
  onClientAbort(): void {
    if (this.#aborted) return;
    this.#aborted = true;
    this.core.reading.delete(this);
    if (this.flight !== null) {
      this.flight.clientAborted();
      return;
    }
    if (!this.#done) {
      this.outcome = OUTCOME_CANCELLED;
      this.core.metrics.countRequest('', -1, 499);
      this.done(499);
    }
  }

  /**
   * A drain's grace is over: a stream whose head went out ends with `sseEvent`
   * (a chunked answer that is not SSE is cut), an answer not begun is a 503;
   * the director's side is aborted (upstream call, accounting) with status 503.
   */
  cutForShutdown(sseEvent: string, message: string): void {
    if (this.#done || this.#aborted) return;
    this.core.reading.delete(this);
    this.#aborted = true; // the flight's later writes are dropped
    this.outcome = OUTCOME_SHUTDOWN;
    const res = this.res;
    if (this.#started) {
      // not end(…, true): uWS drops a chunked stream's last chunk when asked to close with it (the router closes the sockets after)
      if (this.#contentType.startsWith('text/event-stream')) {
        // the side's own shape when it has one (a Responses stream ends with response.failed)
        const ev = this.flight?.shutdownEvents?.(SHUTDOWN_CODE, message) ?? sseEvent;
        res.cork(() => res.end(ev));
      }
      else res.close();
    } else this.#error(503, message, null, this.#endpoint, null, true, SHUTDOWN_CODE);
    if (this.flight !== null) this.flight.clientAborted(503);
    else {
      this.core.metrics.countRequest('', -1, 503);
      this.done(503);
    }
  }

  // ---- ClientPort ----------------------------------------------------------------

  head(status: number, contentType: string, endpoint: Endpoint): void {
    this.#status = status;
    this.#contentType = contentType;
    this.#endpoint = endpoint;
  }

  write(chunk: Buffer | string): void {
    if (this.#aborted) return;
    cur = this;
    curChunk = chunk;
    this.res.cork(corkedWrite);
    curChunk = '';
  }

  end(chunk: Buffer | string): void {
    if (this.#aborted) return;
    cur = this;
    curChunk = chunk;
    this.res.cork(corkedEnd);
    curChunk = '';
  }

  fail(sseEvent: string | null): void {
    if (this.outcome < 0) this.outcome = OUTCOME_MID_STREAM;
    if (this.#aborted) return;
    cur = this;
    curEvent = sseEvent;
    this.res.cork(corkedFail);
    curEvent = null;
  }

  error(status: number, message: string, param: string | null, endpoint: Endpoint | undefined, rejection: Rejected | null, code?: string): void {
    if (this.outcome < 0) {
      this.outcome = errorOutcome(status, message, endpoint !== undefined, rejection !== null);
      if (rejection !== null) this.rejectReason = rejection.reason ?? '';
    }
    if (this.#aborted) return;
    this.#error(status, message, param, endpoint, rejection, false, code);
  }

  done(status: number): void {
    if (this.#done) return;
    this.#done = true;
    // an answer that ran to its end (or a status the director counted without an error call)
    if (this.outcome < 0) this.outcome = statusOutcome(status);
    if (this.#inBegin) {
      this.#endedStatus = status;
      return;
    }
    this.core.requestEnded(this, status);
  }

  // ---- writes (inside cork) ----------------------------------------------------------

  #error(status: number, message: string, param: string | null, endpoint: Endpoint | undefined, rejection: Rejected | null, close: boolean, code?: string): void {
    cur = this;
    curCode = code;
    curStatus = status;
    curMessage = message;
    curParam = param;
    curEndpoint = endpoint;
    curRejection = rejection;
    curClose = close;
    this.res.cork(corkedError);
    curMessage = '';
    curEndpoint = undefined;
    curRejection = null;
    curCode = undefined;
  }

  errorCorked(status: number, message: string, param: string | null, ep: Endpoint | undefined, rejection: Rejected | null, close: boolean, code?: string): void {
    const res = this.res;
    res.writeStatus(statusLine(status));
    res.writeHeader('content-type', 'application/json');
    res.writeHeader('x-request-id', this.requestIdHeader);
    if (ep) res.writeHeader('x-switchyard-endpoint', ep.name);
    const pf = this.flight?.prefillEndpoint;
    if (pf) res.writeHeader('x-switchyard-prefill-endpoint', pf.name);
    if (rejection !== null) {
      if (rejection.reason) res.writeHeader('x-switchyard-dropped-reason', rejection.reason);
      const ra = rejection.retryAfterSeconds ?? 0;
      if (ra > 0) res.writeHeader('retry-after', String(Math.ceil(ra)));
    }
    const rl = this.core.rateHeaders(this.caller);
    if (rl !== '') writeHeaderLines(res, rl);
    res.end(errorBody(status, message, param, code, rejection?.errorType), close || this.core.draining);
  }

  /** `streamed`: the body follows in write() calls (chunked), not in the one end(). */
  #writeHead(streamed: boolean): void {
    const res = this.res;
    if (this.#status !== 200) res.writeStatus(statusLine(this.#status)); // uWS writes 200 OK itself (one native call less)
    // content-type, x-switchyard-endpoint and x-request-id in one uWS call: the
    // first two lines and the third's name are one cached block (uWS writes a
    // header's name and value verbatim, so the bytes are those of three calls)
    res.writeHeader(this.core.headerBlock(this.#endpoint!, this.#contentType), this.requestIdHeader);
    const pf = this.flight?.prefillEndpoint;
    if (pf) res.writeHeader('x-switchyard-prefill-endpoint', pf.name);
    const rl = this.core.rateHeaders(this.caller);
    if (rl !== '') writeHeaderLines(res, rl);
    // draining: a stream says it closes its connection (a whole answer's end() does that itself)
    if (streamed && this.core.draining) res.writeHeader('connection', 'close');
    this.#started = true;
    this.firstByteAt = performance.now();
  }

  writeCorked(chunk: Buffer | string): void {
    if (!this.#started) this.#writeHead(true);
    if (!this.res.write(chunk) && !this.#paused) {
      // the client is slower than the engine: stop reading upstream until uWS drains
      this.#paused = true;
      this.core.metrics.pauses++;
      this.flight?.pause();
      this.res.onWritable((this.#onWritable ??= () => this.#drained()));
    }
  }

  #drained(): boolean {
    this.#paused = false;
    this.flight?.resume();
    return true;
  }

  endCorked(chunk: Buffer | string): void {
    const whole = !this.#started; // the answer is this one end (with a content-length), not a chunked stream
    if (whole) this.#writeHead(false);
    // draining: the connection closes after the answer, so the client's next request goes
    // to a router that is staying (a stream was told so by its connection: close header;
    // uWS cuts a chunked stream's last chunk when asked to close with it)
    this.res.end(chunk, whole && this.core.draining);
  }

  failCorked(sseEvent: string | null): void {
    if (sseEvent !== null) {
      if (!this.#started) this.#writeHead(true);
      this.res.end(sseEvent);
    } else this.res.close();
  }
}
