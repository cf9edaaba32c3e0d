// One POST /v1/responses: check the body, fetch the previous response (one
// store read), rebuild the conversation by concatenating stored rendered
// messages with this turn's input, send it as a chat completion through the
// director (session key: the chain's root), translate the engine's answer
// (JSON or SSE) into a Response object or the Responses event stream, store
// the turn, and answer. It is the director's ClientPort for the chat
// completion and the transport's flight (abort, backpressure) for the client.
import { StringDecoder } from 'node:string_decoder';
import type { Logger } from 'pino';
import type { Rejected } from '../admission.js';
import { KIND_CHAT, type ClientPort, type Director, type Flight } from '../director/director.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import type { Caller } from '../identity.js';
import { newItemId, newResponseId } from './ids.js';
import { assistantMessage, deltaEvent, messageItem, outputText, responseObject, sseEvent, usageOf, type ResponseHead, type ResponseStatus, type Usage } from './render.js';
import { parseTurnRequest, ResponsesError, type TurnRequest } from './request.js';
import type { ResponsesStats } from './metrics.js';
import { isPromise, recordBytes, StoreUnavailableError, type ResponseStore, type StoredResponse } from './store.js';

/**
 * What a turn needs of the service that runs it (ResponsesService implements
 * it): the store and its timed operations, the director, limits, counters.
 * turn.ts depends on this interface, never on service.ts.
 */
export interface TurnHost {
  readonly store: ResponseStore | null;
  readonly director: Pick<Director, 'begin'>;
  readonly log: Logger;
  readonly stats: ResponsesStats;
  readonly maxInputBytes: number;
  readonly maxJsonDepth: number;
  /** The largest record the store keeps (a tenant's whole byte budget; Infinity where the store bounds itself). */
  readonly maxRecordBytes: number;
  storeGet(tenant: string, id: string): StoredResponse | null | Promise<StoredResponse | null>;
  /** False: the record was not kept (over a tenant's byte budget). */
  storePut(r: StoredResponse): boolean | Promise<boolean>;
  unavailable(): StoreUnavailableError;
  countRequest(model: string, status: number): void;
  /** Bodies larger than this are parsed off the event loop (parseOffLoop). */
  readonly parseOffloadBytes: number;
  /** Parses a large body in a worker (its memory moves there: `raw` is unusable afterwards); rejects with the ResponsesError a bad body gets. */
  parseOffLoop(raw: Buffer): Promise<TurnRequest>;
}

const MODE_NONE = 0;
/** Buffering the engine's JSON answer (200). */
const MODE_JSON = 1;
/** Translating the engine's SSE stream (200) into Responses events. */
const MODE_SSE = 2;
/** Relaying the engine's error answer (status >= 400) as it is. */
const MODE_ERROR = 3;

const SSE_TYPE = 'text/event-stream';
/** CRLF or a lone CR: an SSE line end like LF. */
const CR_EOL = /\r\n?/g;

export class ResponsesTurn implements ClientPort, ResponseHead {
  // what the transport reads of its flight
  model = '';
  readonly path = '/v1/responses';
  endpoint: Endpoint | undefined = undefined;
  // ResponseHead
  readonly id = newResponseId();
  readonly createdAt = Math.floor(Date.now() / 1000);
  req!: TurnRequest;
  readonly msgId = newItemId();
  stored = false;

  readonly #svc: TurnHost;
  readonly #client: ClientPort;
  /** The tenant the turn belongs to ('' = anonymous): the scope of every store key it reads and writes. */
  readonly #tenant: string;
  readonly #requestId: string;
  /** Who sent the turn: its inner chat request carries the same caller. */
  readonly #caller: Caller;
  readonly #headers: Readonly<Record<string, string>>;
  #parent: StoredResponse | null = null;
  #root = '';
  #flight: Flight | null = null;
  #aborted = false;
  /** client.done() was called. */
  #over = false;
  /** The director's done() status while the turn is still storing (-1: not yet). */
  #flightDone = -1;
  #storing = false;
  #mode = MODE_NONE;
  #status = 0;
  #contentType = '';
  #chunks: Buffer[] | null = null;
  // streaming
  #decoder: StringDecoder | null = null;
  #sseBuf = '';
  /** A chunk ended in '\r': held until the next shows whether it is CRLF or a lone CR. */
  #sseCr = false;
  #seq = 0;
  #text = '';
  #finishReason: string | null = null;
  #usage: Usage | null = null;
  /** The client's stream ended (completed or failed). */
  #streamEnded = false;

