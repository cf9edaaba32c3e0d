// What the Files, Batches and tracker parts of the API share: the Redis
// client (with the scripts), the key layout, the answer and error types, and
// the file and batch records as Redis holds them.
import { createHash } from 'node:crypto';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { BatchConfig } from '../config/batch.js';
import { SwitchyardError } from '../errors.js';
import { defineScripts, type ScriptRedis } from './lua.js';

/** An answer of the API: status, JSON (or file bytes) and its content type. */
export interface ApiAnswer {
  status: number;
  body: string | Buffer;
  contentType?: string;
  /** A file's bytes sent piece by piece (a download; `body` is then ''): the front end writes each as the client takes it. */
  stream?: FileStream;
}

/** A file's bytes in pieces (at most batch.fileChunkBytes each), read from Redis one at a time. */
export interface FileStream {
  /** The next piece, or null after the last; throws when the data went away meanwhile (the answer is then cut). */
  next(): Promise<Buffer | null>;
}

/** A request the API refuses: the OpenAI error fields. */
/** A Files or Batches API request refused: `status`, `param` and `code` (the OpenAI error code, null: the status's default) go into the answer. */
export class BatchApiError extends SwitchyardError<string | null> {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    override readonly code: string | null = null,
  ) {
    super(message);
  }

  override get swyCode(): string {
    return 'SWY_ERR_BATCH_API';
  }
}

export type BatchHash = Record<string, string>;

export const now = () => Math.floor(Date.now() / 1000);
export const json = (o: unknown) => JSON.stringify(o);
/** The ids this API hands out (anything else is unknown: never a Redis key of another kind). */
export const FILE_ID = /^file-[A-Za-z0-9-]{1,80}$/;
export const BATCH_ID = /^batch_[A-Za-z0-9]{1,64}$/;

export function noSuchFile(id: string): BatchApiError {
  return new BatchApiError(404, `No such File object: ${JSON.stringify(id)}`, 'file_id', 'not_found');
}

export function fileObject(id: string, h: BatchHash): Record<string, unknown> {
  // expires_at and status_details are optional and not nullable in OpenAI's File: left out while unset (expires_at when the file does not expire)
  const o: Record<string, unknown> = { id, object: 'file', bytes: Number(h.bytes), created_at: Number(h.created_at), filename: h.filename, purpose: h.purpose, status: 'processed' };
  if (h.expires_at) o.expires_at = Number(h.expires_at);
  return o;
}

/** The longest expiry OpenAI accepts: 30 days. */
export const MAX_EXPIRES_AFTER_SECONDS = 2_592_000;

/**
 * An `expires_after` policy ({anchor: "created_at", seconds}) as its seconds, or 0 when absent; 400 naming
 * `param` when it is not one. `anchor` and `seconds` as sent (multipart fields are strings).
 */
export function expiresAfter(anchor: unknown, seconds: unknown, param: string, minSeconds: number): number {
  if (anchor === undefined && seconds === undefined) return 0;
  if (anchor !== 'created_at') throw new BatchApiError(400, `${param}.anchor must be "created_at" (got ${JSON.stringify(anchor ?? null)?.slice(0, 64)})`, `${param}.anchor`, 'invalid_value');
  const n = typeof seconds === 'string' && /^[0-9]{1,10}$/.test(seconds) ? Number(seconds) : seconds;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < minSeconds || n > MAX_EXPIRES_AFTER_SECONDS)
    throw new BatchApiError(400, `${param}.seconds must be an integer in [${minSeconds}, ${MAX_EXPIRES_AFTER_SECONDS}] (got ${JSON.stringify(seconds ?? null)?.slice(0, 64)})`, `${param}.seconds`, 'invalid_value');
  return n;
}

/** Throws the first error of a MULTI's replies (ioredis resolves exec() with them rather than rejecting). */
export function failedReply(replies: [Error | null, unknown][] | null): void {
  for (const [err] of replies ?? []) if (err) throw err;
}

