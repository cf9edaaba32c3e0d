// Shared set-up of the precise-mode tests: a router config over a simulated
// fleet that publishes KV events, in precise or approximate mode, and a
// polling wait that fails the test with what it waited for.
import { API_VERSION, validateConfig, type RouterConfig } from '../../src/config/schema.js';
import type { SimFleet } from '../../src/sim/index.js';
import { validatePlugin } from './router-util.js';

/** Polls `cond` every 5 ms; throws "timed out waiting for <what>" after `ms`. */
export async function waitFor(what: string, cond: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/**
 * One pool `p` serving `open-model` over the fleet's engines (`e0`, `e1`, …).
 * Precise: 16-token blocks, the simulator's tokenizer, each endpoint
 * subscribed to its engine's publisher and replay socket. Approximate: the
 * byte-hashed default. `top` adds top-level blocks (scheduling, …).
 */
export function fleetConfig(fleet: SimFleet, mode: 'precise' | 'approximate', top: Record<string, unknown> = {}): RouterConfig {
  const precise = mode === 'precise';
  return validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [
        {
          name: 'p',
          models: ['open-model'],
          ...(precise ? { prefix: { mode: 'precise', blockTokens: 16, tokenizer: { type: 'sim' } } } : {}),
          endpoints: fleet.engines.map((e, i) => ({
            name: `e${i}`,
            url: e.url,
            ...(precise ? { kvEvents: { endpoint: e.kvEvents!.endpoint, replayEndpoint: e.kvEvents!.replayEndpoint! } } : {}),
          })),
        },
      ],
      logging: { level: 'silent' },
      ...top,
    },
    validatePlugin,
  );
}
