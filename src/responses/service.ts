// The Responses API, owned by the router: one service per router holding the
// store and the director it sends rebuilt conversations through. POST turns
// are ResponsesTurn objects (turn.ts); GET / DELETE / input_items read the
// store. Knows nothing of HTTP servers: a transport hands it bodies and a
// ClientPort (src/server/responses-http.ts for uWS).
import type { Logger } from 'pino';
import type { ResponsesConfig } from '../config/responses.js';
import type { ClientPort, Director } from '../director/director.js';
import type { Registry } from '../metrics/prom.js';
import { MemoryStore } from './memory-store.js';
import { messagesIn, registerResponsesMetrics, ResponsesStats, STORE_DELETE, STORE_GET, STORE_PUT } from './metrics.js';
import { inputItem } from './render.js';
import { ResponsesError } from './request.js';
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
  begin(port: ClientPort, tenant: string, requestId: string, authorization: string, headers: Readonly<Record<string, string>>, raw: Buffer): ResponsesTurn {
    const t = new ResponsesTurn(this, port, tenant, requestId, authorization, headers);
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
    const messages = JSON.parse(`[${r.conv}]`) as { role?: unknown; content?: unknown }[];
    const ids = r.ids === '' ? [] : r.ids.split(',');
    // the last message is this response's own output
    let items = messages.slice(0, -1).map((m, i) => inputItem(ids[i] ?? '', m));
    if (order === 'desc') items.reverse();
    const after = q.get('after');
    if (after !== null) {
      const at = items.findIndex((it) => it.id === after);
      if (at < 0) throw new ResponsesError(400, `'after': no item '${after}' in this response's input`, 'after');
      items = items.slice(at + 1);
    }
    const page = items.slice(0, limit);
    return {
      status: 200,
      body: JSON.stringify({
        object: 'list',
        data: page,
        first_id: page[0]?.id ?? null,
        last_id: page[page.length - 1]?.id ?? null,
        has_more: items.length > page.length,
      }),
    };
  }

  async close(): Promise<void> {
    const s = this.store;
    this.store = null;
    await s?.close();
  }
}
