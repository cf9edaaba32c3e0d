// What the Files, Batches and tracker parts of the API share: the Redis
// client (with the scripts), the key layout, the answer and error types, and
// the file and batch records as Redis holds them.
import { createHash } from 'node:crypto';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { BatchConfig } from '../config/batch.js';
import { defineScripts, type ScriptRedis } from './lua.js';

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
  // expires_at and status_details are optional and not nullable in OpenAI's File: left out while unset
  return { id, object: 'file', bytes: Number(h.bytes), created_at: Number(h.created_at), filename: h.filename, purpose: h.purpose, status: 'processed' };
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
  /** The batches the tracker still works on. */
  get active(): string {
    return `${this.#p}:batches:active`;
  }

  // ---- records

  /**
   * Stores an uploaded file for `tenant`, charged to its usage and refused
   * (429) beyond batch.fileQuota. The bytes go to Redis in FILE_CHUNK pieces
   * (the client builds each command in one buffer: a 64 MiB file in one
   * command would be a 64 MiB copy on the loop), the record last.
   */
  async storeFile(id: string, filename: string, purpose: string, data: Buffer, tenant: string): Promise<Record<string, unknown>> {
    const q = this.cfg.fileQuota;
    if ((await this.redis.chargeFile(this.usage(tenant), q.files, q.bytes, data.length, '1')) === 0)
      throw new BatchApiError(429, `this tenant's files are at the limit of ${q.files} files or ${q.bytes} bytes (batch.fileQuota): delete some first`, 'file', 'file_quota_exceeded');
    const created = now();
    const key = this.fileData(id);
    try {
      await this.redis.set(key, data.subarray(0, FILE_CHUNK));
      for (let at = FILE_CHUNK; at < data.length; at += FILE_CHUNK) await this.redis.append(key, data.subarray(at, at + FILE_CHUNK));
      await this.redis
        .multi()
        .hset(this.fileKey(id), 'filename', filename, 'purpose', purpose, 'bytes', String(data.length), 'created_at', String(created), 'tenant', tenant)
        .zadd(this.files(tenant), Date.now(), id)
        .exec();
    } catch (err) {
      await this.redis.multi().del(key).hincrby(this.usage(tenant), 'files', -1).hincrby(this.usage(tenant), 'bytes', -data.length).exec().catch(() => undefined);
      throw err;
    }
    return fileObject(id, { filename, purpose, bytes: String(data.length), created_at: String(created) });
  }

  /**
   * A file written a chunk at a time (a batch's output and error files): the
   * lines are appended to its data key in pieces of about FILE_CHUNK bytes, its
   * record written last (a reader sees the whole file or none), so no single
   * string ever holds the whole file. Charged to `tenant`, never refused.
   */
  chunkedFile(id: string, filename: string, tenant: string): ChunkedFile {
    return new ChunkedFile(this, id, filename, tenant);
  }

  /** Records a file whose bytes are written (charged once: a rerun of a finalisation finds the record). */
  async recordFile(id: string, filename: string, purpose: string, bytes: number, tenant: string): Promise<void> {
    if ((await this.redis.exists(this.fileKey(id))) === 0) await this.redis.chargeFile(this.usage(tenant), 0, 0, bytes, '0');
    await this.redis
      .multi()
      .hset(this.fileKey(id), 'filename', filename, 'purpose', purpose, 'bytes', String(bytes), 'created_at', String(now()), 'tenant', tenant)
      .zadd(this.files(tenant), Date.now(), id)
      .exec();
  }

  /** A file's record if it exists and belongs to `tenant` (another tenant's is unknown: 404, never 403). */
  async fileMeta(id: string, tenant: string): Promise<BatchHash | null> {
    if (!FILE_ID.test(id)) return null;
    const h = await this.redis.hgetall(this.fileKey(id));
    return h.purpose === undefined || (h.tenant ?? '') !== tenant ? null : h;
  }

  /** A batch's record if it exists and belongs to `tenant`; 404 otherwise. */
  async batch(id: string, tenant: string): Promise<BatchHash> {
    const h = BATCH_ID.test(id) ? await this.redis.hgetall(this.batchKey(id)) : {};
    if (h.status === undefined || (h.tenant ?? '') !== tenant) throw new BatchApiError(404, `No batch found with id ${JSON.stringify(id)}`, 'batch_id', 'not_found');
    return h;
  }
}

/** About this many bytes of lines go to Redis in one APPEND. */
const FILE_CHUNK = 4 * 1024 * 1024;

export class ChunkedFile {
  readonly #s: BatchStore;
  readonly id: string;
  readonly #filename: string;
  readonly #tenant: string;
  #lines: string[] = [];
  #pending = 0;
  #bytes = 0;
  #started = false;

  constructor(s: BatchStore, id: string, filename: string, tenant: string) {
    this.#s = s;
    this.id = id;
    this.#filename = filename;
    this.#tenant = tenant;
  }

  get empty(): boolean {
    return this.#bytes === 0 && this.#lines.length === 0;
  }

  async add(line: string): Promise<void> {
    this.#lines.push(line);
    this.#pending += line.length + 1;
    if (this.#pending >= FILE_CHUNK) await this.#flush();
  }

  async #flush(): Promise<void> {
    if (this.#lines.length === 0) return;
    const chunk = Buffer.from(this.#lines.join('\n') + '\n');
    this.#lines = [];
    this.#pending = 0;
    const key = this.#s.fileData(this.id);
    if (!this.#started) {
      this.#started = true;
      await this.#s.redis.multi().del(key).append(key, chunk).exec(); // a rerun starts the data over
    } else await this.#s.redis.append(key, chunk);
    this.#bytes += chunk.length;
  }

  /** Writes what is left and the record; '' when the file has no line (nothing stored). */
  async close(): Promise<string> {
    if (this.empty) return '';
    await this.#flush();
    await this.#s.recordFile(this.id, this.#filename, 'batch_output', this.#bytes, this.#tenant);
    return this.id;
  }
}
