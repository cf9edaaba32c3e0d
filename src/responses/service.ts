// The Responses API, owned by the router: one service per router holding the
// store and the director it sends rebuilt conversations through. POST turns
// are ResponsesTurn objects (turn.ts); GET / DELETE / input_items read the
// store. Knows nothing of HTTP servers: a transport hands it bodies and a
// ClientPort (src/server/responses-http.ts for uWS).
import type { Logger } from 'pino';
import type { ResponsesConfig } from '../config/responses.js';
import type { ClientPort, Director } from '../director/director.js';
import type { Registry } from '../metrics/prom.js';
import type { Caller } from '../identity.js';
import { MemoryStore } from './memory-store.js';
import { messagesIn, registerResponsesMetrics, ResponsesStats, STORE_DELETE, STORE_GET, STORE_PUT } from './metrics.js';
import { itemOf, messageBounds, type ChatMessage } from './items.js';
import { Piscina } from 'piscina';
import type { TurnParseReply, TurnParseTask } from './parse-worker.js';
import { ResponsesError, type TurnRequest } from './request.js';
import { isPromise, StoreUnavailableError, type ResponseStore, type StoredResponse } from './store.js';
import { ResponsesTurn, type TurnHost } from './turn.js';

export interface ResponsesServiceOptions {
  config: ResponsesConfig;
  director: Director;
  log: Logger;
  /** The router's request counter (model, endpoint id, status). */
  countRequest(model: string, endpointId: number, status: number): void;
  /** Where the Responses metrics are registered (none: counted, not exported). */
  registry?: Registry;
}

/** An answer for GET / DELETE: status and JSON body. */
export interface Answer {
  status: number;
  body: string;
}

/** The parse worker's heap bound (a body that needs more fails with 413, the router lives). */
const PARSE_WORKER_HEAP_MB = 512;

/**
 * The item ids of a record: one entry per message (items.ts), one or more
 * items per entry. A record of plain message ids (52 characters each, one
 * item per message, as text-only turns write them) is read in place; others
 * are split once.
 */
class ItemIds {
  /** Messages (entries). */
  readonly messages: number;
  /** Items. */
  readonly count: number;
  readonly #text: string;
  readonly #entries: string[] | null = null;
  /** Item k: its message, its place in the entry, its id. */
  readonly #msg: Int32Array | null = null;
  readonly #sub: Int32Array | null = null;
  readonly #ids: string[] | null = null;

