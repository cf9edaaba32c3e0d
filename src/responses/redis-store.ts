// The shared Responses store: one Redis hash per response, so any router
// replica continues a conversation another one started. A continuation's
// hash holds what its turn added and the id of its parent's (`u`): a branch
// costs what it adds, not a copy of its history. Each operation is ONE round
// trip, a Lua script run inside Redis: a get reads the record and the parts
// above it (at most MAX_LINKS: the conversation is kept whole again every
// MAX_LINKS turns); a put writes the hash with its TTL, counts itself among
// its parent's kids (`k`) and stretches the TTL of every part above it to its
// own (a part outlives what needs it); a delete drops the record, or only its
// Response while parts below need its part, and with it the parts above that
// no one needs. Fields: h (a small header: version, root, parent, created,
// the ids' length; then ids and conv back to back: one field, no per-field
// parsing), r (the Response object; '' once deleted but kept as a part),
// u (the parent's id, '' for a whole conversation), d (parts above), k (kids).
// A record of the earlier layout (one string, its conversation whole) is
// still read and deleted.
//
// Why ioredis (over node-redis): it fails fast when the server is away
// (`enableOfflineQueue: false`: a command errors at once instead of waiting
// in a queue, so the API answers 503 and chat completions never notice),
// bounds every command (`commandTimeout`), reconnects in the background with
// our backoff, and speaks Sentinel with the same client class. The scripts
// reach a conversation's parts by key, so one conversation lives on one
// Redis server (standalone or Sentinel, not Cluster).
// Keys carry the tenant (keyOf). Size bounds are Redis's own (`maxmemory` with an LRU policy); a record
// Redis evicted, or one whose part above was evicted, is a clean 404 for its continuation like any other.
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { ResponsesConfig } from '../config/responses.js';
import { linksParent, MAX_LINKS, StoreUnavailableError, type ResponseStore, type StoredResponse } from './store.js';

export class RedisStore implements ResponseStore {
  readonly type = 'redis' as const;
  /** The connection (another shared-state user, e.g. session pins, may issue its own commands on it). */
  readonly client: Redis;
  readonly #ttlMs: number;
  readonly #where: string;
  /** The store's keyPrefix (the scripts build the keys of a record's parts themselves). */
  readonly #prefix: string;
  /** The client, with the scripts defined on it. */
  readonly #s: Scripted;
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
    this.#prefix = cfg.store.keyPrefix;
    this.client = new Redis(url, {
      keyPrefix: cfg.store.keyPrefix,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 1,
      commandTimeout: cfg.store.commandTimeoutMs,
      connectTimeout: 2000,
      retryStrategy: (times) => Math.min(50 * times, 1000),
    });
    for (const [name, lua] of Object.entries(SCRIPTS)) this.client.defineCommand(name, { numberOfKeys: 2, lua });
    this.#s = this.client as unknown as Scripted;
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