  constructor(svc: TurnHost, client: ClientPort, caller: Caller, requestId: string, headers: Readonly<Record<string, string>>) {
    this.#svc = svc;
    this.#client = client;
    this.#tenant = caller.tenant;
    this.#caller = caller;
    this.#requestId = requestId;
    this.#headers = headers;
  }

  // ---- start: parse, read the chain, hand the chat completion to the director ----

  start(raw: Buffer): void {
    const svc = this.#svc;
    if (raw.length > svc.parseOffloadBytes) {
      // a large body: parsed and rendered in a worker, the event loop stays free
      svc.parseOffLoop(raw).then(
        (req) => {
          if (this.#aborted || this.#over) return;
          try {
            this.#parsed(req);
          } catch (err) {
            this.#fail(err);
          }
        },
        (err: unknown) => this.#fail(err),
      );
      return;
    }
    let req: TurnRequest;
    try {
      req = parseTurnRequest(raw, svc.maxJsonDepth);
    } catch (err) {
      this.#fail(err);
      return;
    }
    this.#parsed(req);
  }

  #parsed(req: TurnRequest): void {
    const svc = this.#svc;
    this.req = req;
    this.stored = req.store;
    this.model = req.model;
    const store = svc.store;
    if ((req.store || req.previousResponseId !== null) && (store === null || !store.available)) {
      this.#fail(svc.unavailable());
      return;
    }
    if (req.previousResponseId === null) {
      this.#continue(null);
      return;
    }
    let got: StoredResponse | null | Promise<StoredResponse | null>;
    try {
      got = svc.storeGet(this.#tenant, req.previousResponseId);
    } catch (err) {
      this.#fail(err);
      return;
    }
    if (isPromise(got)) {
      got.then(
        (p) => this.#continue(p),
        (err: unknown) => this.#fail(err),
      );
    } else this.#continue(got);
  }

  #continue(parent: StoredResponse | null): void {
    if (this.#aborted || this.#over) return;
    if (parent === null && this.req.previousResponseId !== null) {
      const id = this.req.previousResponseId!;
      this.#fail(
        new ResponsesError(
          404,
          `Previous response with id '${id}' not found (it never existed, was deleted or expired, or was created with store: false).`,
          'previous_response_id',
          'previous_response_not_found',
        ),
      );
      return;
    }
    try {
      this.#send(parent);
    } catch (err) {
      this.#fail(err);
    }
  }