/** A batch's finalisation lease and this router's token in it: writes made under it stop once it is another's. */
export interface Fence {
  lease: string;
  token: string;
}

/** A write under a batch's finalisation lease found the lease another router's (this one stalled past it). */
export class LeaseLost extends Error {
  constructor() {
    super('the finalisation lease went to another router');
  }
}

/** The Redis side of the API: one client, the key layout, the file writes both Files and the tracker make. */
export class BatchStore {
  readonly redis: ScriptRedis;
  readonly cfg: BatchConfig;
  readonly log: Logger;
  readonly #p: string;

  constructor(cfg: BatchConfig, log: Logger) {
    this.cfg = cfg;
    this.log = log;
    this.#p = cfg.keyPrefix;
    // every command has a deadline (a frozen Redis answers 503 after it, not never)
    const r = new Redis(cfg.redis, { lazyConnect: true, maxRetriesPerRequest: 1, commandTimeout: cfg.commandTimeoutMs, retryStrategy: (n: number) => Math.min(50 * n, 1000) });
    r.on('error', (err: Error) => log.debug({ err }, 'batch api: redis error'));
    this.redis = defineScripts(r);
  }

  get prefix(): string {
    return this.#p;
  }

  // ---- keys

  fileKey(id: string): string {
    return `${this.#p}:file:${id}`;
  }
  fileData(id: string): string {
    return `${this.#p}:file:${id}:data`;
  }
  batchKey(id: string): string {
    return `${this.#p}:batch:${id}`;
  }
  outStream(id: string): string {
    return `${this.#p}:batch:${id}:out`;
  }
  /** Who finalises a batch now (a router's token, for FINAL_LEASE_MS at a time): one writer of its files. */
  finalizer(id: string): string {
    return `${this.#p}:batch:${id}:finalizer`;
  }
  /** A batch's custom_ids in line order (JSON text, one a line), snapshotted at validation: its files never need the input again. */
  batchIds(id: string): string {
    return `${this.#p}:batch:${id}:ids`;
  }

  /**
   * Writes `data` to `key` as a list of pieces of at most batch.fileChunkBytes
   * (one command per piece, never the whole in one buffer, and no Redis value
   * larger than a piece: a string stops at proto-max-bulk-len, 512 MB by default);
   * `ttlMs` > 0: the key expires then (a copy renamed into place later).
   */
  async putChunked(key: string, data: Buffer, ttlMs = 0): Promise<void> {
    const step = this.cfg.fileChunkBytes;
    const m = this.redis.multi().del(key).rpush(key, data.subarray(0, step));
    if (ttlMs > 0) m.pexpire(key, ttlMs);
    failedReply(await m.exec());
    for (let at = step; at < data.length; at += step) await this.redis.rpush(key, data.subarray(at, at + step));
  }

  /**
   * A file's bytes for a download, a piece per call (a list's elements; a
   * string from before the list layout in fileChunkBytes ranges), so the
   * router holds one piece of a file at a time, not the file; null when the
   * key does not exist.
   */
  async streamChunked(key: string, bytes: number): Promise<FileStream | null> {
    const r = this.redis;
    const type = await r.type(key);
    if (type === 'none') return null;
    if (type !== 'string' && type !== 'list') throw new Error("the file's data is not readable");
    const step = this.cfg.fileChunkBytes;
    let sent = 0;
    // the record's size is what the answer must add up to: data changed or cut behind the API ends it cut, not short
    const whole = () => {
      if (Number.isFinite(bytes) && sent !== bytes) throw new Error(`the file's data (${sent} bytes) is not its recorded ${bytes} bytes`);
      return null;
    };
    let next: () => Promise<Buffer | null>;
    if (type === 'string') {
      const len = await r.strlen(key);
      if (Number.isFinite(bytes) && len !== bytes) throw new Error(`the file's data (${len} bytes) is not its recorded ${bytes} bytes`);
      next = async () => {
        if (sent >= len) return whole();
        const b = await r.getrangeBuffer(key, sent, Math.min(sent + step, len) - 1);
        if (b.length === 0) throw new Error('the file went away during the download');
        sent += b.length;
        return b;
      };
    } else {
      const n = await r.llen(key);
      let at = 0;
      next = async () => {
        if (at >= n) return whole();
        const b = (await r.lrangeBuffer(key, at, at))[0];
        if (b === undefined) throw new Error('the file went away during the download');
        at++;
        sent += b.length;
        return b;
      };
    }
    // the first piece is read before the answer's head goes out: a Redis error then is an OpenAI error answer
    // (503 store_unavailable on a timeout), not a cut connection
    let first: Buffer | null | undefined = await next();
    return {
      next: () => {
        if (first === undefined) return next();
        const b = first;
        first = undefined;
        return Promise.resolve(b);
      },
    };
  }

