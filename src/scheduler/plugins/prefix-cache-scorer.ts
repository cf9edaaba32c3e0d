// Scorer `prefix-cache`: the share of the prompt's leading blocks an endpoint
// is believed to hold, read from the prefix producer's match (the scheduler
// hashes and matches once per request, see prefix-producer.ts; this scorer
// has no side effects). Score = matched blocks / prompt blocks, except on a
// saturated endpoint (a queue `saturatedQueue` or more requests longer than
// the shortest candidate's, by the endpoint's own queue estimate), which
// scores 0 so a hot prefix spills over to replicas with room instead of
// piling up. When the producer weighs matched blocks by KV tier
// (ctx.prefixWeighted: a block in host memory or on disk is worth less than one
// on the GPU), the weighted count is used.
import type { Endpoint } from '../../endpoints/endpoint.js';
import { intParam, numberParam, pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Scorer } from '../types.js';
import { ensure } from './score-util.js';

export class PrefixCacheScorer implements Scorer {
  readonly type = 'prefix-cache';
  readonly name = 'prefix-cache';
  /** The scheduler runs its prefix producer when a plugin says it reads the match. */
  readonly usesPrefix = true;
  /** Bytes per block this scorer asks the producer for (undefined: scheduling.prefixBlockSize). */
  readonly blockSize: number | undefined;
  #out = new Float64Array(16);
  #queues = new Float64Array(16);
  readonly #saturatedQueue: number;

  constructor(saturatedQueue = 16, blockSize?: number) {
    this.#saturatedQueue = saturatedQueue;
    this.blockSize = blockSize;
  }

  score(ctx: CycleContext, eps: readonly Endpoint[]): Float64Array {
    const n = eps.length;
    const out = (this.#out = ensure(this.#out, n));
    const total = ctx.promptBlocks;
    if (total === 0) {
      for (let i = 0; i < n; i++) out[i] = 0;
      return out;
    }
    const matched = ctx.prefixWeighted ?? ctx.prefixMatched;
    const sat = this.#saturatedQueue;
    const queues = (this.#queues = ensure(this.#queues, n));
    let shortest = Infinity;
    for (let i = 0; i < n; i++) {
      const q = eps[i].queueEstimate(ctx.now);
      queues[i] = q;
      if (q < shortest) shortest = q;
    }
    // Saturation is relative to the shortest candidate queue: when every
    // replica is backed up, spilling a prefix elsewhere only adds prefill work
    // and KV pressure, so affinity holds until another replica is clearly freer.
    for (let i = 0; i < n; i++) {
      out[i] = sat === 0 || queues[i] - shortest < sat ? Math.min(1, matched[i] / total) : 0;
    }
    return out;
  }
}

export const prefixCacheScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'prefix-cache',
  params: pluginParams({
    blockSize: intParam(1, 1 << 20).optional().describe('bytes per index block; default scheduling.prefixBlockSize'),
    saturatedQueue: numberParam(0, 1e9).optional().describe('queue length over the shortest candidate at which an endpoint scores 0 (default 16; 0 = off)'),
  }),
  create: (p) => new PrefixCacheScorer((p.saturatedQueue as number | undefined) ?? 16, p.blockSize as number | undefined),
};
