// One proxied inference request, from the first body byte to the last
// response byte. The object is at once the scheduler's Decision, the upstream
// sink, the admission gate's RequestInfo and its abort signal, so a request
// costs one object plus its buffers. Writes to uWS from undici callbacks are
// corked through module-level functions (no closure per write).
import { performance } from 'node:perf_hooks';
import type { Endpoint } from '../endpoints/endpoint.js';
import type { Decision, Outcome } from '../scheduler/scheduler.js';
import type { UpstreamCall, UpstreamSink } from '../proxy/upstream.js';
import type { AbortLike, Admission, RequestInfo } from './gate.js';
import { errorBody, normalizeErrorBody, statusLine } from './http-errors.js';
import type { RouterCore } from './core.js';
import type { HttpResponse } from './uws.js';

export const KIND_CHAT = 0;
export const KIND_COMPLETION = 1;
export const KIND_PATHS = ['/v1/chat/completions', '/v1/completions'];

const EMPTY_HEADERS: Readonly<Record<string, string>> = Object.freeze({});
const SSE_ERROR_PREFIX = Buffer.from('data: ');
const SSE_DONE = Buffer.from('\n\ndata: [DONE]\n\n');
/** A mid-stream error event in older vLLM's flat shape (rewritten to the current one). */
const SSE_FLAT_ERROR = Buffer.from('data: {"object":"error"');
const EVENT_END = Buffer.from('\n\n');

/**
 * Length of the longest proper prefix of a flat error event that `chunk`
 * ends with, starting where an event can start (after a blank line or at the
 * chunk's start); 0 if none. Token chunks end with a blank line: one compare.
 */
function flatErrorStartAtEnd(chunk: Buffer): number {
  const n = chunk.length;
  if (n === 0 || chunk[n - 1] === 10) return 0;
  for (let k = Math.min(n, SSE_FLAT_ERROR.length - 1); k > 0; k--) {
    const at = n - k;
    if (at !== 0 && (at < 2 || chunk[at - 1] !== 10 || chunk[at - 2] !== 10)) continue;
    if (chunk.compare(SSE_FLAT_ERROR, 0, k, at, n) === 0) return k;
  }
  return 0;
}
/** Largest upstream error body the router buffers to rewrite into the current shape. */
const MAX_ERROR_BODY = 65536;

/** uWS hands header values over one char per byte: echo non-ASCII ones as their original bytes. */
export function headerBytes(s: string): string | Buffer {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0x7f) return Buffer.from(s, 'latin1');
  return s;
}

// Module-level cork targets: uWS cork takes a callback; these avoid a closure per write.
let cur: ProxyRequest;
let curChunk: Buffer | string = '';
function corkedWrite(): void {
  cur.writeChunk(curChunk);
}
function corkedEnd(): void {
  cur.endWith(curChunk);
}
function corkedError(): void {
  cur.writeError();
}

export class ProxyRequest implements Decision, UpstreamSink, RequestInfo, AbortLike {
  // Decision
  endpoint!: Endpoint;
  seq = 0;
  promptBlocks = 0;
  matchedBlocks = 0;
  // AbortLike
  aborted = false;
  onabort: (() => void) | null = null;
  // RequestInfo
  requestId: string;
  /** The x-request-id value as written back to the client (see headerBytes). */
  readonly requestIdHeader: string | Buffer;
  model = '';
  readonly path: string;
  body: Readonly<Record<string, unknown>> = EMPTY_HEADERS;
  headers: Readonly<Record<string, string>> = EMPTY_HEADERS;
  bodyBytes = 0;
  promptBytes = 0;

  readonly core: RouterCore;
  readonly res: HttpResponse;
  readonly kind: number;
  authorization: string;
  contentLength: number;
  readStart = 0;
  /** Position in core.reading while the body is being read; -1 otherwise. */
  readSlot = -1;
  #raw: Buffer | null = null;
  #received = 0;
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
  /** The answer is an SSE stream (only those can carry mid-stream error events to rewrite). */
  #sse = false;
  #upstreamLength = -1;
  #started = false;
  #clientEnded = false;
  #done = false;
  #paused = false;
  #onWritable: ((offset: number) => boolean) | null = null;
  #errorMessage = '';
  /** An upstream error answer (status >= 400, not SSE) being buffered to normalise its shape. */
  #errorBody: Buffer[] | null = null;
  #errorBytes = 0;
  /** The tail of an SSE stream that may be an incomplete flat-shape error event, held for the next chunk. */
  #sseHold: Buffer | null = null;

