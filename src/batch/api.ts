// The OpenAI-style Files and Batches API over the async processor's Redis
// stream (docs/batch.md). Files and batch state live in the same Redis as the
// stream, so a batch outlives the router that accepted it: every router with a
// `batch:` block runs the tracker below, which picks up the active batches
// (validates, enqueues the rest, counts results, finalizes) after a restart.
//
// A batch's life: validating (every JSONL line checked; any bad line fails
// the batch with `errors`, as OpenAI's does) → in_progress (its lines enqueued
// to the request stream in chunks, each chunk and the `enqueued` count in one
// script, so a resumed enqueue neither skips nor repeats a line; the request
// id `<batch>.<line>` is the processor's idempotency key in any case) →
// finalizing (the output and error files written from the batch's result
// stream, ordered by line) → completed. Cancel: cancelling (the cancel key
// makes the processor answer not-yet-dispatched lines with status 0; running
// ones finish) → cancelled, with the files of what ran.
//
// Counting: the results arrive in `<prefix>:batch:<id>:out` (one entry per
// line: the processor's store-once script); a Lua script moves the batch's
// cursor over new entries and adds them to its counts in one step, so two
// routers tracking the same batch never count an entry twice.
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { BatchConfig } from '../config/batch.js';
import { cancelKey } from './processor.js';
import { parseMultipart } from './multipart.js';

/** An answer of the API: status, JSON (or file bytes) and its content type. */
export interface ApiAnswer {
  status: number;
  body: string | Buffer;
  contentType?: string;
}

/** A request the API refuses: the OpenAI error fields. */
export class BatchApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
  }
}

export const BATCH_ENDPOINTS = ['/v1/chat/completions', '/v1/completions'] as const;
const COMPLETION_WINDOW = '24h';
const ENQUEUE_CHUNK = 500;
const READ_CHUNK = 1000;
const MAX_ERRORS = 100;

/**
 * Moves the batch's cursor over new result entries and counts them; KEYS[1]
 * batch hash, KEYS[2] result stream; ARGV[1] how many at most. Returns the
 * number of entries read.
 */
const ADVANCE = `
local cur = redis.call('HGET', KEYS[1], 'cursor')
if not cur then cur = '0-0' end
local es = redis.call('XRANGE', KEYS[2], '(' .. cur, '+', 'COUNT', tonumber(ARGV[1]))
local ok, bad, skip = 0, 0, 0
for _, e in ipairs(es) do
  local f = e[2]
  local st = 0
  for i = 1, #f, 2 do if f[i] == 'status' then st = tonumber(f[i + 1]) or 0 end end
  if st == 0 then skip = skip + 1 elseif st >= 200 and st < 300 then ok = ok + 1 else bad = bad + 1 end
  cur = e[1]
end
if #es > 0 then
  redis.call('HSET', KEYS[1], 'cursor', cur)
  redis.call('HINCRBY', KEYS[1], 'completed', ok)
  redis.call('HINCRBY', KEYS[1], 'failed', bad)
  redis.call('HINCRBY', KEYS[1], 'skipped', skip)
end
return #es`;

/** Sets field ARGV[1]..= only when the batch's status is still ARGV[n] (the last arg): KEYS[1] batch hash. Returns 1 when set. */
const SET_IF_STATUS = `
if redis.call('HGET', KEYS[1], 'status') ~= ARGV[#ARGV] then return 0 end
for i = 1, #ARGV - 1, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1`;

type Status = 'validating' | 'failed' | 'in_progress' | 'finalizing' | 'completed' | 'expired' | 'cancelling' | 'cancelled';
/**
 * Appends one chunk of a batch's lines to the request stream and its count, only
 * while the batch is in progress and its count is still ARGV[1]: KEYS[1] batch
 * hash, KEYS[2] request stream; ARGV from, to, result, path, batch id, tenant,
 * then (request id, body) pairs. Returns 1 when appended.
 */
