// The messages between the SQLite store (sqlite-store.ts, the event loop) and
// its worker thread (sqlite-worker.ts, the database's one owner).
import type { StoredResponse } from './store.js';

export interface SqliteWorkerData {
  path: string;
  ttlMs: number;
  maxResponses: number;
  maxBytes: number;
  /** A write waits this long for another connection's lock before it fails (SQLITE_BUSY). */
  busyTimeoutMs: number;
}

export const OP_GET = 0;
export const OP_PUT = 1;
export const OP_DEL = 2;

/** [request id, OP_GET, tenant, response id] | [rid, OP_PUT, record] | [rid, OP_DEL, tenant, response id] */
export type SqliteOp = [number, typeof OP_GET, string, string] | [number, typeof OP_PUT, StoredResponse] | [number, typeof OP_DEL, string, string];

/** [request id, error message or '', value (get: record or null; del: boolean; put: kept)] */
export type SqliteResult = [number, string, StoredResponse | boolean | null];

export type ToWorker = { t: 'batch'; ops: SqliteOp[] } | { t: 'close' };
export type FromWorker =
  | { t: 'ready'; count: number; bytes: number }
  | { t: 'open-error'; message: string }
  | { t: 'results'; results: SqliteResult[]; count: number; bytes: number; evictions: number }
  | { t: 'closed' };

