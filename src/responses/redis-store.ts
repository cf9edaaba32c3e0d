// The shared Responses store: one Redis hash per response (fields root,
// parent, created, conv, ids, response) with a TTL, so any router replica
// continues a conversation another one started. A turn costs one HGETALL and
// one MULTI(HSET, PEXPIRE): one round trip each, whatever the chain's length,
// because each record holds its conversation's rendered messages.
//
// Why ioredis (over node-redis): it fails fast when the server is away
// (`enableOfflineQueue: false`: a command errors at once instead of waiting
// in a queue, so the API answers 503 and chat completions never notice),
// bounds every command (`commandTimeout`), reconnects in the background with
// our backoff, and speaks Sentinel and Cluster with the same client class.
// Size bounds are Redis's own (`maxmemory` with an LRU policy); a record
// Redis evicted is a clean 404 for its continuation like any other.
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { ResponsesConfig } from '../config/responses.js';
import { StoreUnavailableError, type ResponseStore, type StoredResponse } from './store.js';

export class RedisStore implements ResponseStore {
  readonly type = 'redis' as const;
  /** The connection (another shared-state user, e.g. session pins, may issue its own commands on it). */
  readonly client: Redis;
  readonly #ttlMs: number;
  readonly #where: string;
  #down = false;

  constructor(cfg: Pick<ResponsesConfig, 'ttlSeconds' | 'store'>, log?: Logger) {
    this.#ttlMs = cfg.ttlSeconds * 1000;
    const url = cfg.store.url!;
    let where = url;
    try {
      const u = new URL(url);
      where = `${u.protocol}//${u.host}`; // never log credentials
    } catch {
      /* the schema checked the scheme */
    }
    this.#where = where;
    this.client = new Redis(url, {
      keyPrefix: cfg.store.keyPrefix,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 1,
      commandTimeout: cfg.store.commandTimeoutMs,
      connectTimeout: 2000,
      retryStrategy: (times) => Math.min(50 * times, 1000),
    });
    this.client.on('error', (err: Error) => {
      if (this.#down) return;
      this.#down = true;
      log?.warn({ err: err.message, store: where }, 'Responses store (redis) unreachable: /v1/responses answers 503 until it is back');
    });
    this.client.on('ready', () => {
      if (this.#down) log?.info({ store: where }, 'Responses store (redis) reachable again');
      this.#down = false;
    });
  }

  get available(): boolean {
    return this.client.status === 'ready';
  }

  /** Resolves when connected (or rejects after `ms`). */
  async waitReady(ms: number): Promise<void> {
    if (this.available) return;
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => {
        this.client.off('ready', ok);
        reject(new Error(`redis at ${this.#where} not ready within ${ms} ms`));
      }, ms);
      const ok = () => {
        clearTimeout(t);
        resolve();
      };
      this.client.once('ready', ok);
    });
  }

  #fail(err: unknown): StoreUnavailableError {
    return new StoreUnavailableError(`the Redis response store at ${this.#where} is unavailable: ${(err as Error).message}`);
  }

  size(): number {
    return -1;
  }

  async get(id: string): Promise<StoredResponse | null> {
    let h: Record<string, string>;
    try {
      h = await this.client.hgetall(id);
    } catch (err) {
      throw this.#fail(err);
    }
    if (h.response === undefined) return null;
    return { id, root: h.root ?? id, parent: h.parent ?? '', createdAt: Number(h.created), conv: h.conv ?? '', ids: h.ids ?? '', response: h.response };
  }

  async put(r: StoredResponse): Promise<void> {
    let res: [Error | null, unknown][] | null;
    try {
      res = await this.client
        .multi()
        .hset(r.id, 'root', r.root, 'parent', r.parent, 'created', String(r.createdAt), 'conv', r.conv, 'ids', r.ids, 'response', r.response)
        .pexpire(r.id, this.#ttlMs)
        .exec();
    } catch (err) {
      throw this.#fail(err);
    }
    const failed = res?.find((x) => x[0] !== null);
    if (res === null || failed !== undefined) throw this.#fail(failed?.[0] ?? new Error('transaction aborted'));
  }

  async delete(id: string): Promise<boolean> {
    try {
      return (await this.client.del(id)) > 0;
    } catch (err) {
      throw this.#fail(err);
    }
  }

  async close(): Promise<void> {
    this.client.removeAllListeners('error');
    this.client.on('error', () => {});
    this.client.disconnect();
  }
}