  /**
   * A file's (or snapshot's) bytes as putChunked and ChunkedFile write them: a
   * list of pieces, read a few pieces a command; a single string as data from
   * before the list layout; null when the key does not exist.
   */
  async readChunked(key: string): Promise<Buffer | null> {
    const type = await this.redis.type(key);
    if (type === 'none') return null;
    if (type === 'string') return this.redis.getBuffer(key);
    const n = await this.redis.llen(key);
    // pieces a command: about 32 MiB a reply at the default piece size
    const page = Math.max(1, Math.floor((32 * 1024 * 1024) / this.cfg.fileChunkBytes));
    const parts: Buffer[] = [];
    let size = 0;
    for (let at = 0; at < n; at += page) {
      for (const b of await this.redis.lrangeBuffer(key, at, at + page - 1)) {
        parts.push(b);
        size += b.length;
      }
    }
    return parts.length === 1 ? parts[0]! : Buffer.concat(parts, size);
  }
  /**
   * A tenant's part of the key space: its lists and usage live under
   * `<prefix>:t:<tag>:`, the tag a digest of the tenant name ('' — the
   * anonymous scope — is `anon`), so no tenant name can reach another's keys.
   */
  #tenant(tenant: string): string {
    return `${this.#p}:t:${tenant === '' ? 'anon' : createHash('sha256').update(tenant).digest('hex').slice(0, 32)}`;
  }
  /** A tenant's batches, scored by their creation time in ms (GET /v1/batches lists it newest first). */
  batches(tenant: string): string {
    return `${this.#tenant(tenant)}:batches`;
  }
  /** A tenant's files, scored by their upload time in ms (GET /v1/files lists it newest first). */
  files(tenant: string): string {
    return `${this.#tenant(tenant)}:files`;
  }
  /** A tenant's file usage: a hash of `files` and `bytes` (batch.fileQuota). */
  usage(tenant: string): string {
    return `${this.#tenant(tenant)}:usage`;
  }
  /** Files with an expiry, scored by their expires_at (the tracker deletes them once past it). */
  get expiring(): string {
    return `${this.#p}:files:expiring`;
  }
  /** The batches the tracker still works on. */
  get active(): string {
    return `${this.#p}:batches:active`;
  }

  // ---- records

  /**
   * Stores an uploaded file for `tenant`, charged to its usage and refused
   * (429) beyond batch.fileQuota. The bytes go to Redis in batch.fileChunkBytes pieces
   * (the client builds each command in one buffer: a 64 MiB file in one
   * command would be a 64 MiB copy on the loop), the record last.
   */
  async storeFile(id: string, filename: string, purpose: string, data: Buffer, tenant: string, expiresAfterSeconds = 0): Promise<Record<string, unknown>> {
    const q = this.cfg.fileQuota;
    if ((await this.redis.chargeFile(this.usage(tenant), q.files, q.bytes, data.length, '1')) === 0)
      throw new BatchApiError(429, `this tenant's files are at the limit of ${q.files} files or ${q.bytes} bytes (batch.fileQuota): delete some first`, 'file', 'file_quota_exceeded');
    const created = now();
    const expires = expiresAfterSeconds > 0 ? String(created + expiresAfterSeconds) : '';
    const key = this.fileData(id);
    try {
      await this.putChunked(key, data);
      const m = this.redis
        .multi()
        .hset(this.fileKey(id), 'filename', filename, 'purpose', purpose, 'bytes', String(data.length), 'created_at', String(created), 'tenant', tenant, 'expires_at', expires)
        .zadd(this.files(tenant), Date.now(), id);
      if (expires !== '') m.zadd(this.expiring, expires, id);
      await m.exec();
    } catch (err) {
      await this.redis.multi().del(key).hincrby(this.usage(tenant), 'files', -1).hincrby(this.usage(tenant), 'bytes', -data.length).exec().catch(() => undefined);
      throw err;
    }
    return fileObject(id, { filename, purpose, bytes: String(data.length), created_at: String(created), expires_at: expires });
  }

  /**
   * A file written a chunk at a time (a batch's output and error files): the
   * lines are pushed to its data key, a list, in pieces of at most
   * batch.fileChunkBytes, its record written last (a reader sees the whole file
   * or none), so no single string or Redis value ever holds the whole file and
   * an output of any size fits. Charged to `tenant`, never refused. With a
   * `fence`, every piece is pushed only while that lease is this router's
   * (LeaseLost otherwise).
   */
  chunkedFile(id: string, filename: string, tenant: string, expiresAfterSeconds = 0, fence?: Fence): ChunkedFile {
    return new ChunkedFile(this, id, filename, tenant, expiresAfterSeconds, fence);
  }

  /** Records a file whose bytes are written (charged once: a rerun of a finalisation finds the record). */
  async recordFile(id: string, filename: string, purpose: string, bytes: number, tenant: string, expiresAfterSeconds = 0): Promise<void> {
    if ((await this.redis.exists(this.fileKey(id))) === 0) await this.redis.chargeFile(this.usage(tenant), 0, 0, bytes, '0');
    const created = now();
    const expires = expiresAfterSeconds > 0 ? String(created + expiresAfterSeconds) : '';
    const m = this.redis
      .multi()
      .hset(this.fileKey(id), 'filename', filename, 'purpose', purpose, 'bytes', String(bytes), 'created_at', String(created), 'tenant', tenant, 'expires_at', expires)
      .zadd(this.files(tenant), Date.now(), id);
    if (expires !== '') m.zadd(this.expiring, expires, id);
    await m.exec();
  }

  /** A file's record if it exists, has not expired and belongs to `tenant` (another tenant's is unknown: 404, never 403). */
  async fileMeta(id: string, tenant: string): Promise<BatchHash | null> {
    if (!FILE_ID.test(id)) return null;
    const h = await this.redis.hgetall(this.fileKey(id));
    return h.purpose === undefined || (h.tenant ?? '') !== tenant || expired(h) ? null : h;
  }

  /** The active batch (of any tenant: a file is only ever its owner's batches' input) that reads `fileId`, or null. */
  async activeBatchUsing(fileId: string): Promise<string | null> {
    const ids = await this.redis.smembers(this.active);
    for (let i = 0; i < ids.length; i += 500) {
      const pipe = this.redis.pipeline();
      const page = ids.slice(i, i + 500);
      for (const b of page) pipe.hget(this.batchKey(b), 'input_file_id');
      const rows = (await pipe.exec()) ?? [];
      for (let j = 0; j < page.length; j++) if (rows[j]?.[1] === fileId) return page[j];
    }
    return null;
  }

  /**
   * Deletes up to `limit` files past their expires_at (the usage they were charged given back). The input of
   * a batch still running is kept until the batch ends (it is already hidden from the API).
   */
  async expireFiles(limit = 100): Promise<number> {
    const ids = await this.redis.zrangebyscore(this.expiring, '-inf', String(now()), 'LIMIT', 0, limit);
    let n = 0;
    for (const id of ids) {
      const h = await this.redis.hgetall(this.fileKey(id));
      if (h.purpose === undefined || !expired(h)) {
        await this.redis.zrem(this.expiring, id); // deleted meanwhile (or re-recorded without an expiry)
        continue;
      }
      if (h.purpose === 'batch' && (await this.activeBatchUsing(id)) !== null) continue;
      const tenant = h.tenant ?? '';
      n += await this.redis.deleteFile(this.fileKey(id), this.fileData(id), this.files(tenant), this.usage(tenant), id);
      await this.redis.zrem(this.expiring, id);
    }
    return n;
  }

  /** A batch's record if it exists and belongs to `tenant`; 404 otherwise. */
  async batch(id: string, tenant: string): Promise<BatchHash> {
    const h = BATCH_ID.test(id) ? await this.redis.hgetall(this.batchKey(id)) : {};
    if (h.status === undefined || (h.tenant ?? '') !== tenant) throw new BatchApiError(404, `No batch found with id ${JSON.stringify(id)}`, 'batch_id', 'not_found');
    return h;
  }
}

