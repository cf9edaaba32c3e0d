// The Batches half of the API: POST /v1/batches, GET /v1/batches[/{id}],
// POST /v1/batches/{id}/cancel. Creating and cancelling kick the tracker
// (tracker.ts), which does the rest of a batch's life.
import { randomBytes } from 'node:crypto';
import { cancelKey } from './processor.js';
import { move, type Status } from './tracker.js';
import { BATCH_ID, BatchApiError, expiresAfter, json, now, type ApiAnswer, type BatchHash, type BatchStore } from './store.js';

export const BATCH_ENDPOINTS = ['/v1/chat/completions', '/v1/completions', '/v1/embeddings', '/v1/responses'] as const;
export const COMPLETION_WINDOW = '24h';
const num = (s: string | undefined) => (s === undefined || s === '' ? null : Number(s));

export class Batches {
  readonly #s: BatchStore;
  /** Starts a pass of the tracker over a batch now (instead of at the next tick). */
  readonly #kick: (id: string) => void;

  constructor(s: BatchStore, kick: (id: string) => void) {
    this.#s = s;
    this.#kick = kick;
  }

  /** POST /v1/batches. */
  async createBatch(raw: Buffer, tenant: string): Promise<ApiAnswer> {
    let b: unknown;
    try {
      b = JSON.parse(raw.toString('utf8'));
    } catch (err) {
      throw new BatchApiError(400, `the request body is not JSON: ${(err as Error).message}`, null, 'invalid_request_body');
    }
    if (b === null || typeof b !== 'object' || Array.isArray(b)) throw new BatchApiError(400, 'the request body must be a JSON object', null, 'invalid_request_body');
    const o = b as Record<string, unknown>;
    if (typeof o.input_file_id !== 'string' || o.input_file_id === '') throw new BatchApiError(400, "missing required parameter 'input_file_id'", 'input_file_id', 'missing_required_parameter');
    if (typeof o.endpoint !== 'string' || !(BATCH_ENDPOINTS as readonly string[]).includes(o.endpoint))
      throw new BatchApiError(400, `endpoint must be one of ${BATCH_ENDPOINTS.join(', ')} (got ${JSON.stringify(o.endpoint ?? null)})`, 'endpoint', 'invalid_value');
    if (o.completion_window !== COMPLETION_WINDOW) throw new BatchApiError(400, `completion_window must be "${COMPLETION_WINDOW}" (got ${JSON.stringify(o.completion_window ?? null)})`, 'completion_window', 'invalid_value');
    const md = o.metadata;
    if (md !== undefined && md !== null) {
      const ok = typeof md === 'object' && !Array.isArray(md) && Object.keys(md).length <= 16 && Object.entries(md).every(([k, v]) => k.length <= 64 && typeof v === 'string' && v.length <= 512);
      if (!ok) throw new BatchApiError(400, 'metadata must be an object of at most 16 string values (keys ≤ 64, values ≤ 512 characters)', 'metadata', 'invalid_value');
    }
    // output_expires_after: the expiry of its output and error files, from their own creation
    const oe = o.output_expires_after;
    if (oe !== undefined && (oe === null || typeof oe !== 'object' || Array.isArray(oe))) throw new BatchApiError(400, 'output_expires_after must be an object {anchor: "created_at", seconds}', 'output_expires_after', 'invalid_value');
    const oeo = (oe ?? {}) as Record<string, unknown>;
    const outputExpires = oe === undefined ? 0 : expiresAfter(oeo.anchor ?? null, oeo.seconds ?? null, 'output_expires_after', this.#s.cfg.minExpiresAfterSeconds);
    const file = await this.#s.fileMeta(o.input_file_id, tenant);
    if (file === null) throw new BatchApiError(400, `input_file_id ${JSON.stringify(o.input_file_id)}: no such file`, 'input_file_id', 'file_not_found');
    if (file.purpose !== 'batch') throw new BatchApiError(400, `input_file_id ${JSON.stringify(o.input_file_id)} has purpose "${file.purpose}", not "batch"`, 'input_file_id', 'invalid_file_purpose');
    const id = `batch_${randomBytes(16).toString('hex')}`;
    const h: BatchHash = {
      status: 'validating',
      endpoint: o.endpoint,
      input_file_id: o.input_file_id,
      created_at: String(now()),
      metadata: md === undefined || md === null ? '' : json(md),
      total: '0',
      completed: '0',
      failed: '0',
      skipped: '0',
      enqueued: '0',
      tenant,
      output_expires_after: outputExpires > 0 ? String(outputExpires) : '',
    };
    await this.#s.redis.multi().hset(this.#s.batchKey(id), h).zadd(this.#s.batches(tenant), Date.now(), id).sadd(this.#s.active, id).exec();
    this.#kick(id);
    return { status: 200, body: json(batchObject(id, h, this.#s.cfg.expireAfterSeconds)) };
  }

  async retrieveBatch(id: string, tenant: string): Promise<ApiAnswer> {
    const h = await this.#s.batch(id, tenant);
    return { status: 200, body: json(batchObject(id, h, this.#s.cfg.expireAfterSeconds)) };
  }

  /** GET /v1/batches?after=&limit=: newest first. */
  async listBatches(query: string, tenant: string): Promise<ApiAnswer> {
    const index = this.#s.batches(tenant);
    const q = new URLSearchParams(query);
    const limitText = q.get('limit');
    const limit = limitText === null ? 20 : Number(limitText);
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) throw new BatchApiError(400, `limit must be an integer in [1, 100] (got ${JSON.stringify(limitText)})`, 'limit', 'invalid_value');
    const after = q.get('after');
    let start = 0;
    if (after !== null) {
      if (!BATCH_ID.test(after)) throw new BatchApiError(400, `after ${JSON.stringify(after.slice(0, 80))}: no such batch`, 'after', 'invalid_value');
      const rank = await this.#s.redis.zrevrank(index, after);
      if (rank === null) throw new BatchApiError(400, `after ${JSON.stringify(after)}: no such batch`, 'after', 'invalid_value');
      start = rank + 1;
    }
    const ids = await this.#s.redis.zrevrange(index, start, start + limit); // one more: has_more
    const page = ids.slice(0, limit);
    const pipe = this.#s.redis.pipeline();
    for (const id of page) pipe.hgetall(this.#s.batchKey(id));
    const rows = (await pipe.exec()) ?? [];
    const data = [];
    for (let i = 0; i < page.length; i++) {
      const h = rows[i]?.[1] as BatchHash | undefined;
      if (h?.status !== undefined) data.push(batchObject(page[i], h, this.#s.cfg.expireAfterSeconds));
    }
    return { status: 200, body: json({ object: 'list', data, first_id: page[0] ?? null, last_id: page.at(-1) ?? null, has_more: ids.length > limit }) };
  }

  /** POST /v1/batches/{id}/cancel. */
  async cancelBatch(id: string, tenant: string): Promise<ApiAnswer> {
    const h = await this.#s.batch(id, tenant);
    const st = h.status as Status;
    if (st === 'validating' || st === 'in_progress') {
      await this.#s.redis.set(cancelKey(this.#s.prefix, id), '1', 'EX', this.#s.cfg.doneTtlSeconds);
      const set = await move(this.#s, id, st, 'cancelling', 'cancelling_at', String(now()));
      if (set === 0) return this.cancelBatch(id, tenant); // it moved on meanwhile: answer for its new status
      this.#kick(id);
    } else if (st === 'finalizing') {
      // its files are being written: it ends cancelled (with the files of what ran) instead of completed or expired
      if ((await this.#s.redis.setIfStatus(this.#s.batchKey(id), 'final', 'cancelled', 'cancelling_at', String(now()), 'finalizing')) === 0) return this.cancelBatch(id, tenant);
    } else if (st !== 'cancelling' && st !== 'cancelled') {
      throw new BatchApiError(400, `cannot cancel a batch whose status is ${st}`, 'batch_id', 'invalid_state');
    }
    return this.retrieveBatch(id, tenant);
  }
}

/**
 * The Batch object. Fields the reference types as optional and not nullable
 * (errors, the output/error file ids, the timestamps of states not reached)
 * are left out until they have a value, never sent as null.
 */
function batchObject(id: string, h: BatchHash, expireAfterSeconds: number): Record<string, unknown> {
  const created = Number(h.created_at);
  const o: Record<string, unknown> = { id, object: 'batch', endpoint: h.endpoint };
  if (h.errors) o.errors = { object: 'list', data: JSON.parse(h.errors) as unknown };
  o.input_file_id = h.input_file_id;
  o.completion_window = COMPLETION_WINDOW;
  o.status = h.status;
  if (h.output_file_id) o.output_file_id = h.output_file_id;
  if (h.error_file_id) o.error_file_id = h.error_file_id;
  o.created_at = created;
  const at = (k: 'in_progress_at' | 'finalizing_at' | 'completed_at' | 'failed_at' | 'expired_at' | 'cancelling_at' | 'cancelled_at') => {
    const v = num(h[k]);
    if (v !== null) o[k] = v;
  };
  at('in_progress_at');
  o.expires_at = created + expireAfterSeconds;
  at('finalizing_at');
  at('completed_at');
  at('failed_at');
  at('expired_at');
  at('cancelling_at');
  at('cancelled_at');
  o.request_counts = { total: Number(h.total), completed: Number(h.completed), failed: Number(h.failed) };
  o.metadata = h.metadata ? (JSON.parse(h.metadata) as unknown) : null;
  return o;
}