const ENQUEUE_CHUNK_LUA = `
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then return 0 end
if redis.call('HGET', KEYS[1], 'expiring') == '1' then return 0 end
if redis.call('HGET', KEYS[1], 'enqueued') ~= ARGV[1] then return 0 end
for i = 7, #ARGV, 2 do
  redis.call('XADD', KEYS[2], '*', 'id', ARGV[i], 'result', ARGV[3], 'path', ARGV[4], 'batch', ARGV[5], 'tenant', ARGV[6], 'body', ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'enqueued', ARGV[2])
return 1`;

type BatchHash = Record<string, string>;
type ScriptRedis = Redis & {
  advance(hash: string, stream: string, count: number): Promise<number>;
  setIfStatus(hash: string, ...args: string[]): Promise<number>;
  enqueueChunk(hash: string, stream: string, ...args: string[]): Promise<number>;
};

const now = () => Math.floor(Date.now() / 1000);
/** The ids this API hands out (anything else is unknown: never a Redis key of another kind). */
const FILE_ID = /^file-[A-Za-z0-9-]{1,80}$/;
const BATCH_ID = /^batch_[A-Za-z0-9]{1,64}$/;
const num = (s: string | undefined) => (s === undefined || s === '' ? null : Number(s));
const json = (o: unknown) => JSON.stringify(o);

export interface BatchApiOptions {
  config: BatchConfig;
  log: Logger;
  /** How often active batches are looked at, ms (default 200). */
  pollMs?: number;
}

export class BatchApi {
  readonly #cfg: BatchConfig;
  readonly #log: Logger;
  readonly #redis: ScriptRedis;
  readonly #p: string;
  readonly #pollMs: number;
  /** Batches this router is working on now (one step at a time each). */
  readonly #working = new Set<string>();
  #timer: NodeJS.Timeout | null = null;
  #closed = false;

  constructor(o: BatchApiOptions) {
    this.#cfg = o.config;
    this.#log = o.log;
    this.#p = o.config.keyPrefix;
    this.#pollMs = o.pollMs ?? 200;
    this.#redis = new Redis(o.config.redis, { lazyConnect: true, maxRetriesPerRequest: 1, retryStrategy: (n: number) => Math.min(50 * n, 1000) }) as ScriptRedis;
    this.#redis.on('error', (err: Error) => this.#log.debug({ err }, 'batch api: redis error'));
    this.#redis.defineCommand('advance', { numberOfKeys: 2, lua: ADVANCE });
    this.#redis.defineCommand('setIfStatus', { numberOfKeys: 1, lua: SET_IF_STATUS });
    this.#redis.defineCommand('enqueueChunk', { numberOfKeys: 2, lua: ENQUEUE_CHUNK_LUA });
  }

  get maxFileBytes(): number {
    return this.#cfg.maxFileBytes;
  }