/** Whether a file record is past its expires_at. */
export function expired(h: BatchHash): boolean {
  return h.expires_at !== undefined && h.expires_at !== '' && now() >= Number(h.expires_at);
}

export class ChunkedFile {
  readonly #s: BatchStore;
  readonly id: string;
  readonly #filename: string;
  readonly #tenant: string;
  readonly #expiresAfter: number;
  #lines: string[] = [];
  #pending = 0;
  #bytes = 0;
  #started = false;

  readonly #fence: Fence | undefined;

  constructor(s: BatchStore, id: string, filename: string, tenant: string, expiresAfterSeconds: number, fence?: Fence) {
    this.#fence = fence;
    this.#s = s;
    this.id = id;
    this.#filename = filename;
    this.#tenant = tenant;
    this.#expiresAfter = expiresAfterSeconds;
  }

  get empty(): boolean {
    return this.#bytes === 0 && this.#lines.length === 0;
  }

  /** Adds one or more lines ('\n'-joined, no trailing '\n'). */
  async add(line: string): Promise<void> {
    this.#lines.push(line);
    this.#pending += line.length + 1;
    if (this.#pending >= this.#s.cfg.fileChunkBytes) await this.#flush();
  }

  async #flush(): Promise<void> {
    if (this.#lines.length === 0) return;
    const chunk = Buffer.from(this.#lines.join('\n') + '\n');
    this.#lines = [];
    this.#pending = 0;
    const key = this.#s.fileData(this.id);
    // pieces never larger than fileChunkBytes (a piece need not end at a line: the file is its bytes in order)
    const step = this.#s.cfg.fileChunkBytes;
    for (let at = 0; at < chunk.length; at += step) {
      const piece = chunk.subarray(at, at + step);
      const fresh = !this.#started; // a rerun starts the data over
      this.#started = true;
      const f = this.#fence;
      if (f !== undefined) {
        if ((await this.#s.redis.fencedPush(f.lease, key, f.token, fresh ? '1' : '0', piece)) !== 1) throw new LeaseLost();
      } else if (fresh) failedReply(await this.#s.redis.multi().del(key).rpush(key, piece).exec());
      else await this.#s.redis.rpush(key, piece);
    }
    this.#bytes += chunk.length;
  }

  /** Writes what is left and the record; '' when the file has no line (nothing stored). */
  async close(): Promise<string> {
    if (this.empty) return '';
    await this.#flush();
    await this.#s.recordFile(this.id, this.#filename, 'batch_output', this.#bytes, this.#tenant, this.#expiresAfter);
    return this.id;
  }
}
