// The Files half of the API: POST /v1/files (multipart, JSONL checked),
// GET /v1/files[/{id}[/content]], DELETE /v1/files/{id}.
import { randomBytes } from 'node:crypto';
import { checkJsonlOffLoop } from './jsonl-check.js';
import { parseMultipart } from './multipart.js';
import { BatchApiError, expired, expiresAfter, FILE_ID, fileObject, json, noSuchFile, type ApiAnswer, type BatchHash, type BatchStore } from './store.js';

export class Files {
  readonly #s: BatchStore;

  constructor(s: BatchStore) {
    this.#s = s;
  }

  /** POST /v1/files: a multipart body with `purpose` = batch and a JSONL `file`. */
  async uploadFile(contentType: string, body: Buffer, tenant: string, owned = false): Promise<ApiAnswer> {
    const parts = parseMultipart(contentType, body);
    if (typeof parts === 'string') throw new BatchApiError(400, parts, null, 'invalid_request_body');
    const purpose = parts.get('purpose');
    if (purpose === undefined) throw new BatchApiError(400, "missing required parameter 'purpose'", 'purpose', 'missing_required_parameter');
    const p = purpose.data.toString('utf8');
    if (p !== 'batch') throw new BatchApiError(400, `purpose must be "batch": this router stores batch input files only (got ${JSON.stringify(p.slice(0, 64))})`, 'purpose', 'invalid_value');
    const file = parts.get('file');
    if (file === undefined || file.filename === null) throw new BatchApiError(400, "missing required parameter 'file' (a part with a filename)", 'file', 'missing_required_parameter');
    // expires_after {anchor, seconds}, as the SDKs send it in a form: expires_after[anchor], expires_after[seconds]
    const field = (k: string) => parts.get(`expires_after[${k}]`)?.data.toString('utf8');
    const asked = expiresAfter(field('anchor'), field('seconds'), 'expires_after', this.#s.cfg.minExpiresAfterSeconds);
    // none asked for: the configured default (OpenAI's files of purpose batch expire after 30 days), so uploads never pile up for good
    const expires = asked > 0 ? asked : this.#s.cfg.fileExpiresAfterSeconds;
    // a large file is checked in a worker thread (the body's memory is this call's alone: batch-http built it)
    const { problem, data } = await checkJsonlOffLoop(file.data, owned);
    if (problem !== null) throw new BatchApiError(400, `file is not valid JSONL for a batch: ${problem}`, 'file', 'invalid_file_format');
    const meta = await this.#s.storeFile(`file-${randomBytes(16).toString('hex')}`, file.filename, 'batch', data, tenant, expires);
    return { status: 200, body: json(meta) };
  }

  async retrieveFile(id: string, tenant: string): Promise<ApiAnswer> {
    const h = await this.#s.fileMeta(id, tenant);
    if (h === null) throw noSuchFile(id);
    return { status: 200, body: json(fileObject(id, h)) };
  }

  async fileContent(id: string, tenant: string): Promise<ApiAnswer> {
    if (!FILE_ID.test(id)) throw noSuchFile(id);
    // the record first: another tenant's file (or none) costs no read of its bytes
    const h = await this.#s.fileMeta(id, tenant);
    if (h === null) throw noSuchFile(id);
    // sent a piece at a time as the client takes it (an output can be far larger than anything held at once)
    const stream = await this.#s.streamChunked(this.#s.fileData(id), Number(h.bytes));
    if (stream === null) throw noSuchFile(id);
    return { status: 200, body: '', contentType: 'application/octet-stream', stream };
  }

  /**
   * GET /v1/files?purpose=&limit=&order=&after=: OpenAI's list shape, newest
   * first by default; `limit` in [1, 10000] (default 10000, as OpenAI's).
   * A purpose filter walks the index a page at a time, so its cost is bounded
   * by what it skips, not by the whole store.
   */
  async listFiles(query: string, tenant: string): Promise<ApiAnswer> {
    const index = this.#s.files(tenant);
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
      const rank = FILE_ID.test(after) ? await (asc ? this.#s.redis.zrank(index, after) : this.#s.redis.zrevrank(index, after)) : null;
      if (rank === null) throw new BatchApiError(400, `after ${JSON.stringify(after.slice(0, 80))}: no such file`, 'after', 'invalid_value');
      start = rank + 1;
    }
    const data: Record<string, unknown>[] = [];
    let hasMore = false;
    const page = Math.min(limit + 1, 1000);
    for (;;) {
      const ids = await (asc ? this.#s.redis.zrange(index, start, start + page - 1) : this.#s.redis.zrevrange(index, start, start + page - 1));
      if (ids.length === 0) break;
      const pipe = this.#s.redis.pipeline();
      for (const id of ids) pipe.hgetall(this.#s.fileKey(id));
      const rows = (await pipe.exec()) ?? [];
      for (let i = 0; i < ids.length; i++) {
        const h = rows[i]?.[1] as BatchHash | undefined;
        if (h?.purpose === undefined || (purpose !== null && h.purpose !== purpose) || expired(h)) continue;
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

  async deleteFile(id: string, tenant: string): Promise<ApiAnswer> {
    const h = await this.#s.fileMeta(id, tenant);
    if (h === null) throw noSuchFile(id);
    if (h.purpose === 'batch') {
      const by = await this.#s.activeBatchUsing(id);
      if (by !== null) throw new BatchApiError(409, `file ${id} is the input of batch ${by}, which is not finished: cancel it or wait for it to end, then delete the file`, 'file_id', 'file_in_use');
    }
    // the record is checked to be this tenant's first, and the tenant never changes: the delete cannot reach another's file
    if ((await this.#s.redis.deleteFile(this.#s.fileKey(id), this.#s.fileData(id), this.#s.files(tenant), this.#s.usage(tenant), id)) === 0) throw noSuchFile(id);
    return { status: 200, body: json({ id, object: 'file', deleted: true }) };
  }
}
