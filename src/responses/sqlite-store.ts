// A durable Responses store in one SQLite file (better-sqlite3), kept off the
// event loop: one dedicated worker thread (sqlite-worker.ts) owns the
// database, and this class is the event loop's side of it. Operations are
// queued and sent as one message per event-loop turn (request ids match the
// answers); the worker commits a batch's writes in one transaction, so a
// turn's `put` resolves once its record is committed (group commit: the turn
// answers only what it can continue). The queue is bounded (a full queue
// answers 503 at once rather than growing without limit); close() sends what
// is queued and waits for the worker to commit it and close the file
// (durable on a graceful stop). A worker that dies fails its outstanding
// operations with 503 and is started again after a pause; the file is the
// state, so nothing of a committed chain is lost.
import { Worker } from 'node:worker_threads';
import type { ResponsesConfig } from '../config/responses.js';
import { linksParent, StoreUnavailableError, type ResponseStore, type StoredResponse } from './store.js';
import { OP_DEL, OP_GET, OP_PUT, type FromWorker, type SqliteOp, type SqliteWorkerData, type ToWorker } from './sqlite-protocol.js';
import { IdTable } from '../id-table.js';

/** Operations sent to the worker and not answered yet, beyond which a new one fails at once (503). */
export const SQLITE_MAX_QUEUE = 8192;
/** A write waits this long for a lock another connection holds on the file, then fails (503). */
export const SQLITE_BUSY_TIMEOUT_MS = 1000;
const RESTART_MS = 1000;

interface Waiter {
  readonly id: number;
  resolve(v: StoredResponse | boolean | null): void;
  reject(e: StoreUnavailableError): void;
}

export class SqliteStore implements ResponseStore {
  readonly type = 'sqlite' as const;
  readonly #data: SqliteWorkerData;
  #worker: Worker | null = null;
  #ready = false;
  #closing = false;
  #rid = 0;
  /** Calls waiting on the worker by request id (not a Map: src/id-table.ts says why). */
  readonly #waiting = new IdTable<Waiter>(256);
  #batch: SqliteOp[] = [];
  #scheduled = false;
  #count = 0;
  #bytes = 0;
  #evictionsBase = 0;
  #evictionsWorker = 0;
  #restart: NodeJS.Timeout | null = null;
  /** The last failure, for the 503 message while the worker is away. */
  #lastError = '';

  private constructor(data: SqliteWorkerData) {
    this.#data = data;
  }

  /** Opens the file in its worker; rejects (the router does not start) when it cannot be opened or created. */
  static async open(cfg: Pick<ResponsesConfig, 'ttlSeconds' | 'maxResponses' | 'maxBytes' | 'store'>, busyTimeoutMs = SQLITE_BUSY_TIMEOUT_MS): Promise<SqliteStore> {
    const path = cfg.store.path!;
    const s = new SqliteStore({ path, ttlMs: cfg.ttlSeconds * 1000, maxResponses: cfg.maxResponses, maxBytes: cfg.maxBytes, busyTimeoutMs });
    try {
      await s.#start();
    } catch (err) {
      throw new Error(`responses.store.path: cannot open the SQLite file ${JSON.stringify(path)}: ${(err as Error).message}`);
    }
    return s;
  }

  #start(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const w = new Worker(new URL('./sqlite-worker.js', import.meta.url), { workerData: this.#data });
      this.#worker = w;
      let started = false;
      w.on('message', (m: FromWorker) => {
        switch (m.t) {
          case 'results':
            this.#count = m.count;
            this.#bytes = m.bytes;
            this.#evictionsWorker = m.evictions;
            for (const [rid, err, value] of m.results) {
              const wt = this.#waiting.get(rid);
              if (wt === undefined) continue;
              this.#waiting.delete(rid);
              if (err === '') wt.resolve(value);
              else wt.reject(new StoreUnavailableError(`the SQLite response store failed: ${err}`));
            }
            return;
          case 'ready':
            started = true;
            this.#ready = true;
            this.#count = m.count;
            this.#bytes = m.bytes;
            this.#evictionsBase += this.#evictionsWorker; // a restarted worker counts from 0
            this.#evictionsWorker = 0;
            resolve();
            return;
          case 'open-error':
            this.#lastError = m.message;
            if (!started) reject(new Error(m.message));
            return;
          case 'closed':
            return;
        }
      });
      w.on('error', (err: Error) => {
        this.#lastError = err.message;
        if (!started) reject(err);
      });
      w.on('exit', () => {
        if (this.#worker !== w) return;
        this.#worker = null;
        this.#ready = false;
        this.#failAll(`the SQLite store's worker stopped${this.#lastError === '' ? '' : `: ${this.#lastError}`}`);
        if (!started) reject(new Error(this.#lastError || 'the worker exited'));
        else if (!this.#closing) this.#scheduleRestart();
      });
    });
  }

  #scheduleRestart(): void {
    if (this.#restart !== null || this.#closing) return;
    this.#restart = setTimeout(() => {
      this.#restart = null;
      if (this.#closing) return;
      this.#start().catch(() => this.#scheduleRestart());
    }, RESTART_MS);
    this.#restart.unref();
  }

