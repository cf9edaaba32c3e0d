// The async processor: consumes requests from a Redis Stream (consumer group)
// and runs them through the director in the lowest flow-control band, only
// while the pool's utilisation is below a ceiling, so batch work fills the
// capacity interactive traffic leaves free (docs/batch.md).
//
// Delivery: at least once from Redis, exactly once in effect. An entry is
// acknowledged (XACK) only after its result is stored; the store and the
// request's done marker are written by one Lua script that does nothing when
// the marker exists, so an entry delivered again (a consumer crashed between
// store and ack, or the same request id enqueued twice) never writes a second
// result. Entries a crashed consumer left pending are claimed by the others
// with XAUTOCLAIM after `reclaimIdleMs`. A malformed entry goes to the
// dead-letter stream with the reason and is acknowledged; the consumer goes
// on. When Redis goes away, results already computed are kept and written
// (then acknowledged) once it is back; reading resumes (the group is created
// again if Redis came back empty).
//
// Entry fields: id (the request id, [A-Za-z0-9._:-]{1,256}), body (the
// OpenAI request JSON, with model), result ("stream:<name>" → XADD <name> *
// id status body; "key:<name>" → HSET <name> id status body), optional path
// (/v1/chat/completions or /v1/completions; default by the body), optional
// tenant (quotas).
//
// Quotas (batch.quotas) are the tenant's batch subject on the rate-limit
// counters (src/batch/quota.ts): charged before dispatch, corrected by the
// answer's usage; a line over its quota stays pending and is claimed again
// after reclaimIdleMs.
import { hostname } from 'node:os';
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { BatchConfig } from '../config/batch.js';
import type { Rejected } from '../admission.js';
import type { Endpoint, EndpointSet } from '../endpoints/endpoint.js';
import { KIND_CHAT, KIND_COMPLETION, KIND_EMBEDDINGS, type ClientPort, type Director } from '../director/director.js';
import { KIND_RESPONSES } from '../director/kinds.js';
import { errorBody } from '../proxy/error-shape.js';
import { ANONYMOUS, type Caller } from '../identity.js';
import { RateLimiter } from '../limits/limiter.js';
import { BatchQuotas, usageOf } from './quota.js';

const ID_RE = /^[A-Za-z0-9._:-]{1,256}$/;

/** Stores a result once: KEYS[1] done marker, KEYS[2] target; ARGV kind, id, status, body, ttl. Returns 1 when stored, 0 when it was already. */
const STORE_ONCE = `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if ARGV[1] == 'stream' then
  redis.call('XADD', KEYS[2], '*', 'id', ARGV[2], 'status', ARGV[3], 'body', ARGV[4])
else
  redis.call('HSET', KEYS[2], 'id', ARGV[2], 'status', ARGV[3], 'body', ARGV[4])
end
redis.call('SET', KEYS[1], '1', 'EX', tonumber(ARGV[5]))
return 1`;

export interface BatchEntry {
  /** Stream entry id. */
  entryId: string;
  requestId: string;
  kind: number;
  body: Buffer;
  model: string;
  target: 'stream' | 'key';
  targetName: string;
  tenant: string;
  tokens: number;
  /** The Batches API batch this request belongs to ('' for a plain stream entry): its cancel marker is checked before dispatch. */
  batch: string;
}

/** The key whose presence cancels a Batches API batch: its entries not yet dispatched are answered with status 0 (skipped). */
export function cancelKey(keyPrefix: string, batchId: string): string {
  return `${keyPrefix}:batch:${batchId}:cancel`;
}

export interface BatchStats {
  completed: number;
  duplicates: number;
  deadLettered: number;
  deferredByQuota: number;
  /** Lines refused by their tenant's rate limits when dispatched (rateLimits): left pending, claimed again later. */
  deferredByRateLimit: number;
  reclaimed: number;
  /** Times dispatch paused because the pool was above the ceiling. */
  paused: number;
  inFlight: number;
}