  /** The prefix of the keys of `tenant`'s parts, as the scripts see it (the client's keyPrefix included). */
  #parts(tenant: string): string {
    return `${this.#prefix}p:${tenant.length}:${tenant}:`;
  }

  async get(tenant: string, id: string): Promise<StoredResponse | null> {
    let v: string[] | null;
    try {
      v = await this.#s.swyRespGet(partKeyOf(tenant, id), keyOf(tenant, id), this.#parts(tenant), MAX_LINKS);
    } catch (err) {
      throw this.#fail(err);
    }
    if (v === null) return null;
    if (v[0] === '') return decode(tenant, id, v[1]!); // the earlier layout
    return assemble(tenant, id, v);
  }

  async put(r: StoredResponse): Promise<boolean> {
    const c = this.#s;
    const key = partKeyOf(r.tenant, r.id);
    const parts = this.#parts(r.tenant);
    try {
      if (linksParent(r) && (await c.swyRespPut(key, keyOf(r.tenant, r.id), parts, MAX_LINKS, this.#ttlMs, r.parent, head(r, r.addedIds!, r.addedConv!), r.response)) === 1) return true;
      // a first turn, a truncated conversation, a checkpoint, or the parent's part is gone: whole
      await c.swyRespPut(key, keyOf(r.tenant, r.id), parts, MAX_LINKS, this.#ttlMs, '', head(r, r.ids, r.conv), r.response);
      return true;
    } catch (err) {
      throw this.#fail(err);
    }
  }

  async delete(tenant: string, id: string): Promise<boolean> {
    try {
      return (await this.#s.swyRespDel(partKeyOf(tenant, id), keyOf(tenant, id), this.#parts(tenant), MAX_LINKS)) > 0;
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
const VERSION_PARTS = 'r2';

/** The scripts this store defines on its client (KEYS: the record's hash, its key in the earlier layout; ARGV[1]: the tenant's parts' key prefix, ARGV[2]: MAX_LINKS). */
interface Scripted {
  swyRespGet(key: string, oldKey: string, parts: string, maxLinks: number): Promise<string[] | null>;
  swyRespPut(key: string, oldKey: string, parts: string, maxLinks: number, ttlMs: number, up: string, head: string, response: string): Promise<number>;
  swyRespDel(key: string, oldKey: string, parts: string, maxLinks: number): Promise<number>;
}

const SCRIPTS = {
  // -> nil (absent, deleted, or a part above it is gone) | {'', value of the earlier layout} | {response, h, h of the parent's part, ...}
  swyRespGet: `
local v = redis.call('HMGET', KEYS[1], 'r', 'h', 'u')
if not v[1] then
  if redis.call('TYPE', KEYS[2]).ok ~= 'string' then return false end
  return {'', redis.call('GET', KEYS[2])}
end
if v[1] == '' then return false end
local out = {v[1], v[2]}
local up = v[3]
local n = 0
while up and up ~= '' do
  n = n + 1
  if n > tonumber(ARGV[2]) then return false end
  local p = redis.call('HMGET', ARGV[1] .. up, 'h', 'u')
  if not p[1] then return false end
  out[#out + 1] = p[1]
  up = p[2]
end
return out`,
  // ARGV[3] ttl ms, [4] the parent's id ('' for a whole conversation), [5] h, [6] the Response -> 1, or 0 when the parent's part is gone or the chain is long enough (the caller writes it whole)
  swyRespPut: `
local ttl = tonumber(ARGV[3])
local up = ARGV[4]
local d = 0
if up ~= '' then
  local pd = redis.call('HGET', ARGV[1] .. up, 'd')
  if not pd then return 0 end
  d = tonumber(pd) + 1
  if d >= tonumber(ARGV[2]) then return 0 end
end
redis.call('HSET', KEYS[1], 'h', ARGV[5], 'r', ARGV[6], 'u', up, 'd', d, 'k', 0)
redis.call('PEXPIRE', KEYS[1], ttl)
if up ~= '' then redis.call('HINCRBY', ARGV[1] .. up, 'k', 1) end
-- every part above lives at least as long as the one below it: stretched (with a quarter to spare, so the
-- next puts stop at once) up to the first one that already outlives this record
local n = 0
local stretched = math.floor(ttl * 1.25)
while up ~= '' and n < tonumber(ARGV[2]) do
  local k = ARGV[1] .. up
  if redis.call('PTTL', k) >= ttl then break end
  redis.call('PEXPIRE', k, stretched)
  up = redis.call('HGET', k, 'u') or ''
  n = n + 1
end
return 1`,
  // -> 1 when the record was there
  swyRespDel: `
local v = redis.call('HMGET', KEYS[1], 'r', 'k', 'u')
if not v[1] then
  if redis.call('TYPE', KEYS[2]).ok ~= 'string' then return 0 end
  return redis.call('DEL', KEYS[2])
end
if v[1] == '' then return 0 end
if tonumber(v[2]) > 0 then
  redis.call('HSET', KEYS[1], 'r', '')
  return 1
end
redis.call('DEL', KEYS[1])
local up = v[3]
local n = 0
while up and up ~= '' and n < tonumber(ARGV[2]) do
  local k = ARGV[1] .. up
  if redis.call('EXISTS', k) == 0 then break end
  if redis.call('HINCRBY', k, 'k', -1) > 0 then break end
  local p = redis.call('HMGET', k, 'r', 'u')
  if p[1] ~= '' then break end
  redis.call('DEL', k)
  up = p[2]
  n = n + 1
end
return 1`,
};

/**
 * The hash of a record: `p:<tenant length>:<tenant>:<id>`. A key of the
 * earlier layout (keyOf) starts with a digit, so no id a client sends can
 * name a part's hash through it, nor a record's hash name another tenant's.
 */
export function partKeyOf(tenant: string, id: string): string {
  return `p:${tenant.length}:${tenant}:${id}`;
}

/** A part's h: `r2\n<root>\n<parent>\n<createdAt>\n<ids length>\n` + ids + conv. */
function head(r: StoredResponse, ids: string, conv: string): string {
  return `${VERSION_PARTS}\n${r.root}\n${r.parent}\n${r.createdAt}\n${ids.length}\n${ids}${conv}`;
}

/** The record of swyRespGet's answer {response, h, h above, ...}, or null when a part cannot be read. */
export function assemble(tenant: string, id: string, v: string[]): StoredResponse | null {
  const cs: string[] = [];
  const is: string[] = [];
  let root = '';
  let parent = '';
  let createdAt = 0;
  for (let i = 1; i < v.length; i++) {
    const h = v[i]!;
    const nl: number[] = [];
    for (let at = -1, k = 0; k < 5; k++) {
      at = h.indexOf('\n', at + 1);
      if (at < 0) return null;
      nl.push(at);
    }
    if (h.slice(0, nl[0]) !== VERSION_PARTS) return null;
    const idsLen = Number(h.slice(nl[3]! + 1, nl[4]));
    const body = nl[4]! + 1;
    if (!Number.isInteger(idsLen) || body + idsLen > h.length) return null;
    const pi = h.slice(body, body + idsLen);
    const pc = h.slice(body + idsLen);
    if (i === 1) {
      root = h.slice(nl[0]! + 1, nl[1]);
      parent = h.slice(nl[1]! + 1, nl[2]);
      createdAt = Number(h.slice(nl[2]! + 1, nl[3]));
    }
    cs.push(pc);
    is.push(pi);
  }
  // oldest first, joined once
  return { tenant, id, root, parent, createdAt, conv: cs.reverse().join(','), ids: is.reverse().join(','), response: v[0]! };
}

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
