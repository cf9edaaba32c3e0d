// The shared Responses store: one Redis string per response, written with its
// TTL in one `SET key value PX ttl`, so any router replica continues a
// conversation another one started. A turn costs one GET and one SET: one
// round trip each, whatever the chain's length, because each record holds its
// conversation's rendered messages. The value is a small header (version,
// root, parent, created, the lengths of ids and conv) and the three texts
// back to back: one command and one reply each way, no per-field parsing (a
// hash with HSET + PEXPIRE in MULTI and HGETALL cost ~3x the router CPU per
// turn in bench/responses-state.ts's micro-measurement).
//
// Why ioredis (over node-redis): it fails fast when the server is away
// (`enableOfflineQueue: false`: a command errors at once instead of waiting
// in a queue, so the API answers 503 and chat completions never notice),
// bounds every command (`commandTimeout`), reconnects in the background with
// our backoff, and speaks Sentinel and Cluster with the same client class.
// Keys carry the tenant (keyOf). Size bounds are Redis's own (`maxmemory` with an LRU policy); a record
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

  async get(tenant: string, id: string): Promise<StoredResponse | null> {
    let v: string | null;
    try {
      v = await this.client.get(keyOf(tenant, id));
    } catch (err) {
      throw this.#fail(err);
    }
    return v === null ? null : decode(tenant, id, v);
  }

  async put(r: StoredResponse): Promise<boolean> {
    try {
      await this.client.set(keyOf(r.tenant, r.id), encode(r), 'PX', this.#ttlMs);
      return true;
    } catch (err) {
      throw this.#fail(err);
    }
  }

  async delete(tenant: string, id: string): Promise<boolean> {
    try {
      return (await this.client.del(keyOf(tenant, id))) > 0;
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

const VERSION = 'r1';

/**
 * The key of a record: `<tenant length>:<tenant>:<id>` (after the store's
 * keyPrefix). Length-prefixed, so no id a client sends can name a key of
 * another tenant; the tenant is part of the key, not a field to check.
 */
export function keyOf(tenant: string, id: string): string {
  return `${tenant.length}:${tenant}:${id}`;
}

/** `r1\n<root>\n<parent>\n<createdAt>\n<ids length>\n<conv length>\n` + ids + conv + response. */
export function encode(r: StoredResponse): string {
  return `${VERSION}\n${r.root}\n${r.parent}\n${r.createdAt}\n${r.ids.length}\n${r.conv.length}\n${r.ids}${r.conv}${r.response}`;
}

/** The record of `encode`, or null for a value this version cannot read (treated as absent). */
export function decode(tenant: string, id: string, v: string): StoredResponse | null {
  const nl: number[] = [];
  for (let at = -1, i = 0; i < 6; i++) {
    at = v.indexOf('\n', at + 1);
    if (at < 0) return null;
    nl.push(at);
  }
  if (v.slice(0, nl[0]) !== VERSION) return null;
  const idsLen = Number(v.slice(nl[3]! + 1, nl[4]));
  const convLen = Number(v.slice(nl[4]! + 1, nl[5]));
  const body = nl[5]! + 1;
  if (!Number.isInteger(idsLen) || !Number.isInteger(convLen) || body + idsLen + convLen > v.length) return null;
  return {
    tenant,
    id,
    root: v.slice(nl[0]! + 1, nl[1]),
    parent: v.slice(nl[1]! + 1, nl[2]),
    createdAt: Number(v.slice(nl[2]! + 1, nl[3])),
    ids: v.slice(body, body + idsLen),
    conv: v.slice(body + idsLen, body + idsLen + convLen),
    response: v.slice(body + idsLen + convLen),
  };
}
