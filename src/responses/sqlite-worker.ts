// The SQLite Responses store's worker thread: the one owner of the database
// file. better-sqlite3 is synchronous, so every statement runs here and never
// on the router's event loop (sqlite-store.ts is the event loop's side). The
// router sends batches of operations (one message per event-loop turn); the
// worker runs a batch's writes in ONE transaction (one WAL commit for every
// turn stored in that loop turn: group commit) and answers the whole batch in
// one message. WAL mode with synchronous=NORMAL: a commit is durable against a
// crash of the router process; a power loss may lose the last commits.
// Keyed by (tenant, id); bounded like the memory store (count and bytes per
// tenant), oldest first (an LRU
// would cost a write per read); expired rows are swept here too.
import { parentPort, workerData } from 'node:worker_threads';
import Database from 'better-sqlite3';
import { recordBytes, type StoredResponse } from './store.js';
import { OP_GET, OP_PUT, type FromWorker, type SqliteOp, type SqliteResult, type SqliteWorkerData, type ToWorker } from './sqlite-protocol.js';

interface Row {
  tenant: string;
  id: string;
  root: string;
  parent: string;
  created_at: number;
  expires_at: number;
  conv: string;
  ids: string;
  response: string;
}

/** One tenant's totals (the bounds apply per tenant). */
interface Totals {
  count: number;
  bytes: number;
}

class Db {
  readonly db: Database.Database;
  readonly #ttlMs: number;
  readonly #maxResponses: number;
  readonly #maxBytes: number;
  count = 0;
  bytes = 0;
  evictions = 0;
  readonly #tenants = new Map<string, Totals>();
  readonly #get: Database.Statement<[string, string], Row>;
  readonly #put: Database.Statement<unknown[]>;
  readonly #bytesOf: Database.Statement<[string, string], { bytes: number }>;
  readonly #del: Database.Statement<[string, string]>;
  readonly #oldest: Database.Statement<[string, number], { seq: number; bytes: number }>;
  readonly #delSeq: Database.Statement<[number]>;
  readonly #sweep: Database.Statement<[number]>;
  readonly #totals: Database.Statement<[], { tenant: string; n: number; b: number }>;

