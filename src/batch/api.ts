// The OpenAI-style Files and Batches API over the async processor's Redis
// stream (docs/batch.md): the facade the HTTP layer (src/server/batch-http.ts)
// calls. Files and batch state live in the same Redis as the stream, so a
// batch outlives the router that accepted it: every router with a `batch:`
// block runs the tracker (tracker.ts) over the active batches.
//
// A batch's life (TRANSITIONS in tracker.ts): validating (every JSONL line
// checked; any bad line fails the batch with `errors`, as OpenAI's does) →
// in_progress (its lines enqueued to the request stream in chunks, each chunk
// and the `enqueued` count in one script, so a resumed enqueue neither skips
// nor repeats a line; the request id `<batch>.<line>` is the processor's
// idempotency key in any case) → finalizing (the output and error files
// written from the batch's result stream, ordered by line) → completed.
// Cancel: cancelling (the cancel key makes the processor answer
// not-yet-dispatched lines with status 0; running ones finish) → cancelled,
// with the files of what ran.
//
// Counting: the results arrive in `<prefix>:batch:<id>:out` (one entry per
// line: the processor's store-once script); a Lua script (lua.ts) moves the
// batch's cursor over new entries and adds them to its counts in one step, so
// two routers tracking the same batch never count an entry twice.
import type { Logger } from 'pino';
import type { BatchConfig } from '../config/batch.js';
import { Batches } from './batches.js';
import { Files } from './files.js';
import { BatchStore, type ApiAnswer } from './store.js';
import { Tracker } from './tracker.js';

export { BatchApiError, type ApiAnswer, type FileStream } from './store.js';
export { BATCH_ENDPOINTS } from './batches.js';
export { checkJsonl } from './jsonl.js';

export interface BatchApiOptions {
  config: BatchConfig;
  log: Logger;
  /** How often active batches are looked at, ms (default 200). */
  pollMs?: number;
}

export class BatchApi {
  readonly #s: BatchStore;
  readonly #files: Files;
  readonly #batches: Batches;
  readonly #tracker: Tracker;

  constructor(o: BatchApiOptions) {
    this.#s = new BatchStore(o.config, o.log);
    this.#tracker = new Tracker(this.#s, o.pollMs ?? 200);
    this.#files = new Files(this.#s);
    this.#batches = new Batches(this.#s, (id) => this.#tracker.kick(id));
  }

  get maxFileBytes(): number {
    return this.#s.cfg.maxFileBytes;
  }

  async start(): Promise<void> {
    await this.#s.redis.connect();
    this.#tracker.start();
  }

  async close(): Promise<void> {
    await this.#tracker.close();
    this.#s.redis.disconnect();
  }

  // every call names the caller's tenant ('' = the anonymous scope): another tenant's objects are unknown (404)

  /** `owned`: the caller gives up `body`'s memory (it may be moved to a worker thread and back). */
  uploadFile(contentType: string, body: Buffer, tenant: string, owned = false): Promise<ApiAnswer> {
    return this.#files.uploadFile(contentType, body, tenant, owned);
  }
  retrieveFile(id: string, tenant: string): Promise<ApiAnswer> {
    return this.#files.retrieveFile(id, tenant);
  }
  fileContent(id: string, tenant: string): Promise<ApiAnswer> {
    return this.#files.fileContent(id, tenant);
  }
  listFiles(query: string, tenant: string): Promise<ApiAnswer> {
    return this.#files.listFiles(query, tenant);
  }
  deleteFile(id: string, tenant: string): Promise<ApiAnswer> {
    return this.#files.deleteFile(id, tenant);
  }
  createBatch(raw: Buffer, tenant: string): Promise<ApiAnswer> {
    return this.#batches.createBatch(raw, tenant);
  }
  retrieveBatch(id: string, tenant: string): Promise<ApiAnswer> {
    return this.#batches.retrieveBatch(id, tenant);
  }
  listBatches(query: string, tenant: string): Promise<ApiAnswer> {
    return this.#batches.listBatches(query, tenant);
  }
  cancelBatch(id: string, tenant: string): Promise<ApiAnswer> {
    return this.#batches.cancelBatch(id, tenant);
  }
}
