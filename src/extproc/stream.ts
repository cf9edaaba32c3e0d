// One ext_proc stream's state machine: the request headers (an inference
// path or not), the body (buffered up to limits.maxBodyBytes), the decision
// (Director.decide, answered as the destination or an ImmediateResponse),
// then the response path that completes the decision.
import * as grpc from '@grpc/grpc-js';
import type { Rejected } from '../admission.js';
import { KIND_CHAT, KIND_COMPLETION, type DecisionPort, type Director, type Flight } from '../director/director.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import { isRefusal, type Caller, type Refusal } from '../identity.js';
import { errorBody } from '../proxy/error-shape.js';
import { errorOutcome, OUTCOME_TIMEOUT, statusOutcome } from '../metrics/outcomes.js';
import { CONTINUE, FULL_DUPLEX_STREAMED, SERVED_KEY, headerText, setHeader, type Destination, type HeaderValue, type ProcessingRequest } from './codec.js';

/** What a stream needs of its server. */
export interface StreamHost {
  readonly core: {
    readonly director: Director;
    readonly limits: { maxBodyBytes: number };
    readonly gate: { readonly headerNames: readonly string[] };
    newRequestId(): string;
    /** Who a request is, or a Refusal (401) when authentication requires a key it lacks. */
    callerOf(get: (name: string) => string): Caller | Refusal;
    /** The router's outcome counters and duration / TTFT histograms, as an HTTP request's end counts them (RouterCore.requestEnded). */
    readonly metrics: {
      countOutcome(model: string, outcome: number, reason: string, seconds: number, ttftSeconds: number): void;
      countRequest(model: string, endpointId: number, status: number): void;
    };
  };
  readonly namespace: string;
  /** Streams ended on a message the server could not make sense of (a counter). */
  malformed: number;
  /** Request body bytes buffered awaiting a decision, over all streams (extProc.maxBufferedBytes). */
  buffered: number;
  readonly maxBuffered: number;
  destinationFor(f: Flight): Destination;
  endpointAt(address: string): Endpoint | undefined;
}

const KINDS: Record<string, number> = { '/v1/chat/completions': KIND_CHAT, '/v1/completions': KIND_COMPLETION };

/** One ext_proc stream: one HTTP request and its response, as the proxy reports them. */
export class ExtProcStream implements DecisionPort {
  readonly #s: StreamHost;
  readonly #call: grpc.ServerDuplexStream<ProcessingRequest, unknown>;
  #duplex = false;
  #duplexResponse = false;
  #kind = -1;
  #headers: HeaderValue[] = [];
  #body: Buffer[] = [];
  #bodyBytes = 0;
  #flight: Flight | null = null;
  /** The request headers answer is still owed (duplex mode: it carries the decision). */
  #headersOwed = false;
  #deciding = false;
  #decided = false;
  /** The body ended with request trailers (their answer carries the decision's metadata). */
  #byTrailers = false;
  #status = 0;
  #servedBy: Endpoint | null = null;
  #ended = false;
  #closed = false;
  /**
   * The outcome metrics (src/metrics/outcomes.ts): when the inference request's headers came (0: not an
   * inference request, nothing counted), when the response's first body bytes passed (0: none), how it
   * ended when that is decided before its end (-1: by its status), the gate's reason, and whether it was
   * counted (once). The end comes from `done` (the director's flight), or from an ImmediateResponse
   * given before there was a flight.
   */
  #startedAt = 0;
  #firstByteAt = 0;
  #outcome = -1;
  #reason = '';
  #counted = false;
  /** Inside Director.decide(): an end reported there waits until decide returns the flight (its model). */
  #inDecide = false;
  #endedInDecide = -1;
  /** When the last message came (ms, the server's clock tick), for the idle timeout. */
  lastMessageAt: number;
  /** When the decision was answered (0: not yet), for the decision timeout. */
  decidedAt = 0;

  constructor(s: StreamHost, call: grpc.ServerDuplexStream<ProcessingRequest, unknown>) {
    this.#s = s;
    this.#call = call;
    this.lastMessageAt = Date.now();
  }

