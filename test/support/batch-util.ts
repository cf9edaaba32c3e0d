// Shared set-up of the Files and Batches tests: a real redis-server, simulated
// engines and a router with a `batch` block over them (one pool `p` serving
// open-model, silent logs), all torn down with the test; and the small helpers
// those tests share (a poll until a value holds, a batch input line, a JSONL
// upload for the openai SDK).
import { toFile } from 'openai';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { startFleet, type FleetOptions, type SimFleet } from '../../src/sim/index.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';
import { startRedis } from './redis-util.js';
import { validatePlugin } from './router-util.js';

/**
 * The config document of the batch tests: pool `p` serving open-model over `urls` (endpoints e0, e1, …),
 * `logging.level: silent`, `batch` on `redisUrl` (stream jobs, group g, key prefix swy) with `batch`'s
 * fields over those, and `extra`'s top-level blocks.
 */
export function batchConfigDoc(urls: readonly string[], redisUrl: string, batch: Record<string, unknown> = {}, extra: Record<string, unknown> = {}) {
  return {
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['open-model'], endpoints: urls.map((url, i) => ({ name: `e${i}`, url })) }],
    logging: { level: 'silent' },
    ...extra,
    batch: { redis: redisUrl, stream: 'jobs', group: 'g', keyPrefix: 'swy', ...batch },
  };
}

export interface BatchRouterOptions {
  /** Simulated engines (default 1). */
  engines?: number;
  /** Their options (default `{ timeScale: 0 }`). */
  fleet?: FleetOptions;
  /** Fields of the `batch` block over the defaults (batchConfigDoc). */
  batch?: Record<string, unknown>;
  /** Other top-level blocks (flowControl, limits, …). */
  extra?: Record<string, unknown>;
}

export interface BatchRouter {
  router: RunningRouter;
  url: string;
  redisUrl: string;
  engines: SimFleet;
}

/** Starts redis-server, the engines and the router (in-process, loopback ports the OS picks); each closed at teardown. */
export async function startBatchRouter(t: Tap.Test, o: BatchRouterOptions = {}): Promise<BatchRouter> {
  const redis = await startRedis(t);
  const engines = await startFleet(o.engines ?? 1, o.fleet ?? { timeScale: 0 });
  t.teardown(() => engines.close());
  const cfg = validateConfig(batchConfigDoc(engines.urls, redis.url, o.batch, o.extra), validatePlugin);
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  return { router, url: router.url, redisUrl: redis.url, engines };
}

/** Polls `get` every 50 ms until `ok` holds; throws with the last value after `ms`. */
export async function until<T>(get: () => Promise<T>, ok: (v: T) => boolean, ms = 30000, what = ''): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await get();
    if (ok(v)) return v;
    if (Date.now() > end) throw new Error(`timed out${what ? ` waiting for ${what}` : ''}: ${JSON.stringify(v).slice(0, 400)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** One batch input line: a chat completion of `model` (default open-model), 4 tokens. */
export const chatLine = (id: string, model = 'open-model') =>
  JSON.stringify({ custom_id: id, method: 'POST', url: '/v1/chat/completions', body: { model, messages: [{ role: 'user', content: `hello ${id}` }], max_tokens: 4 } });

/** Lines as a JSONL upload for the openai SDK. */
export const jsonl = (lines: string[]) => toFile(Buffer.from(lines.join('\n') + '\n'), 'in.jsonl');
