// The SQLite Responses store's worker thread: the one owner of the database
// file. better-sqlite3 is synchronous, so every statement runs here and never
// on the router's event loop (sqlite-store.ts is the event loop's side). The
// router sends batches of operations (one message per event-loop turn); the
// worker runs a batch's writes in ONE transaction (one WAL commit for every
// turn stored in that loop turn: group commit) and answers the whole batch in
// one message. WAL mode with synchronous=NORMAL: a commit is durable against a
// crash of the router process; a power loss may lose the last commits.
// Keyed by (tenant, id); bounded like the memory store (count and bytes per
// tenant, a continuation charged for what its turn added), oldest first (an
// LRU would cost a write per read); expired rows are swept here too.
import { parentPort, workerData } from 'node:worker_threads';
import Database from 'better-sqlite3';
import { entryBytes, linksParent, MAX_LINKS, partBytes, type StoredResponse } from './store.js';
import { OP_GET, OP_PUT, type FromWorker, type SqliteOp, type SqliteResult, type SqliteWorkerData, type ToWorker } from './sqlite-protocol.js';

interface Row {
  seq: number;
  root: string;
  parent: string;
  created_at: number;
  expires_at: number;
  up: number;
  conv: string;
  ids: string;
  response: string;
}

/** What removing a record needs of its row. */
interface Held {
  seq: number;
  bytes: number;
  part_bytes: number;
  up: number;
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
  readonly #link: Database.Statement<[number], { up: number; conv: string; ids: string }>;
  readonly #parentOf: Database.Statement<[string, string], { seq: number; depth: number; chain_bytes: number }>;
  readonly #put: Database.Statement<unknown[]>;
  readonly #kidsInc: Database.Statement<[number]>;
  readonly #kidsDec: Database.Statement<[number]>;
  readonly #held: Database.Statement<[string, string], Held>;
  readonly #kill: Database.Statement<[number]>;
  readonly #upOf: Database.Statement<[number], { up: number; kids: number; live: number; part_bytes: number }>;
  readonly #delSeq: Database.Statement<[number]>;
  readonly #oldest: Database.Statement<[string, number], Held>;
  readonly #expired: Database.Statement<[number], Held & { tenant: string }>;
  readonly #totals: Database.Statement<[], { tenant: string; n: number; b: number }>;