  async start(): Promise<void> {
    await this.#redis.connect();
    this.#timer = setInterval(() => void this.#tick(), this.#pollMs);
    this.#timer.unref();
    void this.#tick(); // batches a previous router left active
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer !== null) clearInterval(this.#timer);
    const until = Date.now() + 2000;
    while (this.#working.size > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
    this.#redis.disconnect();
  }

  // ---- keys

  #fileKey(id: string): string {
    return `${this.#p}:file:${id}`;
  }
  #fileData(id: string): string {
    return `${this.#p}:file:${id}:data`;
  }
  #batchKey(id: string): string {
    return `${this.#p}:batch:${id}`;
  }
  #outStream(id: string): string {
    return `${this.#p}:batch:${id}:out`;
  }
  get #index(): string {
    return `${this.#p}:batches`;
  }
  get #active(): string {
    return `${this.#p}:batches:active`;
  }
  /** Every file's id, scored by its upload time in ms (GET /v1/files lists it newest first). */
  get #files(): string {
    return `${this.#p}:files`;
  }

  // ---- files

  /** POST /v1/files: a multipart body with `purpose` = batch and a JSONL `file`. */
  async uploadFile(contentType: string, body: Buffer): Promise<ApiAnswer> {
    const parts = parseMultipart(contentType, body);
    if (typeof parts === 'string') throw new BatchApiError(400, parts, null, 'invalid_request_body');
    const purpose = parts.get('purpose');
    if (purpose === undefined) throw new BatchApiError(400, "missing required parameter 'purpose'", 'purpose', 'missing_required_parameter');
    const p = purpose.data.toString('utf8');
    if (p !== 'batch') throw new BatchApiError(400, `purpose must be "batch": this router stores batch input files only (got ${JSON.stringify(p.slice(0, 64))})`, 'purpose', 'invalid_value');
    const file = parts.get('file');
    if (file === undefined || file.filename === null) throw new BatchApiError(400, "missing required parameter 'file' (a part with a filename)", 'file', 'missing_required_parameter');
    const problem = checkJsonl(file.data);
    if (problem !== null) throw new BatchApiError(400, `file is not valid JSONL for a batch: ${problem}`, 'file', 'invalid_file_format');
    const meta = await this.#storeFile(`file-${randomBytes(12).toString('hex')}`, file.filename, 'batch', file.data);
    return { status: 200, body: json(meta) };
  }

  async #storeFile(id: string, filename: string, purpose: string, data: Buffer): Promise<Record<string, unknown>> {
    const created = now();
    await this.#redis
      .multi()
      .set(this.#fileData(id), data)
      .hset(this.#fileKey(id), 'filename', filename, 'purpose', purpose, 'bytes', String(data.length), 'created_at', String(created))
      .zadd(this.#files, Date.now(), id)
      .exec();
    return fileObject(id, { filename, purpose, bytes: String(data.length), created_at: String(created) });
  }

  async #fileMeta(id: string): Promise<BatchHash | null> {
    if (!FILE_ID.test(id)) return null;
    const h = await this.#redis.hgetall(this.#fileKey(id));
    return h.purpose === undefined ? null : h;
  }

  async retrieveFile(id: string): Promise<ApiAnswer> {
    const h = await this.#fileMeta(id);
    if (h === null) throw noSuchFile(id);
    return { status: 200, body: json(fileObject(id, h)) };
  }

  async fileContent(id: string): Promise<ApiAnswer> {
    if (!FILE_ID.test(id)) throw noSuchFile(id);
    const [h, data] = await Promise.all([this.#fileMeta(id), this.#redis.getBuffer(this.#fileData(id))]);
    if (h === null || data === null) throw noSuchFile(id);
    return { status: 200, body: data, contentType: 'application/octet-stream' };
  }

  /**
   * GET /v1/files?purpose=&limit=&order=&after=: OpenAI's list shape, newest
   * first by default; `limit` in [1, 10000] (default 10000, as OpenAI's).
   * A purpose filter walks the index a page at a time, so its cost is bounded
   * by what it skips, not by the whole store.
   */
  async listFiles(query: string): Promise<ApiAnswer> {
    const q = new URLSearchParams(query);
    const limitText = q.get('limit');
    const limit = limitText === null ? 10000 : Number(limitText);
    if (!Number.isInteger(limit) || limit < 1 || limit > 10000) throw new BatchApiError(400, `limit must be an integer in [1, 10000] (got ${JSON.stringify(limitText)})`, 'limit', 'invalid_value');
    const order = q.get('order') ?? 'desc';
    if (order !== 'asc' && order !== 'desc') throw new BatchApiError(400, `order must be "asc" or "desc" (got ${JSON.stringify(order.slice(0, 80))})`, 'order', 'invalid_value');
    const purpose = q.get('purpose');
    if (purpose !== null && purpose !== 'batch' && purpose !== 'batch_output')
      throw new BatchApiError(400, `purpose ${JSON.stringify(purpose.slice(0, 80))}: this router stores "batch" and "batch_output" files only`, 'purpose', 'invalid_value');
    const after = q.get('after');
    const asc = order === 'asc';
    let start = 0;
    if (after !== null) {
      const rank = FILE_ID.test(after) ? await (asc ? this.#redis.zrank(this.#files, after) : this.#redis.zrevrank(this.#files, after)) : null;
      if (rank === null) throw new BatchApiError(400, `after ${JSON.stringify(after.slice(0, 80))}: no such file`, 'after', 'invalid_value');
      start = rank + 1;
    }
    const data: Record<string, unknown>[] = [];
    let hasMore = false;
    const page = Math.min(limit + 1, 1000);
    for (;;) {
      const ids = await (asc ? this.#redis.zrange(this.#files, start, start + page - 1) : this.#redis.zrevrange(this.#files, start, start + page - 1));
      if (ids.length === 0) break;
      const pipe = this.#redis.pipeline();
      for (const id of ids) pipe.hgetall(this.#fileKey(id));
      const rows = (await pipe.exec()) ?? [];
      for (let i = 0; i < ids.length; i++) {
        const h = rows[i]?.[1] as BatchHash | undefined;
        if (h?.purpose === undefined || (purpose !== null && h.purpose !== purpose)) continue;
        if (data.length === limit) {
          hasMore = true;
          break;
        }
        data.push(fileObject(ids[i], h));
      }
      if (hasMore || ids.length < page) break;
      start += ids.length;
    }
    return { status: 200, body: json({ object: 'list', data, first_id: (data[0]?.id as string | undefined) ?? null, last_id: (data.at(-1)?.id as string | undefined) ?? null, has_more: hasMore }) };
  }

  async deleteFile(id: string): Promise<ApiAnswer> {
    if (!FILE_ID.test(id)) throw noSuchFile(id);
    const [del] = (await this.#redis.multi().del(this.#fileKey(id), this.#fileData(id)).zrem(this.#files, id).exec()) ?? [];
    if (del?.[1] === 0) throw noSuchFile(id);
    return { status: 200, body: json({ id, object: 'file', deleted: true }) };
  }

  // ---- batches

  /** POST /v1/batches. */
  async createBatch(raw: Buffer, tenant = ''): Promise<ApiAnswer> {
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
    const file = await this.#fileMeta(o.input_file_id);
    if (file === null) throw new BatchApiError(400, `input_file_id ${JSON.stringify(o.input_file_id)}: no such file`, 'input_file_id', 'file_not_found');
    if (file.purpose !== 'batch') throw new BatchApiError(400, `input_file_id ${JSON.stringify(o.input_file_id)} has purpose "${file.purpose}", not "batch"`, 'input_file_id', 'invalid_file_purpose');
    const id = `batch_${randomBytes(12).toString('hex')}`;
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
    };
    await this.#redis.multi().hset(this.#batchKey(id), h).zadd(this.#index, Date.now(), id).sadd(this.#active, id).exec();
    void this.#step(id);
    return { status: 200, body: json(batchObject(id, h, this.#cfg.expireAfterSeconds)) };
  }

  async retrieveBatch(id: string): Promise<ApiAnswer> {
    const h = await this.#batch(id);
    return { status: 200, body: json(batchObject(id, h, this.#cfg.expireAfterSeconds)) };
  }

  async #batch(id: string): Promise<BatchHash> {
    const h = BATCH_ID.test(id) ? await this.#redis.hgetall(this.#batchKey(id)) : {};
    if (h.status === undefined) throw new BatchApiError(404, `No batch found with id ${JSON.stringify(id)}`, 'batch_id', 'not_found');
    return h;
  }

  /** GET /v1/batches?after=&limit=: newest first. */
  async listBatches(query: string): Promise<ApiAnswer> {
    const q = new URLSearchParams(query);
    const limitText = q.get('limit');
    const limit = limitText === null ? 20 : Number(limitText);
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) throw new BatchApiError(400, `limit must be an integer in [1, 100] (got ${JSON.stringify(limitText)})`, 'limit', 'invalid_value');
    const after = q.get('after');
    let start = 0;
    if (after !== null) {
      if (!BATCH_ID.test(after)) throw new BatchApiError(400, `after ${JSON.stringify(after.slice(0, 80))}: no such batch`, 'after', 'invalid_value');
      const rank = await this.#redis.zrevrank(this.#index, after);
      if (rank === null) throw new BatchApiError(400, `after ${JSON.stringify(after)}: no such batch`, 'after', 'invalid_value');
      start = rank + 1;
    }
    const ids = await this.#redis.zrevrange(this.#index, start, start + limit); // one more: has_more
    const page = ids.slice(0, limit);
    const pipe = this.#redis.pipeline();
    for (const id of page) pipe.hgetall(this.#batchKey(id));
    const rows = (await pipe.exec()) ?? [];
    const data = [];
    for (let i = 0; i < page.length; i++) {
      const h = rows[i]?.[1] as BatchHash | undefined;
      if (h?.status !== undefined) data.push(batchObject(page[i], h, this.#cfg.expireAfterSeconds));
    }
    return { status: 200, body: json({ object: 'list', data, first_id: page[0] ?? null, last_id: page.at(-1) ?? null, has_more: ids.length > limit }) };
  }

  /** POST /v1/batches/{id}/cancel. */
  async cancelBatch(id: string): Promise<ApiAnswer> {
    const h = await this.#batch(id);
    const st = h.status as Status;
    if (st === 'validating' || st === 'in_progress') {
      await this.#redis.set(cancelKey(this.#p, id), '1', 'EX', this.#cfg.doneTtlSeconds);
      const set = await this.#redis.setIfStatus(this.#batchKey(id), 'status', 'cancelling', 'cancelling_at', String(now()), st);
      if (set === 0) return this.cancelBatch(id); // it moved on meanwhile: answer for its new status
      void this.#step(id);
    } else if (st !== 'cancelling' && st !== 'cancelled') {
      throw new BatchApiError(400, `cannot cancel a batch whose status is ${st}`, 'batch_id', 'invalid_state');
    }
    return this.retrieveBatch(id);
  }

  // ---- the tracker

  async #tick(): Promise<void> {
    if (this.#closed) return;
    let ids: string[];
    try {
      ids = await this.#redis.smembers(this.#active);
    } catch {
      return; // Redis away: the next tick
    }
    for (const id of ids) if (!this.#working.has(id)) void this.#step(id);
  }

  /** One pass over a batch: whatever its status asks for next. */
  async #step(id: string): Promise<void> {
    if (this.#working.has(id) || this.#closed) return;
    this.#working.add(id);
    try {
      let h = await this.#redis.hgetall(this.#batchKey(id));
      if (h.status === 'validating') {
        await this.#validate(id, h);
        h = await this.#redis.hgetall(this.#batchKey(id));
      }
      if (h.status === 'in_progress' && h.expiring !== '1' && now() >= Number(h.created_at) + this.#cfg.expireAfterSeconds) {
        // past its window: what is not dispatched yet is skipped (as a cancel does), what runs finishes, then it ends expired
        await this.#redis.set(cancelKey(this.#p, id), '1', 'EX', this.#cfg.doneTtlSeconds);
        await this.#redis.setIfStatus(this.#batchKey(id), 'expiring', '1', 'in_progress');
        h = await this.#redis.hgetall(this.#batchKey(id));
      }
      if (h.status === 'in_progress') {
        const expiring = h.expiring === '1';
        if (!expiring && Number(h.enqueued) < Number(h.total)) await this.#enqueue(id, h);
        h = await this.#count(id);
        if (h.status === 'in_progress' && answered(h) >= Number(expiring ? h.enqueued : h.total)) {
          if ((await this.#redis.setIfStatus(this.#batchKey(id), 'status', 'finalizing', 'finalizing_at', String(now()), 'final', expiring ? 'expired' : 'completed', 'in_progress')) === 1) h.status = 'finalizing';
        }
      }
      if (h.status === 'cancelling') {
        h = await this.#count(id);
        if (answered(h) >= Number(h.enqueued)) {
          if ((await this.#redis.setIfStatus(this.#batchKey(id), 'status', 'finalizing', 'finalizing_at', String(now()), 'final', 'cancelled', 'cancelling')) === 1) h.status = 'finalizing';
        }
      }
      if (h.status === 'finalizing') await this.#finalize(id);
      else if (h.status === undefined || h.status === 'completed' || h.status === 'failed' || h.status === 'cancelled' || h.status === 'expired') await this.#redis.srem(this.#active, id);
    } catch (err) {
      if (!this.#closed) this.#log.warn({ err: (err as Error).message, batch: id }, 'batch api: step failed; retried on the next tick');
    } finally {
      this.#working.delete(id);
    }
  }

  async #count(id: string): Promise<BatchHash> {
    while ((await this.#redis.advance(this.#batchKey(id), this.#outStream(id), READ_CHUNK)) === READ_CHUNK);
    return this.#redis.hgetall(this.#batchKey(id));
  }

  async #lines(h: BatchHash): Promise<Buffer> {
    const data = await this.#redis.getBuffer(this.#fileData(h.input_file_id));
    if (data === null) throw new BatchApiError(400, `input file ${h.input_file_id} was deleted`, 'input_file_id', 'file_not_found');
    return data;
  }

  async #validate(id: string, h: BatchHash): Promise<void> {
    let data: Buffer;
    try {
      data = await this.#lines(h);
    } catch (err) {
      if (!(err instanceof BatchApiError)) throw err;
      await this.#fail(id, [{ code: err.code, message: err.message, param: err.param, line: null }]);
      return;
    }
    const errors: BatchLineError[] = [];
    const seen = new Set<string>();
    let total = 0;
    forEachLine(data, (line, n) => {
      total++;
      const e = checkLine(line, n, h.endpoint, seen);
      if (e !== null && errors.length < MAX_ERRORS) errors.push(e);
    });
    if (total === 0) errors.push({ code: 'empty_file', message: 'the input file has no requests', param: 'input_file_id', line: null });
    if (errors.length > 0) await this.#fail(id, errors);
    else await this.#redis.setIfStatus(this.#batchKey(id), 'status', 'in_progress', 'in_progress_at', String(now()), 'total', String(total), 'validating');
  }

  async #fail(id: string, errors: BatchLineError[]): Promise<void> {
    await this.#redis.setIfStatus(this.#batchKey(id), 'status', 'failed', 'failed_at', String(now()), 'errors', json(errors), 'validating');
    await this.#redis.srem(this.#active, id);
  }

  /** Enqueues the lines not enqueued yet, a chunk per script call (the chunk and the count together); stops when the batch is cancelled. */
  async #enqueue(id: string, h: BatchHash): Promise<void> {
    const data = await this.#lines(h);
    const c = this.#cfg;
    const result = `stream:${this.#outStream(id)}`;
    let from = Number(h.enqueued);
    const bodies: string[] = [];
    forEachLine(data, (line) => {
      bodies.push(json((JSON.parse(line) as { body: unknown }).body));
    });
    while (from < bodies.length && !this.#closed) {
      const to = Math.min(from + ENQUEUE_CHUNK, bodies.length);
      const args: string[] = [String(from), String(to), result, h.endpoint, id, h.tenant ?? ''];
      for (let i = from; i < to; i++) args.push(`${id}.${i}`, bodies[i]);
      // the chunk goes in only while the batch is in progress and nobody enqueued it before (another router, a cancel)
      if ((await this.#redis.enqueueChunk(this.#batchKey(id), c.stream, ...args)) === 0) return;
      from = to;
    }
  }

  /** Writes the output and error files from the result stream (ordered by line) and ends the batch. Repeatable: the file ids come from the batch id. */
  async #finalize(id: string): Promise<void> {
    const h = await this.#redis.hgetall(this.#batchKey(id));
    const data = await this.#lines(h);
    const customIds: string[] = [];
    forEachLine(data, (line) => {
      customIds.push((JSON.parse(line) as { custom_id: string }).custom_id);
    });
    const results = new Map<number, [number, string]>();
    let cur = '-';
    for (;;) {
      const es = (await this.#redis.xrange(this.#outStream(id), cur, '+', 'COUNT', READ_CHUNK)) as [string, string[]][];
      for (const [eid, f] of es) {
        if (eid === cur) continue;
        const m = new Map<string, string>();
        for (let i = 0; i + 1 < f.length; i += 2) m.set(f[i], f[i + 1]);
        const line = Number((m.get('id') ?? '').slice(id.length + 1));
        if (Number.isInteger(line)) results.set(line, [Number(m.get('status')), m.get('body') ?? '']);
      }
      if (es.length < READ_CHUNK) break;
      cur = es.at(-1)![0];
    }
    const out: string[] = [];
    const errs: string[] = [];
    const tag = id.slice('batch_'.length);
    const expired = h.final === 'expired';
    for (let i = 0; i < customIds.length; i++) {
      const r = results.get(i);
      if (r === undefined || r[0] === 0) {
        // not run: left out of a cancelled batch's files; in an expired batch's error file, as OpenAI does
        if (expired) errs.push(json({ id: `batch_req_${tag}_${i}`, custom_id: customIds[i], response: null, error: { code: 'batch_expired', message: 'This request could not be executed before the completion window expired.' } }));
        continue;
      }
      let body: unknown;
      try {
        body = JSON.parse(r[1]);
      } catch {
        body = r[1];
      }
      const line = json({ id: `batch_req_${tag}_${i}`, custom_id: customIds[i], response: { status_code: r[0], request_id: `${id}.${i}`, body }, error: null });
      (r[0] >= 200 && r[0] < 300 ? out : errs).push(line);
    }
    const outId = out.length > 0 ? `file-${tag}-output` : '';
    const errId = errs.length > 0 ? `file-${tag}-errors` : '';
    if (outId !== '') await this.#storeFile(outId, `${id}_output.jsonl`, 'batch_output', Buffer.from(out.join('\n') + '\n'));
    if (errId !== '') await this.#storeFile(errId, `${id}_error.jsonl`, 'batch_output', Buffer.from(errs.join('\n') + '\n'));
    const final = h.final === 'cancelled' || h.final === 'expired' ? h.final : 'completed';
    await this.#redis.setIfStatus(this.#batchKey(id), 'status', final, `${final}_at`, String(now()), 'output_file_id', outId, 'error_file_id', errId, 'finalizing');
    await this.#redis.multi().srem(this.#active, id).del(this.#outStream(id)).exec();
  }
}

interface BatchLineError {
  code: string | null;
  message: string;
  param: string | null;
  line: number | null;
}

function answered(h: BatchHash): number {
  return Number(h.completed) + Number(h.failed) + Number(h.skipped);
}

function noSuchFile(id: string): BatchApiError {
  return new BatchApiError(404, `No such File object: ${JSON.stringify(id)}`, 'file_id', 'not_found');
}

/** Calls fn for each non-blank line of a JSONL buffer with its 1-based line number. */
function forEachLine(data: Buffer, fn: (line: string, n: number) => void): void {
  const text = data.toString('utf8');
  let n = 0;
  let start = 0;
  while (start <= text.length) {
    let end = text.indexOf('\n', start);
    if (end < 0) end = text.length;
    n++;
    const line = text.slice(start, end).trim();
    if (line !== '') fn(line, n);
    start = end + 1;
  }
}

/** Why a file is not JSONL of objects (the first bad line), or null. */
export function checkJsonl(data: Buffer): string | null {
  let problem: string | null = null;
  let lines = 0;
  forEachLine(data, (line, n) => {
    lines++;
    if (problem !== null) return;
    try {
      const v = JSON.parse(line) as unknown;
      if (v === null || typeof v !== 'object' || Array.isArray(v)) problem = `line ${n} is not a JSON object`;
    } catch (err) {
      problem = `line ${n} is not JSON (${(err as Error).message})`;
    }
  });
  if (problem === null && lines === 0) problem = 'the file is empty';
  return problem;
}

/** A batch input line's problem (OpenAI's per-line errors), or null. */
function checkLine(line: string, n: number, endpoint: string, seen: Set<string>): BatchLineError | null {
  let v: Record<string, unknown>;
  try {
    v = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return { code: 'invalid_json_line', message: `line ${n} is not JSON`, param: null, line: n };
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return { code: 'invalid_json_line', message: `line ${n} is not a JSON object`, param: null, line: n };
  if (typeof v.custom_id !== 'string' || v.custom_id === '') return { code: 'missing_required_parameter', message: `line ${n}: custom_id must be a non-empty string`, param: 'custom_id', line: n };
  if (seen.has(v.custom_id)) return { code: 'duplicate_custom_id', message: `line ${n}: custom_id ${JSON.stringify(v.custom_id.slice(0, 64))} appears more than once`, param: 'custom_id', line: n };
  seen.add(v.custom_id);
  if (v.method !== 'POST') return { code: 'invalid_value', message: `line ${n}: method must be "POST"`, param: 'method', line: n };
  if (v.url !== endpoint) return { code: 'mismatched_url', message: `line ${n}: url ${JSON.stringify(v.url ?? null)} is not the batch's endpoint ${endpoint}`, param: 'url', line: n };
  const b = v.body as Record<string, unknown> | undefined;
  if (b === null || typeof b !== 'object' || Array.isArray(b)) return { code: 'invalid_value', message: `line ${n}: body must be a JSON object`, param: 'body', line: n };
  if (typeof b.model !== 'string' || b.model === '') return { code: 'missing_required_parameter', message: `line ${n}: body.model must be a non-empty string`, param: 'body.model', line: n };
  if (b.stream === true) return { code: 'invalid_value', message: `line ${n}: body.stream is not supported in a batch`, param: 'body.stream', line: n };
  if (endpoint === '/v1/chat/completions' && !Array.isArray(b.messages)) return { code: 'missing_required_parameter', message: `line ${n}: body.messages must be an array`, param: 'body.messages', line: n };
  if (endpoint === '/v1/completions' && b.prompt === undefined) return { code: 'missing_required_parameter', message: `line ${n}: body.prompt is required`, param: 'body.prompt', line: n };
  return null;
}

function fileObject(id: string, h: BatchHash): Record<string, unknown> {
  return { id, object: 'file', bytes: Number(h.bytes), created_at: Number(h.created_at), filename: h.filename, purpose: h.purpose, status: 'processed', expires_at: null, status_details: null };
}

function batchObject(id: string, h: BatchHash, expireAfterSeconds: number): Record<string, unknown> {
  const created = Number(h.created_at);
  return {
    id,
    object: 'batch',
    endpoint: h.endpoint,
    errors: h.errors ? { object: 'list', data: JSON.parse(h.errors) as unknown } : null,
    input_file_id: h.input_file_id,
    completion_window: COMPLETION_WINDOW,
    status: h.status,
    output_file_id: h.output_file_id || null,
    error_file_id: h.error_file_id || null,
    created_at: created,
    in_progress_at: num(h.in_progress_at),
    expires_at: created + expireAfterSeconds,
    finalizing_at: num(h.finalizing_at),
    completed_at: num(h.completed_at),
    failed_at: num(h.failed_at),
    expired_at: num(h.expired_at),
    cancelling_at: num(h.cancelling_at),
    cancelled_at: num(h.cancelled_at),
    request_counts: { total: Number(h.total), completed: Number(h.completed), failed: Number(h.failed) },
    metadata: h.metadata ? (JSON.parse(h.metadata) as unknown) : null,
  };
}
