// Session pins in Redis, shared by several routers (ioredis, already the
// project's Redis client). One string per session,
// `<keyPrefix><session key>` = `<last turn end, ms since epoch>\t<endpoint name>`,
// with the session TTL as its expiry: one GET before admission, one SET (PX)
// after a pin moves or a turn ends. Endpoint names, not ids: routers agree on
// names (unique across pools), not necessarily on ids.
//
// The pick is synchronous and never waits for Redis: the director reads a
// session through before admission (one GET per request that has a session
// key), the pick uses that local copy, and writes go out after the fact. What
// that allows (docs/responses.md, "Sessions"): a turn sent to router B while
// router A's write of the previous turn is still in flight (well under a
// millisecond on a LAN) sees the pin before that write; two turns of one
// session at once through two routers may both move it, and the last write
// wins. With Redis down or slow (timeoutMs), requests go on with the local
// view and the failures are counted.
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { RateLimitedWarn, redisReady } from '../redis-link.js';
import type { SessionRedisConfig } from '../config/sessions.js';
import type { SessionEntry, SharedSessions } from './table.js';

export class RedisSessions implements SharedSessions {
  readonly #redis: Redis;
  readonly #prefix: string;
  readonly #ttlMs: number;
  readonly #warns: RateLimitedWarn;
  errors = 0;

  constructor(cfg: SessionRedisConfig, ttlMs: number, log?: Logger) {
    this.#prefix = cfg.keyPrefix;
    this.#ttlMs = ttlMs;
    this.#warns = new RateLimitedWarn(log);
    this.#redis = new Redis(cfg.url, {
      // fail at once while disconnected instead of queueing behind the request
      enableOfflineQueue: false,
      commandTimeout: cfg.timeoutMs,
      maxRetriesPerRequest: 0,
      connectTimeout: Math.max(1000, cfg.timeoutMs),
      retryStrategy: (n) => Math.min(50 * n, 2000),
    });
    this.#redis.on('error', (err: Error) => this.#warns.warn(err, 'session store (Redis) connection error'));
  }

  ready(): Promise<void> {
    return redisReady(this.#redis);
  }

  load(e: SessionEntry, apply: (e: SessionEntry, lastEnd: number, endpoint: string) => void): Promise<void> {
    return this.#redis.get(this.#prefix + e.key).then(
      (v) => {
        e.syncedAt = Date.now();
        if (v === null) return;
        const tab = v.indexOf('\t');
        if (tab < 0) return;
        const end = Number(v.slice(0, tab));
        apply(e, Number.isFinite(end) ? end : 0, v.slice(tab + 1));
      },
      (err: Error) => {
        this.errors++;
        this.#warns.warn(err, 'session store (Redis) read failed: going on with the local view');
      },
    );
  }

  save(e: SessionEntry): void {
    const value = `${e.lastEnd}\t${e.ep === null ? '' : e.ep.name}`;
    this.#redis.set(this.#prefix + e.key, value, 'PX', this.#ttlMs).catch((err: Error) => {
      this.errors++;
      this.#warns.warn(err, 'session store (Redis) write failed');
    });
  }

  async close(): Promise<void> {
    this.#redis.disconnect();
  }
}