  constructor(d: SqliteWorkerData) {
    this.#ttlMs = d.ttlMs;
    this.#maxResponses = d.maxResponses;
    this.#maxBytes = d.maxBytes;
    const db = (this.db = new Database(d.path, { timeout: d.busyTimeoutMs }));
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = NORMAL');
    // One row per record. A continuation's row holds what its turn added and
    // the seq of its parent's row (`up`); a row whose record was deleted,
    // evicted or expired stays (live = 0, its response dropped) while rows
    // below it (`kids`) need its part. Keyed by (tenant, id) among live rows:
    // a tenant's lookups never see another's rows.
    db.exec(`CREATE TABLE IF NOT EXISTS responses_p (
      seq INTEGER PRIMARY KEY AUTOINCREMENT,
      tenant TEXT NOT NULL,
      id TEXT NOT NULL,
      root TEXT NOT NULL,
      parent TEXT NOT NULL,
      created_at INTEGER NOT NULL,
      expires_at INTEGER NOT NULL,
      bytes INTEGER NOT NULL,
      part_bytes INTEGER NOT NULL,
      chain_bytes INTEGER NOT NULL,
      up INTEGER NOT NULL,
      depth INTEGER NOT NULL,
      kids INTEGER NOT NULL DEFAULT 0,
      live INTEGER NOT NULL DEFAULT 1,
      conv TEXT NOT NULL,
      ids TEXT NOT NULL,
      response TEXT NOT NULL)`);
    db.exec('CREATE UNIQUE INDEX IF NOT EXISTS responses_p_key ON responses_p (tenant, id) WHERE live = 1');
    db.exec('CREATE INDEX IF NOT EXISTS responses_p_expiry ON responses_p (expires_at) WHERE live = 1');
    db.exec('CREATE INDEX IF NOT EXISTS responses_p_age ON responses_p (tenant, seq) WHERE live = 1');
    this.#migrate();
    this.#get = db.prepare('SELECT seq, root, parent, created_at, expires_at, up, conv, ids, response FROM responses_p WHERE tenant = ? AND id = ? AND live = 1');
    this.#link = db.prepare('SELECT up, conv, ids FROM responses_p WHERE seq = ?');
    this.#parentOf = db.prepare('SELECT seq, depth, chain_bytes FROM responses_p WHERE tenant = ? AND id = ? AND live = 1');
    this.#put = db.prepare(
      'INSERT INTO responses_p (tenant, id, root, parent, created_at, expires_at, bytes, part_bytes, chain_bytes, up, depth, conv, ids, response) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
    );
    this.#kidsInc = db.prepare('UPDATE responses_p SET kids = kids + 1 WHERE seq = ?');
    this.#kidsDec = db.prepare('UPDATE responses_p SET kids = kids - 1 WHERE seq = ?');
    this.#held = db.prepare('SELECT seq, bytes, part_bytes, up FROM responses_p WHERE tenant = ? AND id = ? AND live = 1');
    this.#kill = db.prepare("UPDATE responses_p SET live = 0, bytes = 0, response = '' WHERE seq = ?");
    this.#upOf = db.prepare('SELECT up, kids, live, part_bytes FROM responses_p WHERE seq = ?');
    this.#delSeq = db.prepare('DELETE FROM responses_p WHERE seq = ?');
    this.#oldest = db.prepare('SELECT seq, bytes, part_bytes, up FROM responses_p WHERE tenant = ? AND live = 1 ORDER BY seq LIMIT ?');
    this.#expired = db.prepare('SELECT seq, tenant, bytes, part_bytes, up FROM responses_p WHERE live = 1 AND expires_at <= ? LIMIT 1000');
    this.#totals = db.prepare('SELECT tenant, sum(live) AS n, coalesce(sum(bytes + part_bytes), 0) AS b FROM responses_p GROUP BY tenant');
    this.#repair();
    this.sweep(Date.now());
    this.#recount();
  }

  /**
   * A file from before conversations were kept as parts (table responses_t:
   * every record whole) is copied once into responses_p as whole rows, and
   * the old table emptied in the same transaction (a response deleted later
   * must not come back under an older router; that router finds no records
   * and its continuations are 404). Checked again inside the immediate
   * transaction, so two routers opening the file at once copy it once.
   */
  #migrate(): void {
    const db = this.db;
    if ((db.pragma('user_version', { simple: true }) as number) >= 2) return;
    db.transaction(() => {
      if ((db.pragma('user_version', { simple: true }) as number) >= 2) return;
      const old = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'responses_t'").get();
      if (old !== undefined) {
        db.prepare(
          `INSERT INTO responses_p (tenant, id, root, parent, created_at, expires_at, bytes, part_bytes, chain_bytes, up, depth, conv, ids, response)
           SELECT tenant, id, root, parent, created_at, expires_at, length(response) + 3 * length(id) + 128, length(conv) + length(ids) + 32,
                  length(conv) + length(ids) + 32, 0, 0, conv, ids, response
           FROM responses_t WHERE expires_at > ? ORDER BY seq`,
        ).run(Date.now());
        db.exec('DELETE FROM responses_t');
      }
      db.pragma('user_version = 2');
    }).immediate();
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
    let conv = row.conv;
    let ids = row.ids;
    if (row.up !== 0) {
      const cs = [conv];
      const is = [ids];
      for (let up = row.up, n = 0; up !== 0; n++) {
        const p = n < MAX_LINKS ? this.#link.get(up) : undefined;
        if (p === undefined) return null; // cannot happen while kids are counted: a broken chain is absent, never half a conversation
        cs.push(p.conv);
        is.push(p.ids);
        up = p.up;
      }
      conv = cs.reverse().join(',');
      ids = is.reverse().join(',');
    }
    return { tenant, id, root: row.root, parent: row.parent, createdAt: row.created_at, conv, ids, response: row.response };
  }

  /** Kept or not; null when `r` came without its whole conversation (what it added only) and cannot be linked: send it whole. */
  put(r: StoredResponse): boolean | null {
    const slim = r.conv === '' && r.addedConv !== undefined;
    const up = slim || linksParent(r) ? this.#parentOf.get(r.tenant, r.parent) : undefined;
    const linked = up !== undefined && up.depth + 1 < MAX_LINKS;
    if (slim && !linked) return null;
    this.#removeId(r.tenant, r.id); // ids are unique; a rewrite replaces
    const conv = linked ? r.addedConv! : r.conv;
    const ids = linked ? r.addedIds! : r.ids;
    const own = entryBytes(r);
    const pb = partBytes(conv.length, ids.length);
    const chain = linked ? up.chain_bytes + pb : pb;
    // a record larger than a tenant's whole budget, with the conversation it needs, is not kept (the turn answers store: false)
    if (own + chain > this.#maxBytes) return false;
    this.#put.run(r.tenant, r.id, r.root, r.parent, r.createdAt, Date.now() + this.#ttlMs, own, pb, chain, linked ? up.seq : 0, linked ? up.depth + 1 : 0, conv, ids, r.response);
    if (linked) this.#kidsInc.run(up.seq);
    const t = this.#of(r.tenant);
    this.#charge(t, 1, own + pb);
    if (t.count > this.#maxResponses || t.bytes > this.#maxBytes) this.#evict(r.tenant, t);
    return true;
  }

  #removeId(tenant: string, id: string): boolean {
    const h = this.#held.get(tenant, id);
    if (h === undefined) return false;
    this.#remove(this.#of(tenant), h);
    return true;
  }

  /** Drops a live record: its row goes, or stays as a part while rows below need it; parts above no one needs go too. */
  #remove(t: Totals, h: Held): void {
    // read again: a row read in a page (eviction, the sweep) may have lost kids since, or gone
    const now = this.#upOf.get(h.seq);
    if (now === undefined || now.live === 0) return;
    this.#charge(t, -1, -h.bytes);
    if (now.kids > 0) {
      this.#kill.run(h.seq);
      return;
    }
    this.#delSeq.run(h.seq);
    this.#charge(t, 0, -h.part_bytes);
    for (let up = h.up; up !== 0; ) {
      this.#kidsDec.run(up);
      const p = this.#upOf.get(up);
      if (p === undefined || p.kids > 0 || p.live !== 0) return;
      this.#delSeq.run(up);
      this.#charge(t, 0, -p.part_bytes);
      up = p.up;
    }
  }

  /** Drops the tenant's oldest records until it is within its bounds (other tenants' rows are never touched). */
  #evict(tenant: string, t: Totals): void {
    while (t.count > this.#maxResponses || t.bytes > this.#maxBytes) {
      const rows = this.#oldest.all(tenant, 64);
      if (rows.length === 0) return;
      for (const row of rows) {
        if (t.count <= this.#maxResponses && t.bytes <= this.#maxBytes) return;
        this.#remove(t, row);
        this.evictions++;
      }
    }
  }

  delete(tenant: string, id: string): boolean {
    const row = this.#get.get(tenant, id);
    this.#removeId(tenant, id);
    return row !== undefined && row.expires_at > Date.now();
  }

  /** Drops expired records, a page at a time, each page in one transaction (a crash leaves no kids count half done), then counts again. */
  sweep(now: number): void {
    let n = 0;
    const page = this.db.transaction(() => {
      const rows = this.#expired.all(now);
      for (const row of rows) this.#remove(this.#of(row.tenant), row);
      return rows.length;
    });
    for (;;) {
      const k = page.immediate();
      n += k;
      if (k < 1000) break;
    }
    if (n > 0) this.#recount();
  }

  /**
   * At open: every kids count from the rows that link to it, and the rows
   * kept only as parts that nothing links to any more dropped (a file another
   * process wrote, or one from before a crash, is made consistent).
   */
  #repair(): void {
    const db = this.db;
    db.transaction(() => {
      db.exec('UPDATE responses_p SET kids = (SELECT count(*) FROM responses_p c WHERE c.up = responses_p.seq)');
      for (;;) {
        const orphans = db.prepare('SELECT seq, up FROM responses_p WHERE live = 0 AND kids = 0').all() as { seq: number; up: number }[];
        if (orphans.length === 0) break;
        const del = db.prepare('DELETE FROM responses_p WHERE seq = ?');
        const dec = db.prepare('UPDATE responses_p SET kids = kids - 1 WHERE seq = ?');
        for (const o of orphans) {
          del.run(o.seq);
          if (o.up !== 0) dec.run(o.up);
        }
      }
    }).immediate();
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