/** Parses a stream entry's fields; a string is the reason it is malformed. */
export function parseEntry(entryId: string, fields: readonly string[]): BatchEntry | string {
  const f = new Map<string, string>();
  for (let i = 0; i + 1 < fields.length; i += 2) f.set(fields[i], fields[i + 1]);
  const id = f.get('id');
  if (id === undefined || !ID_RE.test(id)) return `field "id" must match ${ID_RE.source} (got ${JSON.stringify(id?.slice(0, 64) ?? null)})`;
  const result = f.get('result') ?? '';
  const m = /^(stream|key):(.+)$/.exec(result);
  if (m === null) return `field "result" must be "stream:<name>" or "key:<name>" (got ${JSON.stringify(result.slice(0, 64))})`;
  const raw = f.get('body');
  if (raw === undefined) return 'field "body" is missing';
  let body: unknown;
  try {
    body = JSON.parse(raw);
  } catch (err) {
    return `field "body" is not JSON: ${(err as Error).message}`;
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return 'field "body" must be a JSON object';
  const b = body as Record<string, unknown>;
  if (typeof b.model !== 'string' || b.model === '') return 'body.model must be a non-empty string';
  const path = f.get('path') ?? (Array.isArray(b.messages) ? '/v1/chat/completions' : '/v1/completions');
  const kind = PATH_KINDS[path];
  if (kind === undefined) return `field "path" must be one of ${Object.keys(PATH_KINDS).join(', ')} (got ${JSON.stringify(path.slice(0, 64))})`;
  const maxTokens =
    typeof b.max_tokens === 'number'
      ? b.max_tokens
      : typeof b.max_completion_tokens === 'number'
        ? b.max_completion_tokens
        : typeof b.max_output_tokens === 'number'
          ? b.max_output_tokens
          : kind === KIND_EMBEDDINGS
            ? 0
            : 16;
  return {
    entryId,
    requestId: id,
    kind,
    body: Buffer.from(raw),
    model: b.model,
    target: m[1] as 'stream' | 'key',
    targetName: m[2],
    tenant: f.get('tenant') ?? '',
    tokens: Math.ceil(raw.length / 4) + maxTokens,
    batch: f.get('batch') ?? '',
  };
}

/** The paths a batch request may name, and the kind each is served as (/v1/responses: by the Responses API). */
const PATH_KINDS: Record<string, number> = {
  '/v1/chat/completions': KIND_CHAT,
  '/v1/completions': KIND_COMPLETION,
  '/v1/embeddings': KIND_EMBEDDINGS,
  '/v1/responses': KIND_RESPONSES,
};

/** What the processor needs of the Responses API: a turn from a complete body, answered through a ClientPort. */
export interface BatchResponses {
  begin(port: ClientPort, caller: Caller, requestId: string, headers: Readonly<Record<string, string>>, raw: Buffer): unknown;
}

/** Collects one batch request's answer (a ClientPort for the director). */
class CollectPort implements ClientPort {
  status = 0;
  readonly chunks: Buffer[] = [];
  failed = false;
  /** Refused by a rate limit (rateLimits: the line's tenant's counters) or their store: the line is not answered, it waits. */
  rateLimited = false;
  constructor(readonly resolve: (p: CollectPort) => void) {}
  head(status: number): void {
    this.status = status;
  }
  write(chunk: Buffer | string): void {
    this.chunks.push(Buffer.from(chunk)); // a copy: the upstream client reuses its memory
  }
  end(chunk: Buffer | string): void {
    if (chunk.length > 0) this.chunks.push(Buffer.from(chunk));
  }
  fail(sseEvent: string | null): void {
    if (sseEvent !== null) this.chunks.push(Buffer.from(sseEvent));
    this.failed = true;
  }
  done(status: number): void {
    if (this.status === 0) this.status = status;
    this.resolve(this);
  }
  /** An error answer instead of the engine's (ClientPort.error). */
  error(status: number, message: string, param: string | null, _ep: Endpoint | undefined, r: Rejected | null, code?: string): void {
    this.status = status;
    if (r !== null && (r.reason.startsWith('rate-limited') || r.reason === 'rate-limit-store-down')) this.rateLimited = true;
    this.chunks.length = 0;
    this.chunks.push(Buffer.from(errorBody(status, message, param, code)));
  }
}

export interface BatchProcessorOptions {
  config: BatchConfig;
  director: Director;
  endpoints: EndpointSet;
  log: Logger;
  /** The band name batch requests ask for (x-priority); default config.band. */
  band?: string;
  /** The Responses API, for /v1/responses requests (absent: they answer 404). */
  responses?: BatchResponses | null;
  /**
   * The tenants' quotas on their counters (src/batch/quota.ts; assemble.ts
   * builds them on shared counters); null: none. Absent: `config.quotas` on
   * counters in this process, when some tenant has a quota.
   */
  quotas?: BatchQuotas | null;
}

export class BatchProcessor {
  readonly config: BatchConfig;
  readonly consumer: string;
  readonly stats: BatchStats = { completed: 0, duplicates: 0, deadLettered: 0, deferredByQuota: 0, deferredByRateLimit: 0, reclaimed: 0, paused: 0, inFlight: 0 };
  readonly #director: Director;
  readonly #endpoints: EndpointSet;
  readonly #log: Logger;
  readonly #band: string;
  readonly #responses: BatchResponses | null;
  /** The tenants' quotas (null: no tenant has one). */
  readonly quotas: BatchQuotas | null;
  /** Commands (results, acks, markers). */
  readonly #redis: Redis;
  /** Blocking reads. */
  readonly #reader: Redis;
  /** Entries fetched and not yet dispatched. */
  readonly #local: BatchEntry[] = [];
  /** Stream entry ids being processed here (a reclaim of one of them is skipped). */
  readonly #busy = new Set<string>();
  /** Results computed and not yet stored (Redis away): written again until they are. */
  readonly #unstored = new Map<string, { e: BatchEntry; status: number; body: string }>();
  #claimCursor = '0-0';
  #closed = false;
  #loop: Promise<void> | null = null;
  #wake: (() => void) | null = null;
  #seq = 0;
  /** Requests in #handle before their dispatch: counted against the ceiling (the loop dispatches the next one meanwhile). */
  #starting = 0;

  constructor(o: BatchProcessorOptions) {
    this.config = o.config;
    this.consumer = o.config.consumer || `${hostname()}-${process.pid}`;
    this.#director = o.director;
    this.#endpoints = o.endpoints;
    this.#log = o.log;
    this.#band = o.band ?? o.config.band ?? '';
    this.#responses = o.responses ?? null;
    this.quotas = o.quotas !== undefined ? o.quotas : BatchQuotas.configured(o.config.quotas) ? new BatchQuotas(o.config.quotas, new RateLimiter({ tenants: {} })) : null;
    const opts = { lazyConnect: true, maxRetriesPerRequest: 1, enableOfflineQueue: true, retryStrategy: (n: number) => Math.min(50 * n, 1000) };
    this.#redis = new Redis(o.config.redis, opts);
    this.#reader = new Redis(o.config.redis, opts);
    for (const r of [this.#redis, this.#reader]) r.on('error', (err: Error) => this.#log.debug({ err }, 'batch: redis error'));
    this.#redis.defineCommand('storeOnce', { numberOfKeys: 2, lua: STORE_ONCE });
  }

  /** The pool's utilisation now: the router's in-flight requests (plus other clients' from fresh metrics) over the endpoints' batch limits. */
  utilisation(): number {
    const now = performance.now();
    let occ = 0;
    let cap = 0;
    for (const ep of this.#endpoints.all) {
      if (!ep.routable(now)) continue;
      occ += ep.occupancy(now);
      cap += ep.batchLimit;
    }
    // plus the batch requests taken and not yet handed to the director (their Redis checks): not in any endpoint's count yet
    return cap === 0 ? Infinity : (occ + this.#starting) / cap;
  }

  async start(): Promise<void> {
    await Promise.all([this.#redis.connect(), this.#reader.connect()]);
    await this.#ensureGroup();
    this.#loop = this.#run();
  }

  async #ensureGroup(): Promise<void> {
    try {
      await this.#redis.xgroup('CREATE', this.config.stream, this.config.group, '0', 'MKSTREAM');
    } catch (err) {
      if (!String((err as Error).message).includes('BUSYGROUP')) throw err;
    }
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((r) => {
      const t = setTimeout(() => {
        this.#wake = null;
        r();
      }, ms);
      this.#wake = () => {
        clearTimeout(t);
        this.#wake = null;
        r();
      };
    });
  }

  async #run(): Promise<void> {
    const c = this.config;
    let backoff = 50;
    while (!this.#closed) {
      try {
        if (this.#unstored.size > 0) await this.#flushUnstored();
        if (this.stats.inFlight >= c.maxInFlight) {
          await this.#sleep(c.checkIntervalMs);
          continue;
        }
        if (this.utilisation() >= c.utilisationCeiling) {
          this.stats.paused++;
          await this.#sleep(c.checkIntervalMs);
          continue;
        }
        if (this.#local.length === 0) await this.#fetch(c.maxInFlight - this.stats.inFlight);
        // one at a time, the ceiling checked before each: interactive load that rises stops dispatch at once
        const e = this.#local.shift();
        if (e !== undefined) void this.#handle(e);
        backoff = 50;
      } catch (err) {
        if (this.#closed) break;
        const msg = String((err as Error).message);
        if (msg.includes('NOGROUP')) {
          // Redis came back empty: the group (and stream) again
          await this.#ensureGroup().catch(() => {});
        } else this.#log.warn({ err: msg }, 'batch: redis unavailable, retrying');
        await this.#sleep(backoff);
        backoff = Math.min(backoff * 2, 2000);
      }
    }
  }

  async #fetch(room: number): Promise<void> {
    const c = this.config;
    // entries other consumers (or an earlier run of this one) left pending for reclaimIdleMs
    const claimed = (await this.#redis.xautoclaim(c.stream, c.group, this.consumer, c.reclaimIdleMs, this.#claimCursor, 'COUNT', room)) as [string, [string, string[]][], string[]?];
    this.#claimCursor = claimed[0];
    let entries = claimed[1].filter((x) => x !== null && x[1] !== null && !this.#busy.has(x[0]));
    this.stats.reclaimed += entries.length;
    if (entries.length === 0) {
      const r = (await this.#reader.xreadgroup('GROUP', c.group, this.consumer, 'COUNT', room, 'BLOCK', Math.max(10, c.checkIntervalMs), 'STREAMS', c.stream, '>')) as [string, [string, string[]][]][] | null;
      entries = r?.[0]?.[1] ?? [];
    }
    for (const [entryId, fields] of entries) {
      const e = parseEntry(entryId, fields);
      if (typeof e === 'string') await this.#deadLetter(entryId, fields, e);
      else {
        this.#busy.add(entryId);
        this.#local.push(e);
      }
    }
  }

  async #deadLetter(entryId: string, fields: readonly string[], reason: string): Promise<void> {
    const c = this.config;
    await this.#redis.xadd(c.deadLetterStream, '*', 'reason', reason, 'entry', entryId, 'stream', c.stream, ...fields.slice(0, 64));
    await this.#redis.xack(c.stream, c.group, entryId);
    this.stats.deadLettered++;
  }

  #doneKey(e: BatchEntry): string {
    return `${this.config.keyPrefix}:done:${e.requestId}`;
  }

  async #handle(e: BatchEntry): Promise<void> {
    this.stats.inFlight++;
    let starting = true;
    this.#starting++;
    try {
      // one round trip: the done marker and (for a Batches API line) its batch's cancel marker
      const p = this.#redis.pipeline().exists(this.#doneKey(e));
      if (e.batch !== '') p.exists(cancelKey(this.config.keyPrefix, e.batch));
      const r = (await p.exec()) ?? [];
      for (const [err] of r) if (err) throw err;
      if (r[0]?.[1] === 1) {
        // stored before (a crash between store and ack, or a repeated id): only the ack is missing
        this.stats.duplicates++;
        await this.#redis.xack(this.config.stream, this.config.group, e.entryId);
        return;
      }
      if (r[1]?.[1] === 1) {
        // its batch was cancelled (POST /v1/batches/{id}/cancel): answered with status 0, not dispatched
        this.#unstored.set(e.entryId, { e, status: 0, body: '' });
        await this.#store(e.entryId);
        return;
      }
      // the tenant's batch quota: checked and charged at once (a refused line is charged nothing)
      const charge = this.quotas === null ? null : await this.quotas.take(e.tenant, e.tokens);
      if (charge === false) {
        this.stats.deferredByQuota++;
        return; // stays pending; claimed again after reclaimIdleMs
      }
      starting = false;
      this.#starting--;
      const port = await this.#dispatch(e);
      if (port.rateLimited) {
        // its tenant's rate limits (the counters interactive requests use) are spent: it stays pending
        this.stats.deferredByRateLimit++;
        if (charge !== null) this.quotas!.giveBack(charge); // its quota charge too: it runs later
        return;
      }
      const body = Buffer.concat(port.chunks).toString('utf8');
      // the estimate charged at dispatch becomes the engine's usage
      if (charge !== null && charge.plan.tokens) this.quotas!.settle(charge, usageOf(port.status, body));
      this.#unstored.set(e.entryId, { e, status: port.status, body });
      await this.#store(e.entryId);
    } catch (err) {
      this.#log.warn({ err: (err as Error).message, id: e.requestId }, 'batch: request not completed; it stays pending');
    } finally {
      if (starting) this.#starting--;
      this.stats.inFlight--;
      if (!this.#unstored.has(e.entryId)) this.#busy.delete(e.entryId);
      this.#wake?.();
    }
  }

  #dispatch(e: BatchEntry): Promise<CollectPort> {
    return new Promise((resolve) => {
      const port = new CollectPort(resolve);
      const headers: Record<string, string> = {};
      for (const n of this.#director.gate.headerNames) headers[n] = '';
      if (this.#band !== '') headers['x-priority'] = this.#band;
      if (e.tenant !== '') headers['x-tenant-id'] = e.tenant;
      const id = `batch-${e.requestId}-${++this.#seq}`;
      // the line's creator: its tenant's flow (and the tenant rate limits count)
      const caller: Caller = e.tenant === '' ? ANONYMOUS : { ...ANONYMOUS, tenant: e.tenant, flow: `tenant:${e.tenant}` };
      if (e.kind === KIND_RESPONSES) {
        const r = this.#responses;
        if (r === null) {
          port.error(404, 'the Responses API is not enabled on this router (responses.enabled)', null, undefined, null);
          port.done(404);
        } else r.begin(port, caller, id, headers, e.body);
        return;
      }
      this.#director.begin(port, e.kind, id, caller, headers, e.body);
    });
  }

  /** Stores a computed result once and acknowledges its entry. */
  async #store(entryId: string): Promise<void> {
    const u = this.#unstored.get(entryId);
    if (u === undefined) return;
    const c = this.config;
    const r = this.#redis as Redis & { storeOnce(k1: string, k2: string, kind: string, id: string, status: string, body: string, ttl: string): Promise<number> };
    const stored = await r.storeOnce(this.#doneKey(u.e), u.e.targetName, u.e.target, u.e.requestId, String(u.status), u.body, String(c.doneTtlSeconds));
    if (stored === 0) this.stats.duplicates++;
    await this.#redis.xack(c.stream, c.group, entryId);
    this.#unstored.delete(entryId);
    this.#busy.delete(entryId);
    if (stored === 1 && u.status !== 0) this.stats.completed++;
  }

  async #flushUnstored(): Promise<void> {
    for (const id of [...this.#unstored.keys()]) await this.#store(id);
  }

  /** Stops fetching; waits (up to graceMs) for requests in flight and their results to be stored; closes the connections. */
  async close(graceMs = 5000): Promise<void> {
    this.#closed = true;
    this.#wake?.();
    const until = Date.now() + graceMs;
    while ((this.stats.inFlight > 0 || this.#unstored.size > 0) && Date.now() < until) {
      await this.#flushUnstored().catch(() => {});
      await new Promise((r) => setTimeout(r, 20));
    }
    this.#reader.disconnect();
    await this.#loop?.catch(() => {});
    this.#redis.disconnect();
  }
}