  #failAll(message: string): void {
    const err = new StoreUnavailableError(message);
    for (const w of this.#waiting.values()) w.reject(err);
    this.#waiting.clear();
    this.#batch = [];
  }

  /** False while the worker is away (restarting after a failure) or closing: new turns answer 503 at once. */
  get available(): boolean {
    return this.#ready && !this.#closing;
  }

  size(): number {
    return this.#count;
  }

  get bytes(): number {
    return this.#bytes;
  }

  /** Responses dropped to stay within the bounds (not counting expiry), since the store opened. */
  get evictions(): number {
    return this.#evictionsBase + this.#evictionsWorker;
  }

  /** Operations waiting for the worker (queued or sent, not answered). */
  get queued(): number {
    return this.#waiting.size;
  }

  #op<T extends StoredResponse | boolean | null>(make: (rid: number) => SqliteOp): Promise<T> {
    if (!this.available) {
      return Promise.reject(new StoreUnavailableError(`the SQLite response store is unavailable${this.#lastError === '' ? '' : `: ${this.#lastError}`}`));
    }
    if (this.#waiting.size >= SQLITE_MAX_QUEUE) {
      return Promise.reject(new StoreUnavailableError(`the SQLite response store is overloaded (${SQLITE_MAX_QUEUE} operations waiting for the disk)`));
    }
    const rid = ++this.#rid;
    return new Promise<T>((resolve, reject) => {
      this.#waiting.set({ id: rid, resolve: resolve as Waiter['resolve'], reject });
      this.#batch.push(make(rid));
      if (!this.#scheduled) {
        this.#scheduled = true;
        setImmediate(this.#flush);
      }
    });
  }

  /** Sends the operations of this event-loop turn as one message. */
  readonly #flush = (): void => {
    this.#scheduled = false;
    const ops = this.#batch;
    if (ops.length === 0) return;
    this.#batch = [];
    this.#worker?.postMessage({ t: 'batch', ops } satisfies ToWorker);
  };

  get(tenant: string, id: string): Promise<StoredResponse | null> {
    return this.#op((rid) => [rid, OP_GET, tenant, id]);
  }

  /**
   * A continuation goes to the worker as what it added only (the whole
   * conversation is not copied across); the worker answers null when it
   * cannot link it (the parent's record is gone, or a checkpoint is due), and
   * then the whole record is sent.
   */
  async put(r: StoredResponse): Promise<boolean> {
    if (linksParent(r)) {
      const slim: StoredResponse = { ...r, conv: '', ids: '' };
      const kept = await this.#op<boolean | null>((rid) => [rid, OP_PUT, slim]);
      if (kept !== null) return kept;
    }
    return (await this.#op<boolean | null>((rid) => [rid, OP_PUT, { ...r, addedConv: undefined, addedIds: undefined }])) === true;
  }

  delete(tenant: string, id: string): Promise<boolean> {
    return this.#op((rid) => [rid, OP_DEL, tenant, id]);
  }

  /** Commits what is queued, closes the file, stops the worker. */
  async close(): Promise<void> {
    if (this.#restart !== null) clearTimeout(this.#restart);
    const w = this.#worker;
    if (this.#closing || w === null) {
      this.#closing = true;
      return;
    }
    this.#flush();
    this.#closing = true;
    await new Promise<void>((resolve) => {
      w.once('exit', () => resolve());
      w.postMessage({ t: 'close' } satisfies ToWorker);
    });
  }

  /** Stops the worker as a crash would (tests): its operations fail with 503, it starts again after a pause. */
  async crashForTest(): Promise<void> {
    await this.#worker?.terminate();
  }
}
