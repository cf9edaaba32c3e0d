// The SQLite Responses store's worker thread: the one owner of the database
// file. better-sqlite3 is synchronous, so every statement runs here and never
// on the router's event loop (sqlite-store.ts is the event loop's side). The
// router sends batches of operations (one message per event-loop turn); the
// worker runs a batch's writes in ONE transaction (one WAL commit for every
// turn stored in that loop turn: group commit) and answers the whole batch in
// one message. WAL mode with synchronous=NORMAL: a commit is durable against a
// crash of the router process; a power loss may lose the last commits.
// Bounded like the memory store (count and bytes), oldest first (an LRU
// would cost a write per read); expired rows are swept here too.
import { parentPort, workerData } from 'node:worker_threads';
import Database from 'better-sqlite3';
import { recordBytes, type StoredResponse } from './store.js';
import { OP_GET, OP_PUT, type FromWorker, type SqliteOp, type SqliteResult, type SqliteWorkerData, type ToWorker } from './sqlite-protocol.js';

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

class Db {
  readonly db: Database.Database;
  readonly #ttlMs: number;
  readonly #maxResponses: number;
  readonly #maxBytes: number;
  count = 0;
  bytes = 0;
  evictions = 0;
  readonly #get: Database.Statement<[string], Row>;
  readonly #put: Database.Statement<unknown[]>;
  readonly #bytesOf: Database.Statement<[string], { bytes: number }>;
  readonly #del: Database.Statement<[string]>;
  readonly #oldest: Database.Statement<[number], { seq: number; bytes: number }>;
  readonly #delSeq: Database.Statement<[number]>;
  readonly #sweep: Database.Statement<[number]>;
  readonly #totals: Database.Statement<[], { n: number; b: number }>;

  constructor(d: SqliteWorkerData) {
    this.#ttlMs = d.ttlMs;
    this.#maxResponses = d.maxResponses;
    this.#maxBytes = d.maxBytes;
    const db = (this.db = new Database(d.path, { timeout: d.busyTimeoutMs }));
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
    this.#sweep = db.prepare('DELETE FROM responses WHERE expires_at <= ?');
    this.#totals = db.prepare('SELECT count(*) AS n, coalesce(sum(bytes), 0) AS b FROM responses');
    this.sweep(Date.now());
    this.#recount();
  }

  #recount(): void {
    const t = this.#totals.get()!;
    this.count = t.n;
    this.bytes = t.b;
  }

  get(id: string): StoredResponse | null {
    const row = this.#get.get(id);
    if (row === undefined || row.expires_at <= Date.now()) return null;
    return { id: row.id, root: row.root, parent: row.parent, createdAt: row.created_at, conv: row.conv, ids: row.ids, response: row.response };
  }

  put(r: StoredResponse): void {
    const bytes = recordBytes(r);
    // a record larger than the whole budget is not kept (its continuation is a clean 404)
    if (bytes > this.#maxBytes) return;
    this.#removeId(r.id); // ids are unique; a rewrite replaces
    this.#put.run(r.id, r.root, r.parent, r.createdAt, Date.now() + this.#ttlMs, bytes, r.conv, r.ids, r.response);
    this.count++;
    this.bytes += bytes;
    if (this.count > this.#maxResponses || this.bytes > this.#maxBytes) this.#evict();
  }

  #removeId(id: string): boolean {
    const had = this.#bytesOf.get(id);
    if (had === undefined) return false;
    this.#del.run(id);
    this.count--;
    this.bytes -= had.bytes;
    return true;
  }

  #evict(): void {
    while (this.count > this.#maxResponses || this.bytes > this.#maxBytes) {
      const rows = this.#oldest.all(64);
      if (rows.length === 0) return;
      for (const row of rows) {
        if (this.count <= this.#maxResponses && this.bytes <= this.#maxBytes) return;
        this.#delSeq.run(row.seq);
        this.count--;
        this.bytes -= row.bytes;
        this.evictions++;
      }
    }
  }

  delete(id: string): boolean {
    const row = this.#get.get(id);
    this.#removeId(id);
    return row !== undefined && row.expires_at > Date.now();
  }

  sweep(now: number): void {
    if (this.#sweep.run(now).changes > 0) this.#recount();
  }

  /** One batch: the writes in one immediate transaction; a failure of it fails the writes, reads are retried alone. */
  run(ops: SqliteOp[]): SqliteResult[] {
    const out: SqliteResult[] = new Array(ops.length);
    const before = [this.count, this.bytes, this.evictions];
    let writes = false;
    for (let i = 0; i < ops.length && !writes; i++) writes = ops[i]![1] !== OP_GET;
    try {
      const txn = this.db.transaction(() => {
        for (let i = 0; i < ops.length; i++) out[i] = this.#one(ops[i]!);
      });
      // reads alone need no write lock (WAL: they never wait for a writer)
      if (writes) txn.immediate();
      else txn.deferred();
      return out;
    } catch (err) {
      [this.count, this.bytes, this.evictions] = before as [number, number, number];
      const message = (err as Error).message || String(err);
      for (let i = 0; i < ops.length; i++) {
        const op = ops[i]!;
        if (op[1] !== OP_GET) out[i] = [op[0], message, null];
        else {
          try {
            out[i] = [op[0], '', this.get(op[2])];
          } catch (e) {
            out[i] = [op[0], (e as Error).message || String(e), null];
          }
        }
      }
      return out;
    }
  }

  #one(op: SqliteOp): SqliteResult {
    switch (op[1]) {
      case OP_GET:
        return [op[0], '', this.get(op[2])];
      case OP_PUT:
        this.put(op[2]);
        return [op[0], '', null];
      default:
        return [op[0], '', this.delete(op[2])];
    }
  }
}

const port = parentPort!;
const data = workerData as SqliteWorkerData;
let db: Db;
try {
  db = new Db(data);
} catch (err) {
  port.postMessage({ t: 'open-error', message: (err as Error).message } satisfies FromWorker);
  process.exit(0);
}
const sweep = setInterval(() => {
  try {
    db.sweep(Date.now());
  } catch {
    // the next operation reports it
  }
}, Math.min(60_000, Math.max(1000, data.ttlMs / 4)));
port.postMessage({ t: 'ready', count: db.count, bytes: db.bytes } satisfies FromWorker);
port.on('message', (m: ToWorker) => {
  if (m.t === 'batch') {
    const results = db.run(m.ops);
    port.postMessage({ t: 'results', results, count: db.count, bytes: db.bytes, evictions: db.evictions } satisfies FromWorker);
    return;
  }
  // close: every batch sent before it has been committed (messages arrive in order)
  clearInterval(sweep);
  try {
    db.db.close();
  } catch {
    /* already closed */
  }
  port.postMessage({ t: 'closed' } satisfies FromWorker);
  port.close();
});