  /** This stream's part of the global buffered-body budget, given back. */
  #unbuffer(): void {
    this.#s.buffered -= this.#charged;
    this.#charged = 0;
  }
  #charged = 0;

  /**
   * The stream outlived a timeout (idle, or decision without a completed
   * response): the decision is released as a client abort (its in-flight slot
   * freed now, not when the connection closes) and the stream ends with
   * DEADLINE_EXCEEDED.
   */
  expire(why: string): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#unbuffer();
    if (this.#outcome < 0) this.#outcome = OUTCOME_TIMEOUT;
    // its done() counts it (as a timeout) with the flight's model
    this.#flight?.clientAborted();
    this.#flight = null;
    this.#call.emit('error', Object.assign(new Error(why), { code: grpc.status.DEADLINE_EXCEEDED, details: why }));
  }

  #send(m: unknown): void {
    if (this.#closed) return;
    this.#call.write(m);
  }

  /** Ends the stream with a gRPC error (the proxy then fails the request or goes on, by its failure_mode_allow). */
  abort(code: grpc.status, details: string): void {
    if (this.#closed) return;
    this.#s.malformed++;
    this.#closed = true;
    this.#unbuffer();
    this.#flight?.clientAborted();
    // grpc-js: an 'error' on a server stream becomes its status, then the stream ends
    this.#call.emit('error', Object.assign(new Error(details), { code, details }));
  }

  onMessage(m: ProcessingRequest, at: number): void {
    if (this.#closed) return;
    this.lastMessageAt = at;
    if (m.protocol_config) {
      this.#duplex = m.protocol_config.request_body_mode === FULL_DUPLEX_STREAMED;
      this.#duplexResponse = m.protocol_config.response_body_mode === FULL_DUPLEX_STREAMED;
    }
    switch (m.request) {
      case 'request_headers':
        return this.#requestHeaders(m);
      case 'request_body':
        return this.#requestBody(m);
      case 'request_trailers':
        if (this.#kind < 0 || this.#decided) this.#send(CONTINUE.REQUEST_TRAILERS);
        else {
          // trailers end the body; their answer follows the decision
          this.#byTrailers = true;
          this.#endOfRequest();
        }
        return;
      case 'response_headers':
        return this.#responseHeaders(m);
      case 'response_body':
        return this.#responseBody(m);
      case 'response_trailers':
        this.#send(CONTINUE.RESPONSE_TRAILERS);
        this.#complete();
        return;
      default:
        this.abort(grpc.status.INVALID_ARGUMENT, 'a ProcessingRequest with none of request_headers, request_body, request_trailers, response_headers, response_body, response_trailers');
    }
  }

  #requestHeaders(m: ProcessingRequest): void {
    if (this.#kind >= 0 || this.#headersOwed) return this.abort(grpc.status.INVALID_ARGUMENT, 'request_headers sent twice on one stream');
    const hs = m.request_headers?.headers?.headers ?? [];
    let path = '';
    let method = '';
    for (const h of hs) {
      if (h.key === ':path') path = headerText(h);
      else if (h.key === ':method') method = headerText(h);
    }
    const q = path.indexOf('?');
    const kind = KINDS[q >= 0 ? path.slice(0, q) : path];
    if (kind === undefined || method !== 'POST') {
      // not an inference request: the proxy routes it as it would without us
      this.#send(CONTINUE.REQUEST_HEADERS);
      return;
    }
    this.#kind = kind;
    this.#headers = hs;
    this.#startedAt = performance.now();
    if (m.request_headers?.end_of_stream) {
      this.#immediate(400, `POST ${path} needs a JSON body`, null, null);
      this.#answeredAlone(400, '');
      return;
    }
    if (this.#duplex) this.#headersOwed = true;
    else this.#send(CONTINUE.REQUEST_HEADERS);
  }

  #requestBody(m: ProcessingRequest): void {
    const b = m.request_body;
    if (this.#kind < 0 || this.#deciding) {
      // a body we do not route on (or a chunk after the end): pass it on unchanged
      this.#send(this.#duplex ? { request_body: { response: { body_mutation: { streamed_response: { body: b?.body ?? Buffer.alloc(0), end_of_stream: b?.end_of_stream === true } } } } } : CONTINUE.REQUEST_BODY);
      return;
    }
    const chunk = b?.body;
    if (chunk !== undefined && chunk.length > 0) {
      this.#bodyBytes += chunk.length;
      const max = this.#s.core.limits.maxBodyBytes;
      if (this.#bodyBytes > max) {
        this.#unbuffer();
        this.#body = [];
        this.#immediate(413, `request body of more than ${max} bytes exceeds the limit`, null, null);
        this.#answeredAlone(413, '');
        return;
      }
      if (this.#s.buffered + chunk.length > this.#s.maxBuffered) {
        this.#unbuffer();
        this.#body = [];
        this.#immediate(503, `the router's buffer for ext_proc request bodies (extProc.maxBufferedBytes, ${this.#s.maxBuffered} bytes) is full: retry shortly`, null, null);
        this.#answeredAlone(503, '');
        return;
      }
      this.#s.buffered += chunk.length;
      this.#charged += chunk.length;
      this.#body.push(chunk);
    }
    if (b?.end_of_stream) this.#endOfRequest();
    else if (!this.#duplex) this.#send(CONTINUE.REQUEST_BODY); // STREAMED mode: every chunk is answered
  }

  #endOfRequest(): void {
    if (this.#deciding) return;
    this.#deciding = true;
    const core = this.#s.core;
    const names = core.gate.headerNames;
    const gateHeaders: Record<string, string> = {};
    for (const n of names) gateHeaders[n] = '';
    let id = '';
    for (const h of this.#headers) {
      const k = h.key ?? '';
      if (k === 'x-request-id') id = headerText(h);
      if (k in gateHeaders) gateHeaders[k] = headerText(h);
    }
    const caller = core.callerOf((name) => {
      for (const h of this.#headers) if (h.key === name) return headerText(h);
      return '';
    });
    if (isRefusal(caller)) {
      this.#body = [];
      this.#immediate(401, caller.refused, null, null);
      this.#answeredAlone(401, '');
      return;
    }
    if (id === '' || id.length > 256) id = core.newRequestId();
    const body = this.#body.length === 1 ? this.#body[0] : Buffer.concat(this.#body);
    this.#body = [];
    if (this.#duplex) this.#echo = body; // goes back to the proxy with the decision
    this.#inDecide = true;
    try {
      this.#flight = core.director.decide(this, this.#kind, id, caller, gateHeaders, body);
    } finally {
      this.#inDecide = false;
    }
    if (this.#endedInDecide >= 0) {
      // answered inside decide (a bad body, no endpoint, shed): counted now, with the flight's model
      const f = this.#flight;
      this.#flight = null;
      this.#count(f?.model ?? '', this.#endedInDecide);
    }
  }

  // ---- DecisionPort ---------------------------------------------------------------------

  picked(f: Flight): void {
    if (this.#closed) return;
    this.#decided = true;
    this.decidedAt = Date.now();
    this.#unbuffer();
    const d = this.#s.destinationFor(f);
    if (this.#duplex) {
      // the headers answer carries the decision; then the body goes back unchanged, whole
      this.#headersOwed = false;
      this.#send(d.headers);
      const body = this.#echo ?? Buffer.alloc(0);
      this.#echo = null;
      this.#send({ request_body: { response: { body_mutation: { streamed_response: { body, end_of_stream: !this.#byTrailers } } } } });
      if (this.#byTrailers) this.#send(CONTINUE.REQUEST_TRAILERS);
    } else this.#send(this.#byTrailers ? d.trailers : d.body);
  }

  /** Duplex mode: the request body, sent back with the decision. */
  #echo: Buffer | null = null;

  head(): void {}
  write(): void {}
  end(): void {}
  fail(): void {}

  error(status: number, message: string, param: string | null, endpoint: Endpoint | undefined, rejection: Rejected | null): void {
    if (this.#outcome < 0) {
      this.#outcome = errorOutcome(status, message, endpoint !== undefined, rejection !== null);
      if (rejection !== null) this.#reason = rejection.reason ?? '';
    }
    this.#immediate(status, message, param, rejection);
  }

  done(status: number): void {
    if (this.#inDecide) {
      this.#endedInDecide = status;
      return;
    }
    const f = this.#flight;
    this.#flight = null;
    this.#count(f?.model ?? '', status);
  }

  /** The request's end in the outcome metrics (once; nothing for a stream that carried no inference request). */
  #count(model: string, status: number): void {
    if (this.#counted || this.#startedAt === 0) return;
    this.#counted = true;
    const outcome = this.#outcome >= 0 ? this.#outcome : statusOutcome(status);
    const now = performance.now();
    this.#s.core.metrics.countOutcome(model, outcome, this.#reason, (now - this.#startedAt) / 1000, this.#firstByteAt > 0 ? (this.#firstByteAt - this.#startedAt) / 1000 : -1);
  }

  /** An ImmediateResponse given before the director had the request (400, 401, 413, the body buffer full): counted here, as the transport's own answer. */
  #answeredAlone(status: number, message: string): void {
    if (this.#outcome < 0) this.#outcome = errorOutcome(status, message, false, false);
    this.#s.core.metrics.countRequest('', -1, status);
    this.#count('', status);
  }

  // ---- answers ------------------------------------------------------------------------

  #immediate(status: number, message: string, param: string | null, rejection: Rejected | null): void {
    const set_headers = [setHeader('content-type', 'application/json')];
    let details = `switchyard: ${status}`;
    if (rejection !== null) {
      if (rejection.reason) {
        set_headers.push(setHeader('x-switchyard-dropped-reason', rejection.reason));
        details = `switchyard: ${rejection.reason}`;
      }
      const ra = rejection.retryAfterSeconds ?? 0;
      if (ra > 0) set_headers.push(setHeader('retry-after', String(Math.ceil(ra))));
    }
    this.#headersOwed = false;
    this.#decided = true;
    this.#unbuffer();
    this.#send({ immediate_response: { status: { code: status }, headers: { set_headers }, body: Buffer.from(errorBody(status, message, param)), details } });
  }

  // ---- the response path ------------------------------------------------------------------

  #responseHeaders(m: ProcessingRequest): void {
    for (const h of m.response_headers?.headers?.headers ?? []) {
      if (h.key === ':status') {
        const n = Number(headerText(h));
        this.#status = Number.isInteger(n) && n >= 100 && n <= 999 ? n : 0;
      }
    }
    const served = m.metadata_context?.filter_metadata?.[this.#s.namespace]?.fields?.[SERVED_KEY]?.stringValue;
    if (served !== undefined) this.#servedBy = this.#s.endpointAt(served.split(',')[0].trim()) ?? null;
    this.#send(CONTINUE.RESPONSE_HEADERS);
    if (m.response_headers?.end_of_stream) this.#complete();
  }

  #responseBody(m: ProcessingRequest): void {
    const b = m.response_body;
    if (this.#firstByteAt === 0 && this.#flight !== null) this.#firstByteAt = performance.now();
    if (this.#duplexResponse) this.#send({ response_body: { response: { body_mutation: { streamed_response: { body: b?.body ?? Buffer.alloc(0), end_of_stream: b?.end_of_stream === true } } } } });
    else this.#send(CONTINUE.RESPONSE_BODY);
    if (b?.end_of_stream) this.#complete();
  }

  /** The response is over: the decision completes with its status. */
  #complete(): void {
    const f = this.#flight;
    if (f === null) return;
    f.served(this.#status, this.#servedBy);
  }

  /** The stream ended (the proxy is done with the request, or the client left). */
  onEnd(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#closed = true;
    this.#unbuffer();
    const f = this.#flight;
    if (f === null) return;
    if (this.#status > 0) f.served(this.#status, this.#servedBy);
    else f.clientAborted();
  }
}