  /** `requestIdHeader`: requestId as headerBytes() gives it (the router's own ids are ASCII: no scan). */
  constructor(
    core: RouterCore,
    res: HttpResponse,
    kind: number,
    requestId: string,
    requestIdHeader: string | Buffer,
    authorization: string,
    contentLength: number,
  ) {
    this.core = core;
    this.res = res;
    this.kind = kind;
    this.path = KIND_PATHS[kind];
    this.requestId = requestId;
    this.requestIdHeader = requestIdHeader;
    this.authorization = authorization;
    this.contentLength = contentLength;
  }

  // ---- request body -------------------------------------------------------

  onBodyChunk(ab: ArrayBuffer, isLast: boolean): void {
    if (this.#done) return;
    const n = ab.byteLength;
    const limit = this.core.limits.maxBodyBytes;
    if (this.#received + n > limit) {
      this.core.reading.delete(this);
      this.reply(413, `request body exceeds the limit of ${limit} bytes`, null, true);
      return;
    }
    if (isLast && this.#received === 0) {
      const b = Buffer.allocUnsafe(n);
      b.set(new Uint8Array(ab));
      this.#raw = b;
      this.#received = n;
    } else if (n > 0) {
      let raw = this.#raw;
      if (raw === null || raw.length < this.#received + n) {
        // Grow by doubling; trust the declared Content-Length only up to 64 KiB,
        // so idle connections that announce large bodies cannot reserve memory.
        const want = Math.min(limit, Math.max(Math.min(this.contentLength, 65536), (this.#received + n) * 2, 16384));
        const next = Buffer.allocUnsafe(want);
        if (raw !== null) raw.copy(next, 0, 0, this.#received);
        this.#raw = raw = next;
      }
      raw.set(new Uint8Array(ab), this.#received);
      this.#received += n;
    }
    if (!isLast) return;
    this.core.reading.delete(this);
    try {
      this.#process();
    } catch (err) {
      this.internalError(err);
    }
  }

  /** A bug or a throwing plugin/gate: answer 500 and log, never crash the process. */
  internalError(err: unknown): void {
    this.core.log.error({ err, id: this.requestId }, 'internal error while handling a request');
    this.reply(500, `internal error: ${(err as Error)?.message ?? String(err)}`, null, false);
  }

  #process(): void {
    const raw = this.#raw === null ? Buffer.alloc(0) : this.#raw.length === this.#received ? this.#raw : this.#raw.subarray(0, this.#received);
    this.#raw = raw;
    this.bodyBytes = raw.length;
    let parsed: unknown;
    try {
      parsed = JSON.parse(raw.toString('utf8'));
    } catch (err) {
      this.reply(400, `invalid JSON in request body: ${(err as Error).message}`, null, false);
      return;
    }
    if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
      this.reply(400, 'the request body must be a JSON object', null, false);
      return;
    }
    const body = parsed as Record<string, unknown>;
    this.body = body;
    const model = body.model;
    if (typeof model !== 'string' || model.length === 0) {
      this.reply(400, "missing required field 'model' (a non-empty string)", 'model', false);
      return;
    }
    this.model = model;
    if (!this.#renderPrompt()) {
      const field = this.kind === KIND_CHAT ? 'messages' : 'prompt';
      const what = this.kind === KIND_CHAT ? 'a non-empty list of {role, content} objects' : 'a string, a list of strings or a list of token ids';
      this.reply(400, `missing or invalid field '${field}' (${what})`, field, false);
      return;
    }
    const core = this.core;
    if (!core.scheduler.hasModel(model)) {
      this.reply(404, `The model \`${model}\` does not exist.`, 'model', false);
      return;
    }
    const a = core.gate.admit(this, this);
    if (typeof (a as Promise<Admission>).then === 'function') {
      this.#promptCopy = Uint8Array.prototype.slice.call(core.prompt.view());
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

  #renderPrompt(): boolean {
    const pw = this.core.prompt;
    pw.reset();
    const ok = this.kind === KIND_CHAT ? pw.chat(this.body.messages) : pw.completion(this.body.prompt);
    this.promptBytes = pw.length;
    return ok;
  }

  #onAdmission(a: Admission): void {
    if (a.admitted) {
      if (this.aborted || this.#done) {
        this.core.gate.release(a.ticket, 'aborted');
        return;
      }
      this.#admitted = true;
      this.#ticket = a.ticket;
      this.#dispatch();
      return;
    }
    if (this.aborted || this.#done) return;
    this.core.metrics.rejected.set(a.reason, (this.core.metrics.rejected.get(a.reason) ?? 0) + 1);
    this.core.rejectReason = a.reason;
    this.core.retryAfter = a.retryAfterSeconds ?? 0;
    this.reply(a.status, a.message, null, false);
  }

  // ---- dispatch -------------------------------------------------------------

  #dispatch(): void {
    const core = this.core;
    const sreq = core.schedRequest;
    sreq.model = this.model;
    if (this.#promptCopy !== null) sreq.prompt = this.#promptCopy;
    else {
      if (this.#attempts > 0) this.#renderPrompt(); // the shared writer was reused since
      sreq.prompt = core.prompt.view();
    }
    const t0 = performance.now();
    const d = core.scheduler.pick(sreq, this.#tried, this, t0);
    const t1 = performance.now();
    sreq.prompt = undefined;
    core.metrics.decision.observe((t1 - t0) / 1000);
    if (d === null) {
      if (this.#tried !== null) this.reply(502, `all endpoints tried for model \`${this.model}\` failed: ${this.#errorMessage}`, null, false);
      else this.reply(503, `no ready endpoint for model \`${this.model}\``, null, false);
      return;
    }
    this.#picked = true;
    core.metrics.promptBlocks += this.promptBlocks;
    core.metrics.matchedBlocks += this.matchedBlocks;
    this.#dispatchedAt = t1;
    const headers = this.authorization
      ? ['content-type', 'application/json', 'x-request-id', this.requestId, 'authorization', this.authorization]
      : ['content-type', 'application/json', 'x-request-id', this.requestId];
    const call = core.upstream.send(this.endpoint, { method: 'POST', path: this.path, headers, body: this.#raw }, this);
    // a client may fail the call synchronously (a closed pool): the nested retry or end already took over
    if (this.#call === null && !this.#done) this.#call = call;
  }

  #canRetry(): boolean {
    return !this.#started && !this.aborted && this.#attempts < this.core.maxRetries;
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
    this.core.metrics.retries++;
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
    if (outcome === 'failed' && (!this.#started || this.#status >= 500) && this.promptBlocks > this.matchedBlocks) {
      // cold path: the engine never took the prompt, so the prefix scorer
      // forgets the blocks this pick recorded (it needs the prompt again)
      const sreq = this.core.schedRequest;
      sreq.model = this.model;
      if (this.#promptCopy !== null) sreq.prompt = this.#promptCopy;
      else {
        this.#renderPrompt();
        sreq.prompt = this.core.prompt.view();
      }
      try {
        this.core.scheduler.complete(this, outcome, sreq);
      } finally {
        sreq.prompt = undefined;
      }
      return;
    }
    this.core.scheduler.complete(this, outcome);
  }

  // ---- upstream sink ----------------------------------------------------------

  onUpstreamHeaders(status: number, contentType: string, contentLength: number): void {
    if (this.aborted) return;
    if (status >= 500 && this.#canRetry()) {
      this.#retry(`endpoint ${this.endpoint.name} answered HTTP ${status}`);
      return;
    }
    this.core.metrics.ttft[this.endpoint.id].observe((performance.now() - this.#dispatchedAt) / 1000);
    this.#status = status;
    this.#contentType = contentType === '' ? 'application/json' : contentType;
    this.#sse = contentType.startsWith('text/event-stream');
    this.#upstreamLength = contentLength;
    this.#errorBytes = 0;
    this.#errorBody = status >= 400 && !this.#sse && contentLength <= MAX_ERROR_BODY ? [] : null;
  }

  onUpstreamData(chunk: Buffer): void {
    if (this.aborted || this.#clientEnded) return;
    const eb = this.#errorBody;
    if (eb !== null) {
      this.#errorBytes += chunk.length;
      if (this.#errorBytes <= MAX_ERROR_BODY) {
        eb.push(Buffer.from(chunk)); // a copy: the client may reuse the chunk's memory
        return;
      }
      // too large to be an error object: relay what was held, then stream on
      this.#errorBody = null;
      for (const held of eb) this.#relay(held);
    } else if (this.#sse && this.#status === 200) {
      chunk = this.#sseErrors(chunk);
      if (chunk.length === 0) return;
    }
    this.#relay(chunk);
  }

  /**
   * Rewrites flat-shape error events of an SSE stream into the current shape,
   * also when an event arrives split over reads: a tail that is (or may
   * become) an incomplete flat error event is held back and joined to the
   * next chunk. Plain token events pass without a copy.
   */
  #sseErrors(chunk: Buffer): Buffer {
    const held = this.#sseHold;
    if (held !== null) {
      this.#sseHold = null;
      chunk = Buffer.concat([held, chunk]);
    }
    let cut = chunk.length;
    const at = chunk.lastIndexOf(SSE_FLAT_ERROR);
    if (at >= 0 && chunk.indexOf(EVENT_END, at) < 0) cut = at;
    else cut -= flatErrorStartAtEnd(chunk);
    if (cut < chunk.length) {
      if (chunk.length - cut > MAX_ERROR_BODY) cut = chunk.length; // too long for an error event: relay as it is
      else {
        this.#sseHold = Buffer.from(chunk.subarray(cut)); // a copy: the client may reuse the chunk's memory
        chunk = chunk.subarray(0, cut);
      }
    }
    // `at` < 0: the chunk holds no flat error event (the common case, one search per chunk)
    return at >= 0 && chunk.indexOf(SSE_FLAT_ERROR) >= 0 ? this.#rewriteSseError(chunk) : chunk;
  }

  /** Relays a held SSE tail as it is (the stream ended or failed before it completed). */
  #flushSseHold(): void {
    const held = this.#sseHold;
    if (held === null) return;
    this.#sseHold = null;
    this.#relay(held.indexOf(EVENT_END) >= 0 ? this.#rewriteSseError(held) : held);
  }

  #relay(chunk: Buffer): void {
    cur = this;
    curChunk = chunk;
    if (!this.#started && this.#upstreamLength === chunk.length) this.res.cork(corkedEnd);
    else this.res.cork(corkedWrite);
    curChunk = '';
  }

  onUpstreamEnd(): void {
    if (this.aborted) return;
    if (!this.#clientEnded) {
      this.#flushSseHold();
      cur = this;
      curChunk = '';
      const eb = this.#errorBody;
      if (eb !== null) {
        this.#errorBody = null;
        const raw = eb.length === 1 ? eb[0]! : Buffer.concat(eb);
        const fixed = normalizeErrorBody(raw.toString('utf8'), this.#status);
        if (fixed !== null) {
          curChunk = fixed;
          this.#contentType = 'application/json';
        } else curChunk = raw;
      }
      this.res.cork(corkedEnd);
    }
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
      this.reply(502, `upstream endpoint ${this.endpoint.name} failed: ${err.message}`, null, false);
      return;
    }
    this.#errorMessage = err.message;
    if (!this.#clientEnded) {
      this.#flushSseHold();
      cur = this;
      this.res.cork(corkedError);
    }
    this.#finish('failed', this.#status);
  }

  // ---- client writes (called inside cork) -------------------------------------

  /** `streamed`: the body follows in write() calls (chunked), not in the one end(). */
  #writeHead(streamed: boolean): void {
    const res = this.res;
    if (this.#status !== 200) res.writeStatus(statusLine(this.#status)); // uWS writes 200 OK itself (one native call less)
    // content-type, x-switchyard-endpoint and x-request-id in one uWS call: the
    // first two lines and the third's name are one cached block (uWS writes a
    // header's name and value verbatim, so the bytes are those of three calls)
    res.writeHeader(this.core.headerBlock(this.endpoint, this.#contentType), this.requestIdHeader);
    // draining: a stream says it closes its connection (a whole answer's end() does that itself)
    if (streamed && this.core.draining) res.writeHeader('connection', 'close');
    this.#started = true;
  }

  /** Rewrites complete flat-shape error events of a chunk into the current shape. */
  #rewriteSseError(chunk: Buffer): Buffer {
    const text = chunk.toString('utf8');
    return Buffer.from(
      text.replace(/data: (\{"object":"error".*?\})\n\n/g, (whole, json: string) => {
        const fixed = normalizeErrorBody(json, 500);
        return fixed === null ? whole : `data: ${fixed}\n\n`;
      }),
    );
  }

  writeChunk(chunk: Buffer | string): void {
    if (!this.#started) this.#writeHead(true);
    if (!this.res.write(chunk) && !this.#paused) {
      // the client is slower than the engine: stop reading upstream until uWS drains
      this.#paused = true;
      this.core.metrics.pauses++;
      this.#call?.pause();
      this.res.onWritable((this.#onWritable ??= () => this.#drained()));
    }
  }

  #drained(): boolean {
    this.#paused = false;
    this.#call?.resume();
    return true;
  }

  endWith(chunk: Buffer | string): void {
    const whole = !this.#started; // the answer is this one end (with a content-length), not a chunked stream
    if (whole) this.#writeHead(false);
    this.#clientEnded = true;
    // draining: the connection closes after the answer, so the client's next request goes
    // to a router that is staying (a stream was told so by its connection: close header;
    // uWS cuts a chunked stream's last chunk when asked to close with it)
    this.res.end(chunk, whole && this.core.draining);
  }

  writeError(): void {
    this.#clientEnded = true;
    const msg = `upstream endpoint ${this.endpoint.name} failed mid-response: ${this.#errorMessage}`;
    if (this.#contentType.startsWith('text/event-stream')) {
      this.res.write(SSE_ERROR_PREFIX);
      this.res.write(errorBody(502, msg));
      this.res.end(SSE_DONE);
    } else {
      this.res.close();
    }
  }

  // ---- ends ---------------------------------------------------------------------

  #finish(outcome: Outcome, status: number): void {
    if (this.#done) return;
    this.#done = true;
    // the body is no longer needed (no retry after this); module-level cork state may keep this object alive
    this.#raw = null;
    this.#promptCopy = null;
    this.#release(outcome);
    const core = this.core;
    if (this.#admitted) {
      this.#admitted = false;
      core.gate.release(this.#ticket, outcome);
    }
    core.metrics.countRequest(this.model, this.endpoint ? this.endpoint.id : -1, status);
    core.requestEnded(this, status);
  }

  /** Answers with an OpenAI error (or ends the request) and releases everything. */
  reply(status: number, message: string, param: string | null, closeConnection: boolean): void {
    if (this.#done || this.aborted) return;
    this.#call?.abort();
    this.#call = null;
    const failed = status >= 500;
    this.#release(failed ? 'failed' : 'ok');
    this.#clientEnded = true;
    const res = this.res;
    const ep = this.endpoint;
    const reason = this.core.rejectReason;
    const retryAfter = this.core.retryAfter;
    this.core.rejectReason = '';
    this.core.retryAfter = 0;
    res.cork(() => {
      res.writeStatus(statusLine(status));
      res.writeHeader('content-type', 'application/json');
      res.writeHeader('x-request-id', this.requestIdHeader);
      if (ep) res.writeHeader('x-switchyard-endpoint', ep.name);
      if (reason) res.writeHeader('x-switchyard-dropped-reason', reason);
      if (retryAfter > 0) res.writeHeader('retry-after', String(Math.ceil(retryAfter)));
      res.end(errorBody(status, message, param), closeConnection || this.core.draining);
    });
    this.#finish(failed ? 'failed' : 'ok', status);
  }

  /** uWS onAborted: the client went away. Abort upstream, release all accounting. */
  onClientAbort(): void {
    if (this.aborted) return;
    this.aborted = true;
    this.core.reading.delete(this);
    this.#call?.abort();
    this.#call = null;
    const wasDone = this.#done;
    if (!wasDone) {
      this.#done = true;
      this.#release('aborted');
      if (this.#admitted) {
        this.#admitted = false;
        this.core.gate.release(this.#ticket, 'aborted');
      }
      this.core.metrics.countRequest(this.model, this.endpoint ? this.endpoint.id : -1, 499);
      this.core.requestEnded(this, 499);
    }
    const cb = this.onabort;
    this.onabort = null;
    cb?.();
  }
}