  constructor(text: string) {
    this.#text = text;
    const w = ITEM_ID_LENGTH + 1;
    // fixed-width ids: a comma after each (checked at the first and last boundary), and no '+' or ':' (one plain message id each)
    const fixed =
      text === '' ||
      ((text.length + 1) % w === 0 &&
        (text.length < w || (text.charCodeAt(ITEM_ID_LENGTH) === 44 && text.charCodeAt(text.length - w) === 44)) &&
        text.indexOf('+') < 0 &&
        text.indexOf(':') < 0);
    if (fixed) {
      this.messages = this.count = text === '' ? 0 : (text.length + 1) / w;
      return;
    }
    const entries = (this.#entries = text.split(','));
    this.messages = entries.length;
    const msg: number[] = [];
    const sub: number[] = [];
    const ids: string[] = [];
    for (let i = 0; i < entries.length; i++) {
      const tokens = entries[i]!.split('+');
      for (let j = 0; j < tokens.length; j++) {
        const t = tokens[j]!;
        msg.push(i);
        sub.push(j);
        ids.push(t.charCodeAt(1) === 58 ? t.slice(2) : t);
      }
    }
    this.#msg = Int32Array.from(msg);
    this.#sub = Int32Array.from(sub);
    this.#ids = ids;
    this.count = ids.length;
  }

  /** The message of item k. */
  message(k: number): number {
    return this.#msg === null ? k : this.#msg[k]!;
  }

  /** Item k's place in its message's entry. */
  sub(k: number): number {
    return this.#sub === null ? 0 : this.#sub[k]!;
  }

  /** Message i's entry. */
  entry(i: number): string {
    if (this.#entries !== null) return this.#entries[i] ?? '';
    const s = i * (ITEM_ID_LENGTH + 1);
    return this.#text.slice(s, s + ITEM_ID_LENGTH);
  }

  /** Items of the messages before the last (the record's own output is the last message). */
  get inputs(): number {
    if (this.messages === 0) return 0;
    if (this.#msg === null) return this.count - 1;
    let k = this.count;
    while (k > 0 && this.#msg[k - 1] === this.messages - 1) k--;
    return k;
  }

  indexOf(id: string): number {
    if (this.#ids !== null) return this.#ids.indexOf(id);
    if (id.length !== ITEM_ID_LENGTH) return -1;
    let at = this.#text.indexOf(id);
    while (at >= 0 && at % (ITEM_ID_LENGTH + 1) !== 0) at = this.#text.indexOf(id, at + 1);
    return at < 0 ? -1 : at / (ITEM_ID_LENGTH + 1);
  }
}

type Item = Record<string, unknown>;

/** `msg_` + 48 hex digits (ids.ts). */
const ITEM_ID_LENGTH = 52;

function listAnswer(data: Item[], hasMore: boolean): Answer {
  return {
    status: 200,
    body: JSON.stringify({ object: 'list', data, first_id: data[0]?.id ?? null, last_id: data[data.length - 1]?.id ?? null, has_more: hasMore }),
  };
}

function notFound(id: string): ResponsesError {
  return new ResponsesError(404, `Response with id '${id}' not found.`, 'response_id', 'not_found');
}

export class ResponsesService implements TurnHost {
  readonly config: ResponsesConfig;
  readonly director: Director;
  readonly log: Logger;
  readonly maxInputBytes: number;
  readonly maxRecordBytes: number;
  readonly #count: ResponsesServiceOptions['countRequest'];
  /** The store (null until open() for sqlite and redis). */
  store: ResponseStore | null = null;
  /** Turn results, store operations, chain lengths (metrics.ts). */
  readonly stats = new ResponsesStats();
  #pool: Piscina<TurnParseTask, TurnParseReply> | null = null;
  /** Bodies parsed in a worker since start. */
  offloadedParses = 0;

  constructor(o: ResponsesServiceOptions) {
    this.config = o.config;
    this.director = o.director;
    this.log = o.log;
    this.maxInputBytes = o.config.maxInputBytes;
    this.maxRecordBytes = o.config.store.type === 'redis' ? Infinity : o.config.maxBytes;
    this.#count = o.countRequest;
    if (o.config.store.type === 'memory') this.store = new MemoryStore(o.config);
    if (o.registry !== undefined) registerResponsesMetrics(o.registry, this.stats, () => this.store, o.config.store.type);
  }

  // ---- the store's operations, timed and counted (a synchronous store costs no promise) ----

  storeGet(tenant: string, id: string): StoredResponse | null | Promise<StoredResponse | null> {
    const t0 = performance.now();
    let v: StoredResponse | null | Promise<StoredResponse | null>;
    try {
      v = this.store!.get(tenant, id);
    } catch (err) {
      this.stats.op(STORE_GET, t0, true);
      throw err;
    }
    return this.#timed(STORE_GET, t0, v);
  }

  storePut(r: StoredResponse): boolean | Promise<boolean> {
    this.stats.chain.observe(messagesIn(r.ids));
    const t0 = performance.now();
    let v: boolean | Promise<boolean>;
    try {
      v = this.store!.put(r);
    } catch (err) {
      this.stats.op(STORE_PUT, t0, true);
      throw err;
    }
    return this.#timed(STORE_PUT, t0, v);
  }

  storeDelete(tenant: string, id: string): boolean | Promise<boolean> {
    const t0 = performance.now();
    let v: boolean | Promise<boolean>;
    try {
      v = this.store!.delete(tenant, id);
    } catch (err) {
      this.stats.op(STORE_DELETE, t0, true);
      throw err;
    }
    return this.#timed(STORE_DELETE, t0, v);
  }

  #timed<T>(op: number, t0: number, v: T | Promise<T>): T | Promise<T> {
    const stats = this.stats;
    if (!isPromise(v)) {
      stats.op(op, t0, false);
      return v;
    }
    return v.then(
      (x) => {
        stats.op(op, t0, false);
        return x;
      },
      (err: unknown) => {
        stats.op(op, t0, true);
        throw err;
      },
    );
  }

  get maxJsonDepth(): number {
    return this.director.maxJsonDepth;
  }

  /** The director's threshold: a body above it is parsed off the event loop, like a chat body. */
  get parseOffloadBytes(): number {
    return this.director.parseOffloadBytes;
  }

  /** Parses a large body in the worker pool (created on first use, up to two threads, as the director's); `raw` is unusable afterwards. */
  async parseOffLoop(raw: Buffer): Promise<TurnRequest> {
    this.#pool ??= new Piscina<TurnParseTask, TurnParseReply>({
      filename: new URL('./parse-worker.js', import.meta.url).href,
      minThreads: 0,
      maxThreads: 2,
      idleTimeout: 30_000,
      resourceLimits: { maxOldGenerationSizeMb: PARSE_WORKER_HEAP_MB },
    });
    this.offloadedParses++;
    let r: TurnParseReply;
    try {
      // moved, not copied: the body is the turn's alone (the exchange handed it over), and a large one
      // has an ArrayBuffer of its own (Buffer's shared pool holds only small allocations)
      const own = raw.buffer.byteLength > Buffer.poolSize;
      r = await this.#pool.run({ raw, maxDepth: this.maxJsonDepth }, own ? { transferList: [raw.buffer as ArrayBuffer] } : undefined);
    } catch (err) {
      throw new ResponsesError(413, `the request body could not be parsed within the router's limits (${(err as Error).message})`);
    }
    if (!r.ok) throw new ResponsesError(r.status, r.message, r.param, r.code);
    return r.req;
  }

  /**
   * Opens a sqlite or redis store (the memory store exists from the start).
   * SQLite: throws when the file cannot be opened. Redis: waits up to 5 s for
   * the connection, then serves anyway (503 on /v1/responses until it is up).
   */
  async open(): Promise<void> {
    if (this.store !== null) return;
    const cfg = this.config;
    if (cfg.store.type === 'sqlite') {
      const { SqliteStore } = await import('./sqlite-store.js');
      this.store = await SqliteStore.open(cfg);
    } else if (cfg.store.type === 'redis') {
      const { RedisStore } = await import('./redis-store.js');
      const s = new RedisStore(cfg, this.log);
      this.store = s;
      await s.waitReady(5000).catch((err: Error) => this.log.warn({ err: err.message }, 'Responses store not reachable at start; /v1/responses answers 503 until it is'));
    }
  }

  unavailable(): StoreUnavailableError {
    const s = this.config.store;
    return new StoreUnavailableError(`the Responses store (${s.type}) is unavailable; chat completions are not affected, retry later`);
  }

  countRequest(model: string, status: number): void {
    this.#count(model, -1, status);
  }

  /** POST /v1/responses with its complete body; never throws (failures are answers through `port`). */
  begin(port: ClientPort, caller: Caller, requestId: string, headers: Readonly<Record<string, string>>, raw: Buffer): ResponsesTurn {
    const t = new ResponsesTurn(this, port, caller, requestId, headers);
    try {
      t.start(raw);
    } catch (err) {
      this.log.error({ err, id: requestId }, 'internal error starting a Responses turn');
      port.error(500, `internal error: ${(err as Error)?.message ?? String(err)}`, null, undefined, null);
      port.done(500);
    }
    return t;
  }

  async #read(tenant: string, id: string): Promise<StoredResponse> {
    const s = this.store;
    if (s === null || !s.available) throw this.unavailable();
    const r = await this.storeGet(tenant, id);
    if (r === null) throw notFound(id);
    return r;
  }

  /** GET /v1/responses/{id} (of `tenant`: another tenant's id is a 404, like a missing one). */
  async retrieve(tenant: string, id: string): Promise<Answer> {
    return { status: 200, body: (await this.#read(tenant, id)).response };
  }

  /** DELETE /v1/responses/{id} (of `tenant`). */
  async remove(tenant: string, id: string): Promise<Answer> {
    const s = this.store;
    if (s === null || !s.available) throw this.unavailable();
    if (!(await this.storeDelete(tenant, id))) throw notFound(id);
    return { status: 200, body: JSON.stringify({ id, object: 'response.deleted', deleted: true }) };
  }

  /**
   * GET /v1/responses/{id}/input_items: the items the response was generated
   * from (earlier turns' inputs and outputs, then its own input; not its
   * output, not instructions), newest first unless `order=asc`, paged by
   * `limit` (1-100, default 20) and `after` (an item id).
   */
  async inputItems(tenant: string, id: string, query: string): Promise<Answer> {
    const q = new URLSearchParams(query);
    const limitText = q.get('limit');
    const limit = limitText === null ? 20 : Number(limitText);
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) throw new ResponsesError(400, "'limit' must be an integer in [1, 100]", 'limit');
    const order = q.get('order') ?? 'desc';
    if (order !== 'asc' && order !== 'desc') throw new ResponsesError(400, "'order' must be asc or desc", 'order');
    const r = await this.#read(tenant, id);
    const ids = new ItemIds(r.ids);
    // the last message is this response's own output: items are those of messages [0, messages - 1)
    const n = ids.inputs;
    const after = q.get('after');
    // k-th item of the listing -> item index
    const pos = (k: number) => (order === 'asc' ? k : n - 1 - k);
    let from = 0;
    if (after !== null) {
      const at = ids.indexOf(after);
      if (at < 0 || at >= n) throw new ResponsesError(400, `'after': no item '${after}' in this response's input`, 'after');
      from = order === 'asc' ? at + 1 : n - at;
    }
    const take = Math.min(limit, n - from);
    if (take <= 0) return listAnswer([], false);
    // only the page's messages are found (native string search from the nearer end) and parsed
    const lo = ids.message(Math.min(pos(from), pos(from + take - 1)));
    const hi = ids.message(Math.max(pos(from), pos(from + take - 1))) + 1;
    const bounds = messageBounds(r.conv, ids.messages, lo, hi);
    const parsed = new Array<ChatMessage | undefined>(hi - lo);
    const all = bounds === null ? (JSON.parse(`[${r.conv}]`) as ChatMessage[]) : null; // not a record this router rendered: parsed whole
    const data = new Array<Item>(take);
    for (let k = from; k < from + take; k++) {
      const item = pos(k);
      const i = ids.message(item);
      let m = parsed[i - lo];
      if (m === undefined) m = parsed[i - lo] = all !== null ? (all[i] ?? {}) : (JSON.parse(r.conv.slice(bounds![2 * (i - lo)]!, bounds![2 * (i - lo) + 1]!)) as ChatMessage);
      data[k - from] = itemOf(m, ids.entry(i), ids.sub(item));
    }
    return listAnswer(data, from + take < n);
  }

  async close(): Promise<void> {
    const s = this.store;
    this.store = null;
    const p = this.#pool;
    this.#pool = null;
    await Promise.all([s?.close(), p?.destroy()]);
  }
}
