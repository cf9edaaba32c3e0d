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
import { newResponseId } from './ids.js';
import { chainCalls, messageBounds } from './items.js';
import { EngineOutputError, TurnOutput, type ChatToolCall } from './output.js';
import { responseObject, sseEvent, usageOf, type ResponseHead, type ResponseStatus, type Usage } from './render.js';
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

/** Entries of a comma-joined id list. */
function countEntries(ids: string): number {
  if (ids === '') return 0;
  let n = 1;
  for (let i = ids.indexOf(','); i >= 0; i = ids.indexOf(',', i + 1)) n++;
  return n;
}

/** A comma-joined id list without its first `d` entries. */
function dropEntries(ids: string, d: number): string {
  let at = 0;
  for (let k = 0; k < d; k++) {
    const i = ids.indexOf(',', at);
    if (i < 0) return '';
    at = i + 1;
  }
  return ids.slice(at);
}

/** truncation: "auto": the most times a turn is sent again with fewer messages. */
const MAX_RESENDS = 4;

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
  #out: TurnOutput | null = null;
  #finishReason: string | null = null;
  /** The conversation sent (instructions excluded): the parent's messages, then this input (after truncation: its tail). */
  #conv = '';
  /** The whole conversation, before any truncation. */
  #full = '';
  /** Messages dropped from the conversation's front by truncation: "auto" (0: none). */
  #dropped = 0;
  /** Truncated conversations sent again (at most MAX_RESENDS: an engine that answers context errors forever costs a bounded number of round trips). */
  #resends = 0;
  /** The parent's id entries left after truncation (null: none dropped). */
  #droppedIds: string | null = null;
  /** The engine answered a context-length error and the turn resends a truncated conversation when the flight is done. */
  #resend = false;
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
    // every function_call_output answers a call of this input or of the chain
    if (req.callRefs.length > 0) {
      const calls = parent === null ? new Set<string>() : chainCalls(parent.conv);
      for (const ref of req.callRefs) {
        if (!calls.has(JSON.stringify(ref.callId))) {
          throw new ResponsesError(400, `No tool call found for function call output with call_id ${JSON.stringify(ref.callId)}.`, ref.param);
        }
      }
    }
    // the conversation as chat messages: the stored turns, then this input (instructions, this request's only, go first)
    this.#conv = this.#full = parent !== null && parent.conv !== '' ? `${parent.conv},${req.inputFragment}` : req.inputFragment;
    const size = this.#conv.length + req.instructionsFragment.length;
    if (size > this.#svc.maxInputBytes) {
      throw new ResponsesError(
        413,
        `the conversation (${size} bytes with this input and the previous turns) exceeds responses.maxInputBytes (${this.#svc.maxInputBytes})`,
        'input',
      );
    }
    this.#dispatch(this.#conv);
  }

  /** Sends the chat completion of `conv` (the conversation, perhaps truncated) through the director. */
  #dispatch(conv: string): void {
    const req = this.req;
    const messages = req.instructionsFragment === '' ? conv : `${req.instructionsFragment},${conv}`;
    let body = `{"model":${JSON.stringify(req.model)},"messages":[${messages}]`;
    if (req.stream) body += ',"stream":true,"stream_options":{"include_usage":true}';
    if (req.maxOutputTokens !== null) body += `,"max_tokens":${req.maxOutputTokens}`;
    if (req.temperature !== null) body += `,"temperature":${req.temperature}`;
    if (req.topP !== null) body += `,"top_p":${req.topP}`;
    if (req.user !== null) body += `,"user":${JSON.stringify(req.user)}`;
    body += req.chat;
    body += '}';
    // the session key: prompt_cache_key when given, else the chain's root; within the tenant (the store keys are tenant-scoped, so is the pin)
    const key = req.promptCacheKey !== null ? `k:${req.promptCacheKey}` : this.#root;
    const session = this.#tenant === '' ? key : `${this.#tenant.length}:${this.#tenant}:${key}`;
    this.#flight = this.#svc.director.begin(this, KIND_CHAT, this.#requestId, this.#caller, this.#headers, Buffer.from(body), session);
  }

  /**
   * truncation: "auto" and the engine answered that the conversation does not
   * fit its context: the oldest messages of the stored turns are dropped (a
   * whole assistant turn with the tool outputs that answer it; this turn's
   * input and the instructions are kept) to what the engine's own figures
   * (`maximum context length is N tokens`, `M input tokens` / `M in the
   * messages`) say fits, and the turn is sent again. False: nothing left to
   * drop, or the error is another one (relayed).
   */
  #truncate(body: string): boolean {
    if (this.req.truncation !== 'auto' || this.#status !== 400 || this.#parent === null || this.#resends >= MAX_RESENDS) return false;
    const max = /maximum context length is (\d+)/.exec(body);
    if (max === null) return false;
    const got = /(\d+) (?:input tokens|in the messages)/.exec(body);
    const stored = countEntries(this.#parent.ids);
    if (this.#dropped >= stored) return false; // only this turn's input is left: the engine's answer stands
    const conv = this.#full;
    const bounds = messageBounds(conv, stored + countEntries(this.req.inputIds), 0, stored);
    if (bounds === null) return false;
    const ins = this.req.instructionsFragment.length;
    const rest = (d: number) => conv.length - (d < stored ? bounds[2 * d]! : bounds[2 * stored - 1]! + 1) + ins;
    // bytes per token of what was sent; the target leaves room for the completion asked for
    const prompt = got !== null ? Number(got[1]) : 0;
    const perToken = prompt > 0 ? rest(this.#dropped) / prompt : 4;
    const room = Number(max[1]) - (this.req.maxOutputTokens ?? 0) - 16;
    const target = Math.max(0, Math.floor(room * perToken * 0.9));
    let d = this.#dropped + 1;
    while (d < stored && rest(d) > target) d++;
    // never start on a tool output (its call was dropped): drop through it
    while (d < stored && conv.startsWith('{"role":"tool"', bounds[2 * d]!)) d++;
    this.#dropped = d;
    this.#conv = conv.slice(d < stored ? bounds[2 * d]! : bounds[2 * stored - 1]! + 1);
    this.#droppedIds = dropEntries(this.#parent.ids, d);
    this.#resends++;
    return true;
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

  clientAborted(status = 499): void {
    if (this.#aborted) return;
    this.#aborted = true;
    const f = this.#flight;
    if (f !== null) f.clientAborted(status); // a running flight calls done(status)
    if (!this.#over) {
      if (f === null) this.#svc.countRequest(this.model, status);
      this.#end(status);
    }
  }

  pause(): void {
    this.#flight?.pause();
  }

  resume(): void {
    this.#flight?.resume();
  }

  // ---- ClientPort: the engine's chat answer ------------------------------------------

  #output(): TurnOutput {
    const req = this.req;
    return (this.#out ??= new TurnOutput(req.callLimit, req.toolNames, req.logprobs, () => this.endpoint?.name ?? ''));
  }

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
      const out = this.#output();
      const snapshot = responseObject(this, 'in_progress', [], null, null);
      this.#client.write(sseEvent('response.created', out.seq++, { response: snapshot }) + sseEvent('response.in_progress', out.seq++, { response: snapshot }));
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
      if (err instanceof EngineOutputError) {
        if (this.#mode === MODE_SSE) this.#streamFailed('server_error', err.message);
        else {
          this.#svc.stats.failed++;
          this.#client.error(502, err.message, null, this.endpoint, null);
        }
        return;
      }
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
    if (this.#mode === MODE_SSE) this.#streamFailed('server_error', msg, true);
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
    if (this.#resend) {
      // the first flight is over (its context-length error held back): the truncated conversation goes out
      this.#resend = false;
      this.#mode = MODE_NONE;
      this.#chunks = null;
      this.#flight = null;
      if (this.#aborted) return;
      try {
        this.#dispatch(this.#conv);
      } catch (err) {
        this.#fail(err);
      }
      return;
    }
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
    const chunks = this.#chunks ?? [];
    const body = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
    if (this.#truncate(body.toString('utf8'))) {
      this.#resend = true;
      return;
    }
    this.#svc.stats.failed++;
    this.#client.head(this.#status, this.#contentType || 'application/json', this.endpoint!, body.length);
    this.#client.end(body);
  }

  #completeJson(): void {
    const chunks = this.#chunks!;
    const raw = (chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)).toString('utf8');
    let o: { choices?: { message?: { content?: unknown; reasoning_content?: unknown; tool_calls?: unknown }; finish_reason?: unknown; logprobs?: unknown }[]; usage?: unknown; error?: { message?: unknown } };
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
    const out = this.#output();
    const status: ResponseStatus = choice.finish_reason === 'length' ? 'incomplete' : 'completed';
    out.whole(choice.message, choice.logprobs, status === 'incomplete' ? 'incomplete' : 'completed'); // throws EngineOutputError: a 502
    const usage = usageOf(o.usage);
    this.#store(out, () => JSON.stringify(responseObject(this, status, out.output(), usage, null)), (body) => {
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
    const res = this.#output();
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
        let o: {
          choices?: { delta?: { content?: unknown; reasoning_content?: unknown; reasoning?: unknown; tool_calls?: unknown }; finish_reason?: unknown; logprobs?: unknown }[];
          usage?: unknown;
          error?: { message?: unknown };
        };
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
          const delta = c.delta;
          if (delta !== undefined && delta !== null) {
            const r = delta.reasoning_content ?? delta.reasoning;
            if (typeof r === 'string' && r.length > 0) out += res.reasoningDelta(r);
            const d = delta.content;
            if (typeof d === 'string' && d.length > 0) out += res.textDelta(d, c.logprobs);
            const calls = delta.tool_calls;
            if (Array.isArray(calls)) for (const tc of calls as ChatToolCall[]) if (tc !== null && typeof tc === 'object') out += res.toolDelta(tc);
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
    const res = this.#output();
    const status: ResponseStatus = this.#finishReason === 'length' ? 'incomplete' : 'completed';
    const itemStatus = status === 'incomplete' ? 'incomplete' : 'completed';
    let closing: string;
    try {
      closing = res.finish(itemStatus);
    } catch (err) {
      if (!(err instanceof EngineOutputError)) throw err;
      this.#streamFailed('server_error', err.message);
      return;
    }
    if (res.items === 0) {
      // the engine sent no output at all: an empty assistant message, as a Response always holds one
      closing = res.emptyMessage(itemStatus);
    }
    this.#client.write(closing);
    let final: Record<string, unknown> | null = null;
    const render = () => JSON.stringify((final = responseObject(this, status, res.output(), this.#usage, null)));
    this.#store(res, render, () => {
      this.#answered();
      this.#streamEnded = true;
      this.#client.end(sseEvent(status === 'incomplete' ? 'response.incomplete' : 'response.completed', res.seq++, { response: final }));
    });
  }

  /**
   * The stream fails after its 200 went out (the engine's error event, its
   * connection lost mid-stream, a tool call the Response cannot carry, the
   * turn not stored): an `error` event (`{type, code, message, param,
   * sequence_number}`, as OpenAI sends it) and then `response.failed` with the
   * error and the output streamed so far on the response, the stream's last
   * event. The openai SDKs yield both to the caller's iterator.
   */
  /**
   * A drain's grace ended while this turn streams (the transport cuts it):
   * the events it ends with in the Responses shape, `error` (code `code`) and
   * `response.failed` with the output streamed so far, as #streamFailed
   * writes them; null when it is not a stream whose head went out, or it has
   * ended (the transport then ends it as any other request). Nothing more is
   * written by the turn after this.
   */
  shutdownEvents(code: string, message: string): string | null {
    if (this.#mode !== MODE_SSE || this.#streamEnded) return null;
    this.#streamEnded = true;
    const res = this.#output();
    const r = responseObject(this, 'failed', res.output(), this.#usage, { code, message });
    this.#svc.stats.failed++;
    return sseEvent('error', res.seq++, { code, message, param: null }) + sseEvent('response.failed', res.seq++, { response: r });
  }

  /** `midStream`: the engine failed after the head went out: ended through client.fail (counted as a mid-stream failure). */
  #streamFailed(code: string, message: string, midStream = false): void {
    if (this.#streamEnded) return;
    this.#streamEnded = true;
    const res = this.#output();
    const r = responseObject(this, 'failed', res.output(), this.#usage, { code, message });
    const err = sseEvent('error', res.seq++, { code, message, param: null });
    const events = err + sseEvent('response.failed', res.seq++, { response: r });
    if (midStream) this.#client.fail(events);
    else this.#client.end(events);
    this.#svc.stats.failed++;
  }

  /**
   * Renders the Response, stores the turn (when `store`), then sends; a store
   * failure answers 503 (or response.failed) instead. A turn too large for
   * the tenant's byte budget is not stored and its object says `store: false`
   * (never an id that would 404).
   */
  #store(out: TurnOutput, render: () => string, send: (body: string) => void): void {
    const req = this.req;
    if (!req.store) {
      send(render());
      return;
    }
    const responseJson = render();
    const p = this.#parent;
    const parentIds = this.#droppedIds ?? (p === null ? '' : p.ids);
    const msg = out.chatMessage();
    const entry = out.idEntry();
    // not truncated: the conversation is the parent's, then this turn's input and output (what the store keeps of it)
    const linked = p !== null && this.#droppedIds === null && p.conv !== '' && p.ids !== '';
    const rec: StoredResponse = {
      tenant: this.#tenant,
      id: this.id,
      root: this.#root,
      parent: p === null ? '' : p.id,
      createdAt: this.createdAt,
      conv: `${this.#conv},${msg}`,
      ids: parentIds === '' ? `${req.inputIds},${entry}` : `${parentIds},${req.inputIds},${entry}`,
      response: responseJson,
      addedConv: linked ? `${req.inputFragment},${msg}` : undefined,
      addedIds: linked ? `${req.inputIds},${entry}` : undefined,
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
