// What the router's Redis clients that sit on a request's path share (the
// session store, src/sessions/redis.ts; the rate-limit counters,
// src/limits/redis-counters.ts): waiting for the first connection without
// holding start-up longer than 2 s, and connection errors logged at most once
// every 10 s (a Redis that is down emits one per reconnect attempt). A leaf:
// it imports nothing of ours.
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';

/** Resolves once `r` is connected, or after 2 s (its users then go on without it until it is). */
export function redisReady(r: Redis): Promise<void> {
  if (r.status === 'ready') return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(t);
      r.off('ready', done);
      resolve();
    };
    const t = setTimeout(done, 2000);
    t.unref();
    r.once('ready', done);
  });
}

/** Logs a warning at most once every 10 s (connection errors repeat on every reconnect attempt). */
export class RateLimitedWarn {
  readonly #log: Logger | undefined;
  #lastLog = 0;

  constructor(log: Logger | undefined) {
    this.#log = log;
  }

  warn(err: Error, msg: string): void {
    const now = Date.now();
    if (now - this.#lastLog < 10_000) return;
    this.#lastLog = now;
    this.#log?.warn({ err: err.message }, msg);
  }
}
