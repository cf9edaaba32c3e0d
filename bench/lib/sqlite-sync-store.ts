// The SQLite store as it was before it moved to a worker thread (session 6): every statement on the
// event loop, one tenant (the tenant argument is ignored). Kept here only as the same-run baseline of bench/responses-state.ts's store-operation table.
// A durable Responses store in one SQLite file (better-sqlite3). Its API is
// synchronous and runs on the event loop: a lookup by primary key and an
// insert in WAL mode with synchronous=NORMAL (no fsync per commit) cost tens
// of microseconds for conversations of a few KB and grow with the bytes
// written (bench/responses-state.ts measures it per chain length; see
// docs/responses.md). Bounded like the memory store, but oldest-first rather
// than least-recently-used (an LRU would cost a write per read). Expired rows
// are deleted in the background.
import Database from 'better-sqlite3';
import type { ResponsesConfig } from '../../src/config/responses.js';
import { recordBytes, StoreUnavailableError, type ResponseStore, type StoredResponse } from '../../src/responses/store.js';

interface Row {
  id: string;
  root: string;
  parent: string;
  created_at: number;
  expires_at: number;
  conv: string;
  ids: string;
  response: string;
}

function unavailable(err: unknown): StoreUnavailableError {
  return new StoreUnavailableError(`the SQLite response store failed: ${(err as Error).message}`);
}

export class SyncSqliteStore implements ResponseStore {
  readonly type = 'sqlite' as const;
  available = true;
  readonly #db: Database.Database;
  readonly #ttlMs: number;
  readonly #maxResponses: number;
  readonly #maxBytes: number;
  #count = 0;
  #bytes = 0;
  evictions = 0;
  readonly #get: Database.Statement<[string], Row>;
  readonly #put: Database.Statement<unknown[]>;
  readonly #bytesOf: Database.Statement<[string], { bytes: number }>;
  readonly #del: Database.Statement<[string]>;
  readonly #oldest: Database.Statement<[number], { seq: number; bytes: number }>;
  readonly #delSeq: Database.Statement<[number]>;
  readonly #sweepStmt: Database.Statement<[number]>;
  #sweep: NodeJS.Timeout;

  /** Throws when the file cannot be opened or created (the router does not start). */
  constructor(cfg: Pick<ResponsesConfig, 'ttlSeconds' | 'maxResponses' | 'maxBytes' | 'store'>) {
    const path = cfg.store.path!;
    this.#ttlMs = cfg.ttlSeconds * 1000;
    this.#maxResponses = cfg.maxResponses;
    this.#maxBytes = cfg.maxBytes;
    try {
      const db = (this.#db = new Database(path));
      db.pragma('journal_mode = WAL');
      db.pragma('synchronous = NORMAL');
      db.exec(`CREATE TABLE IF NOT EXISTS responses (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        root TEXT NOT NULL,
        parent TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        bytes INTEGER NOT NULL,
        conv TEXT NOT NULL,
        ids TEXT NOT NULL,
        response TEXT NOT NULL)`);
      db.exec('CREATE INDEX IF NOT EXISTS responses_expiry ON responses (expires_at)');
      this.#get = db.prepare('SELECT id, root, parent, created_at, expires_at, conv, ids, response FROM responses WHERE id = ?');
      this.#put = db.prepare(
        'INSERT INTO responses (id, root, parent, created_at, expires_at, bytes, conv, ids, response) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)',
      );
      this.#bytesOf = db.prepare('SELECT bytes FROM responses WHERE id = ?');
      this.#del = db.prepare('DELETE FROM responses WHERE id = ?');
      this.#oldest = db.prepare('SELECT seq, bytes FROM responses ORDER BY seq LIMIT ?');
      this.#delSeq = db.prepare('DELETE FROM responses WHERE seq = ?');
      this.#sweepStmt = db.prepare('DELETE FROM responses WHERE expires_at <= ?');
      this.#sweepStmt.run(Date.now());
      const t = db.prepare('SELECT count(*) AS n, coalesce(sum(bytes), 0) AS b FROM responses').get() as { n: number; b: number };
      this.#count = t.n;
      this.#bytes = t.b;
    } catch (err) {
      throw new Error(`responses.store.path: cannot open the SQLite file ${JSON.stringify(path)}: ${(err as Error).message}`);
    }
    this.#sweep = setInterval(() => this.sweep(Date.now()), Math.min(60_000, Math.max(1000, this.#ttlMs / 4)));
    this.#sweep.unref();
  }

  size(): number {
    return this.#count;
  }

  get bytes(): number {
    return this.#bytes;
  }

  get(_tenant: string, id: string): StoredResponse | null {
    let row: Row | undefined;
    try {
      row = this.#get.get(id);
    } catch (err) {
      throw unavailable(err);
    }
    if (row === undefined || row.expires_at <= Date.now()) return null;
    return { tenant: '', id: row.id, root: row.root, parent: row.parent, createdAt: row.created_at, conv: row.conv, ids: row.ids, response: row.response };
  }

  put(r: StoredResponse): boolean {
    const bytes = recordBytes(r);
    if (bytes > this.#maxBytes) return false;
    try {
      const args = [r.id, r.root, r.parent, r.createdAt, Date.now() + this.#ttlMs, bytes, r.conv, r.ids, r.response];
      try {
        this.#put.run(...args); // ids are unique: one statement per turn
      } catch (err) {
        if ((err as { code?: string }).code !== 'SQLITE_CONSTRAINT_UNIQUE') throw err;
        this.#removeId(r.id);
        this.#put.run(...args);
      }
      this.#count++;
      this.#bytes += bytes;
      if (this.#count > this.#maxResponses || this.#bytes > this.#maxBytes) this.#evict();
      return true;
    } catch (err) {
      throw unavailable(err);
    }
  }

  #removeId(id: string): boolean {
    const had = this.#bytesOf.get(id);
    if (had === undefined) return false;
    this.#del.run(id);
    this.#count--;
    this.#bytes -= had.bytes;
    return true;
  }

  #evict(): void {
    while (this.#count > this.#maxResponses || this.#bytes > this.#maxBytes) {
      const rows = this.#oldest.all(64);
      if (rows.length === 0) return;
      for (const row of rows) {
        if (this.#count <= this.#maxResponses && this.#bytes <= this.#maxBytes) return;
        this.#delSeq.run(row.seq);
        this.#count--;
        this.#bytes -= row.bytes;
        this.evictions++;
      }
    }
  }

  delete(_tenant: string, id: string): boolean {
    try {
      const row = this.#get.get(id);
      this.#removeId(id);
      return row !== undefined && row.expires_at > Date.now();
    } catch (err) {
      throw unavailable(err);
    }
  }

  sweep(now: number): void {
    try {
      if (this.#sweepStmt.run(now).changes > 0) {
        const t = this.#db.prepare('SELECT count(*) AS n, coalesce(sum(bytes), 0) AS b FROM responses').get() as { n: number; b: number };
        this.#count = t.n;
        this.#bytes = t.b;
      }
    } catch {
      // the next turn reports it
    }
  }

  async close(): Promise<void> {
    clearInterval(this.#sweep);
    try {
      this.#db.close();
    } catch {
      /* already closed */
    }
  }
}