  #send(parent: StoredResponse | null): void {
    const req = this.req;
    this.#parent = parent;
    this.#root = parent === null ? this.id : parent.root;
    // the conversation as chat messages: instructions (this request's only), the stored turns, this input
    let messages = req.instructions !== null ? `{"role":"system","content":${JSON.stringify(req.instructions)}}` : '';
    if (parent !== null && parent.conv !== '') messages = messages === '' ? parent.conv : `${messages},${parent.conv}`;
    messages = messages === '' ? req.inputFragment : `${messages},${req.inputFragment}`;
    if (messages.length > this.#svc.maxInputBytes) {
      throw new ResponsesError(
        413,
        `the conversation (${messages.length} bytes with this input and the previous turns) exceeds responses.maxInputBytes (${this.#svc.maxInputBytes})`,
        'input',
      );
    }
    let body = `{"model":${JSON.stringify(req.model)},"messages":[${messages}]`;
    if (req.stream) body += ',"stream":true,"stream_options":{"include_usage":true}';
    if (req.maxOutputTokens !== null) body += `,"max_tokens":${req.maxOutputTokens}`;
    if (req.temperature !== null) body += `,"temperature":${req.temperature}`;
    if (req.topP !== null) body += `,"top_p":${req.topP}`;
    if (req.user !== null) body += `,"user":${JSON.stringify(req.user)}`;
    body += '}';
    // the session key: the chain's root, within the tenant (the store keys are tenant-scoped, so is the pin)
    const session = this.#tenant === '' ? this.#root : `${this.#tenant.length}:${this.#tenant}:${this.#root}`;
    this.#flight = this.#svc.director.begin(this, KIND_CHAT, this.#requestId, this.#caller, this.#headers, Buffer.from(body), session);
  }

  /** An answer of the Responses layer itself (bad input, no previous response, store down). */
  #fail(err: unknown): void {
    if (this.#aborted || this.#over) return;
    let status: number;
    let message: string;
    let param: string | null = null;
    let code: string | undefined;
    if (err instanceof ResponsesError) {
      ({ status, param } = err);
      message = err.message;
      code = err.code;
    } else if (err instanceof StoreUnavailableError) {
      status = 503;
      message = err.message;
      code = 'store_unavailable';
    } else {
      this.#svc.log.error({ err, id: this.#requestId }, 'internal error in a Responses turn');
      status = 500;
      message = `internal error: ${(err as Error)?.message ?? String(err)}`;
    }
    this.#client.error(status, message, param, this.endpoint, null, code);
    this.#svc.countRequest(this.model, status);
    this.#end(status);
  }

  #end(status: number): void {
    if (this.#over) return;
    this.#over = true;
    this.#client.done(status);
  }

  // ---- transport side: abort and backpressure -------------------------------------

  clientAborted(): void {
    if (this.#aborted) return;
    this.#aborted = true;
    const f = this.#flight;
    if (f !== null) f.clientAborted(); // a running flight calls done(499)
    if (!this.#over) {
      if (f === null) this.#svc.countRequest(this.model, 499);
      this.#end(499);
    }
  }

  pause(): void {
    this.#flight?.pause();
  }

  resume(): void {
    this.#flight?.resume();
  }

  // ---- ClientPort: the engine's chat answer ------------------------------------------

  head(status: number, contentType: string, endpoint: Endpoint): void {
    this.endpoint = endpoint;
    this.#status = status;
    this.#contentType = contentType;
    if (status >= 400 || status < 200) {
      this.#mode = MODE_ERROR;
      this.#chunks ??= [];
      return;
    }
    if (this.req.stream && contentType.startsWith(SSE_TYPE)) {
      if (this.#mode === MODE_SSE) return;
      this.#mode = MODE_SSE;
      this.#decoder = new StringDecoder('utf8');
      this.#client.head(200, SSE_TYPE, endpoint, -1);
      const item = messageItem(this.msgId, 'in_progress', null);
      const snapshot = responseObject(this, 'in_progress', null, null, null);
      this.#client.write(
        sseEvent('response.created', this.#seq++, { response: snapshot }) +
          sseEvent('response.in_progress', this.#seq++, { response: snapshot }) +
          sseEvent('response.output_item.added', this.#seq++, { output_index: 0, item }) +
          sseEvent('response.content_part.added', this.#seq++, { item_id: this.msgId, output_index: 0, content_index: 0, part: outputText('') }),
      );
      return;
    }
    this.#mode = MODE_JSON;
    this.#chunks = [];
  }

  write(chunk: Buffer | string): void {
    if (this.#mode === MODE_SSE) {
      if (!this.#streamEnded) this.#onSse(typeof chunk === 'string' ? chunk : this.#decoder!.write(chunk));
      return;
    }
    // a copy: the upstream client may reuse the chunk's memory
    if (chunk.length > 0) this.#chunks?.push(typeof chunk === 'string' ? Buffer.from(chunk) : Buffer.from(chunk));
  }

  end(chunk: Buffer | string): void {
    this.write(chunk);
    try {
      switch (this.#mode) {
        case MODE_SSE:
          if (!this.#streamEnded) this.#onSse(this.#decoder!.end() + '\n\n');
          if (!this.#streamEnded) this.#completeStream();
          return;
        case MODE_JSON:
          this.#completeJson();
          return;
        default:
          this.#relayError();
      }
    } catch (err) {
      this.#svc.log.error({ err, id: this.#requestId }, 'internal error translating a Responses answer');
      if (this.#mode === MODE_SSE) this.#streamFailed('server_error', `internal error: ${(err as Error).message}`);
      else {
        this.#svc.stats.failed++;
        this.#client.error(500, `internal error: ${(err as Error).message}`, null, this.endpoint, null);
      }
    }
  }

  fail(_sseEvent: string | null): void {
    const msg = `upstream endpoint ${this.endpoint?.name ?? ''} failed mid-response`;
    if (this.#mode === MODE_SSE) this.#streamFailed('server_error', msg);
    else {
      this.#svc.stats.failed++;
      this.#client.error(502, msg, null, this.endpoint, null);
    }
  }

  error(status: number, message: string, param: string | null, endpoint: Endpoint | undefined, rejection: Rejected | null, code?: string): void {
    if (status !== 499) this.#svc.stats.failed++;
    this.#client.error(status, message, param, endpoint, rejection, code);
  }

  done(status: number): void {
    if (this.#storing) this.#flightDone = status;
    else this.#end(status);
  }

  // ---- translation ------------------------------------------------------------------

  /** A Response goes out: counted as a new conversation or a continuation. */
  #answered(): void {
    if (this.#parent === null) this.#svc.stats.created++;
    else this.#svc.stats.continued++;
  }

  #relayError(): void {
    this.#svc.stats.failed++;
    const chunks = this.#chunks ?? [];
    const body = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
    this.#client.head(this.#status, this.#contentType || 'application/json', this.endpoint!, body.length);
    this.#client.end(body);
  }

  #completeJson(): void {
    const chunks = this.#chunks!;
    const raw = (chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)).toString('utf8');
    let o: { choices?: { message?: { content?: unknown }; finish_reason?: unknown }[]; usage?: unknown; error?: { message?: unknown } };
    try {
      o = JSON.parse(raw);
    } catch {
      this.#svc.stats.failed++;
      this.#client.error(502, `endpoint ${this.endpoint?.name} answered with a body that is not JSON`, null, this.endpoint, null);
      return;
    }
    const choice = o.choices?.[0];
    if (choice === undefined) {
      const m = typeof o.error?.message === 'string' ? o.error.message : 'no choices in the chat completion';
      this.#svc.stats.failed++;
      this.#client.error(502, `endpoint ${this.endpoint?.name} answered without a completion: ${m}`, null, this.endpoint, null);
      return;
    }
    const text = typeof choice.message?.content === 'string' ? choice.message.content : '';
    const status: ResponseStatus = choice.finish_reason === 'length' ? 'incomplete' : 'completed';
    const usage = usageOf(o.usage);
    this.#store(text, () => JSON.stringify(responseObject(this, status, text, usage, null)), (body) => {
      this.#answered();
      this.#client.head(200, 'application/json', this.endpoint!, Buffer.byteLength(body));
      this.#client.end(body);
    });
  }

  #onSse(text: string): void {
    // SSE lines end in LF, CRLF or CR: normalise to LF (a CR at a chunk's end waits for the next chunk)
    if (this.#sseCr) {
      text = '\r' + text;
      this.#sseCr = false;
    }
    if (text.indexOf('\r') >= 0) {
      if (text.charCodeAt(text.length - 1) === 13) {
        this.#sseCr = true;
        text = text.slice(0, -1);
      }
      text = text.replace(CR_EOL, '\n');
    }
    let buf = this.#sseBuf + text;
    let out = '';
    let at: number;
    while ((at = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, at);
      buf = buf.slice(at + 2);
      // an event's data lines (the engines send one per event)
      for (const line of block.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.charCodeAt(5) === 32 ? line.slice(6) : line.slice(5);
        if (data === '[DONE]') continue;
        let o: { choices?: { delta?: { content?: unknown }; finish_reason?: unknown }[]; usage?: unknown; error?: { message?: unknown } };
        try {
          o = JSON.parse(data);
        } catch {
          continue;
        }
        if (o.error !== undefined && o.error !== null) {
          if (out !== '') this.#client.write(out);
          this.#sseBuf = '';
          this.#streamFailed('server_error', typeof o.error.message === 'string' ? o.error.message : 'the engine failed mid-stream');
          return;
        }
        const c = o.choices?.[0];
        if (c !== undefined) {
          const d = c.delta?.content;
          if (typeof d === 'string' && d.length > 0) {
            this.#text += d;
            out += deltaEvent(this.#seq++, this.msgId, d);
          }
          if (typeof c.finish_reason === 'string') this.#finishReason = c.finish_reason;
        }
        if (o.usage !== undefined && o.usage !== null) this.#usage = usageOf(o.usage);
      }
    }
    this.#sseBuf = buf;
    if (out !== '') this.#client.write(out);
  }

  #completeStream(): void {
    const text = this.#text;
    const status: ResponseStatus = this.#finishReason === 'length' ? 'incomplete' : 'completed';
    const part = outputText(text);
    const id = this.msgId;
    this.#client.write(
      sseEvent('response.output_text.done', this.#seq++, { item_id: id, output_index: 0, content_index: 0, text, logprobs: [] }) +
        sseEvent('response.content_part.done', this.#seq++, { item_id: id, output_index: 0, content_index: 0, part }) +
        sseEvent('response.output_item.done', this.#seq++, { output_index: 0, item: messageItem(id, status === 'incomplete' ? 'incomplete' : 'completed', text) }),
    );
    let final: Record<string, unknown> | null = null;
    const render = () => JSON.stringify((final = responseObject(this, status, text, this.#usage, null)));
    this.#store(text, render, () => {
      this.#answered();
      this.#streamEnded = true;
      this.#client.end(sseEvent(status === 'incomplete' ? 'response.incomplete' : 'response.completed', this.#seq++, { response: final }));
    });
  }

  /**
   * The stream fails after its 200 went out (the engine's error event, its
   * connection lost mid-stream, the turn not stored): an `error` event
   * (`{type, code, message, param, sequence_number}`, as OpenAI sends it) and
   * then `response.failed` with the error on the response, the stream's last
   * event. The openai SDKs yield both to the caller's iterator.
   */
  #streamFailed(code: string, message: string): void {
    if (this.#streamEnded) return;
    this.#streamEnded = true;
    const r = responseObject(this, 'failed', null, this.#usage, { code, message });
    const err = sseEvent('error', this.#seq++, { code, message, param: null });
    this.#client.end(err + sseEvent('response.failed', this.#seq++, { response: r }));
    this.#svc.stats.failed++;
  }

  /**
   * Renders the Response, stores the turn (when `store`), then sends; a store
   * failure answers 503 (or response.failed) instead. A turn too large for
   * the tenant's byte budget is not stored and its object says `store: false`
   * (never an id that would 404).
   */
  #store(text: string, render: () => string, send: (body: string) => void): void {
    const req = this.req;
    if (!req.store) {
      send(render());
      return;
    }
    const responseJson = render();
    const p = this.#parent;
    const turn = `${req.inputFragment},${assistantMessage(text)}`;
    const rec: StoredResponse = {
      tenant: this.#tenant,
      id: this.id,
      root: this.#root,
      parent: p === null ? '' : p.id,
      createdAt: this.createdAt,
      conv: p === null || p.conv === '' ? turn : `${p.conv},${turn}`,
      ids: p === null || p.ids === '' ? `${req.inputIds},${this.msgId}` : `${p.ids},${req.inputIds},${this.msgId}`,
      response: responseJson,
    };
    if (recordBytes(rec) > this.#svc.maxRecordBytes) {
      this.stored = false;
      send(render());
      return;
    }
    const failed = (err: unknown) => {
      const msg = `the response was generated but could not be stored (store: true), so it cannot be continued: ${(err as Error).message}`;
      if (this.#mode === MODE_SSE) this.#streamFailed('store_unavailable', msg);
      else {
        this.#svc.stats.failed++;
        this.#client.error(503, msg, null, this.endpoint, null, 'store_unavailable');
      }
    };
    let r: boolean | Promise<boolean>;
    try {
      r = this.#svc.storePut(rec);
    } catch (err) {
      failed(err);
      return;
    }
    if (!isPromise(r)) {
      if (!r) this.stored = false; // not kept: re-rendered as store: false
      send(r ? responseJson : render());
      return;
    }
    this.#storing = true;
    const after = () => {
      this.#storing = false;
      if (this.#flightDone >= 0) this.#end(this.#flightDone);
    };
    r.then(
      (kept) => {
        if (!kept) this.stored = false;
        if (!this.#aborted) send(kept ? responseJson : render());
        after();
      },
      (err: unknown) => {
        if (!this.#aborted) failed(err);
        after();
      },
    );
  }
}