  constructor(d: SqliteWorkerData) {
    this.#ttlMs = d.ttlMs;
    this.#maxResponses = d.maxResponses;
    this.#maxBytes = d.maxBytes;
    const db = (this.db = new Database(d.path, { timeout: d.busyTimeoutMs }));
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = NORMAL');
    // keyed by (tenant, id): a tenant's lookups never see another's rows
    db.exec(`CREATE TABLE IF NOT EXISTS responses_t (
      seq INTEGER PRIMARY KEY AUTOINCREMENT,
      tenant TEXT NOT NULL,
      id TEXT NOT NULL,
      root TEXT NOT NULL,
      parent TEXT NOT NULL,
      created_at INTEGER NOT NULL,
      expires_at INTEGER NOT NULL,
      bytes INTEGER NOT NULL,
      conv TEXT NOT NULL,
      ids TEXT NOT NULL,
      response TEXT NOT NULL,
      UNIQUE (tenant, id))`);
    db.exec('CREATE INDEX IF NOT EXISTS responses_t_expiry ON responses_t (expires_at)');
    db.exec('CREATE INDEX IF NOT EXISTS responses_t_age ON responses_t (tenant, seq)');
    this.#get = db.prepare('SELECT tenant, id, root, parent, created_at, expires_at, conv, ids, response FROM responses_t WHERE tenant = ? AND id = ?');
    this.#put = db.prepare(
      'INSERT INTO responses_t (tenant, id, root, parent, created_at, expires_at, bytes, conv, ids, response) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
    );
    this.#bytesOf = db.prepare('SELECT bytes FROM responses_t WHERE tenant = ? AND id = ?');
    this.#del = db.prepare('DELETE FROM responses_t WHERE tenant = ? AND id = ?');
    this.#oldest = db.prepare('SELECT seq, bytes FROM responses_t WHERE tenant = ? ORDER BY seq LIMIT ?');
    this.#delSeq = db.prepare('DELETE FROM responses_t WHERE seq = ?');
    this.#sweep = db.prepare('DELETE FROM responses_t WHERE expires_at <= ?');
    this.#totals = db.prepare('SELECT tenant, count(*) AS n, coalesce(sum(bytes), 0) AS b FROM responses_t GROUP BY tenant');
    this.sweep(Date.now());
    this.#recount();
  }

  #recount(): void {
    this.#tenants.clear();
    this.count = 0;
    this.bytes = 0;
    for (const t of this.#totals.all()) {
      this.#tenants.set(t.tenant, { count: t.n, bytes: t.b });
      this.count += t.n;
      this.bytes += t.b;
    }
  }

  #of(tenant: string): Totals {
    let t = this.#tenants.get(tenant);
    if (t === undefined) this.#tenants.set(tenant, (t = { count: 0, bytes: 0 }));
    return t;
  }

  #charge(t: Totals, n: number, bytes: number): void {
    t.count += n;
    t.bytes += bytes;
    this.count += n;
    this.bytes += bytes;
  }

  get(tenant: string, id: string): StoredResponse | null {
    const row = this.#get.get(tenant, id);
    if (row === undefined || row.expires_at <= Date.now()) return null;
    return { tenant: row.tenant, id: row.id, root: row.root, parent: row.parent, createdAt: row.created_at, conv: row.conv, ids: row.ids, response: row.response };
  }

  put(r: StoredResponse): boolean {
    const bytes = recordBytes(r);
    this.#removeId(r.tenant, r.id); // ids are unique; a rewrite replaces
    // a record larger than a tenant's whole budget is not kept (the turn answers store: false)
    if (bytes > this.#maxBytes) return false;
    this.#put.run(r.tenant, r.id, r.root, r.parent, r.createdAt, Date.now() + this.#ttlMs, bytes, r.conv, r.ids, r.response);
    const t = this.#of(r.tenant);
    this.#charge(t, 1, bytes);
    if (t.count > this.#maxResponses || t.bytes > this.#maxBytes) this.#evict(r.tenant, t);
    return true;
  }

  #removeId(tenant: string, id: string): boolean {
    const had = this.#bytesOf.get(tenant, id);
    if (had === undefined) return false;
    this.#del.run(tenant, id);
    this.#charge(this.#of(tenant), -1, -had.bytes);
    return true;
  }

  /** Drops the tenant's oldest rows until it is within its bounds (other tenants' rows are never touched). */
  #evict(tenant: string, t: Totals): void {
    while (t.count > this.#maxResponses || t.bytes > this.#maxBytes) {
      const rows = this.#oldest.all(tenant, 64);
      if (rows.length === 0) return;
      for (const row of rows) {
        if (t.count <= this.#maxResponses && t.bytes <= this.#maxBytes) return;
        this.#delSeq.run(row.seq);
        this.#charge(t, -1, -row.bytes);
        this.evictions++;
      }
    }
  }

  delete(tenant: string, id: string): boolean {
    const row = this.#get.get(tenant, id);
    this.#removeId(tenant, id);
    return row !== undefined && row.expires_at > Date.now();
  }

  sweep(now: number): void {
    if (this.#sweep.run(now).changes > 0) this.#recount();
  }

  /** One batch: the writes in one immediate transaction; a failure of it fails the writes, reads are retried alone. */
  run(ops: SqliteOp[]): SqliteResult[] {
    const out: SqliteResult[] = new Array(ops.length);
    const before = [this.count, this.bytes, this.evictions];
    const tenantsBefore = new Map([...this.#tenants].map(([k, v]) => [k, { ...v }]));
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
      this.#tenants.clear();
      for (const [k, v] of tenantsBefore) this.#tenants.set(k, v);
      const message = (err as Error).message || String(err);
      for (let i = 0; i < ops.length; i++) {
        const op = ops[i]!;
        if (op[1] !== OP_GET) out[i] = [op[0], message, null];
        else {
          try {
            out[i] = [op[0], '', this.get(op[2], op[3])];
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
        return [op[0], '', this.get(op[2], op[3])];
      case OP_PUT:
        return [op[0], '', this.put(op[2])];
      default:
        return [op[0], '', this.delete(op[2], op[3])];
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
