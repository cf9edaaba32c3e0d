// Scorer `prefix-cache`: the share of the prompt's leading blocks an endpoint
// is believed to hold, read from the prefix producer's match (the scheduler
// hashes and matches once per request, see prefix-producer.ts; this scorer
// has no side effects). Score = matched blocks / prompt blocks, except on a
// saturated endpoint, which scores 0 so a hot prefix spills over to replicas
// with room instead of piling up. Saturated is either of:
//
// - a queue `saturatedQueue` or more requests longer than the shortest
//   candidate's, by the endpoint's own queue estimate;
// - a full batch (`spillAtBatchLimit`, on by default): the fleet's requests
//   at the engine (Endpoint.occupancy: the router's and its active-active
//   replicas' in flight, plus foreign load from the last scrape) at or above
//   its batch limit (learned from its running/waiting counts, or
//   pools[].batchLimit), while another candidate's batch has a free slot.
//   A request sent to a full batch waits for a slot (on a long-output
//   workload, the rest of a running request's decode) before its prefill; the
//   cached prefix saves only that prefill, and the spill places a second copy
//   of the prefix that its later requests follow while the first engine is
//   full. The limit must be known: the engine's own (learned or configured),
//   else the largest its pool's other candidates learned (a pool is one
//   deployment; an engine that never queued yet has its peers' max-num-seqs);
//   the probe used before any engine of the pool queued is a guess that may be
//   low, and a spill costs a miss. The queue estimate alone cannot see a full
//   batch: it counts waiting requests, so the prefix held until
//   `saturatedQueue` requests waited behind the running ones
//   (bench/RESULTS.md, 2026-12-04).
//
// When the producer weighs matched blocks by KV tier (ctx.prefixWeighted: a
// block in host memory or on disk is worth less than one on the GPU), the
// weighted count is used.
import type { Endpoint } from '../../endpoints/endpoint.js';
import { boolParam, intParam, numberParam, pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Scorer } from '../types.js';
import { BatchRoom, ensure } from './score-util.js';

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
  readonly #spillAtBatchLimit: boolean;
  /** Which candidates' batches are full (the rule the queue scorer shares). */
  readonly #room = new BatchRoom();

  constructor(saturatedQueue = 16, blockSize?: number, spillAtBatchLimit = true) {
    this.#saturatedQueue = saturatedQueue;
    this.blockSize = blockSize;
    this.#spillAtBatchLimit = spillAtBatchLimit;
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
    const now = ctx.now;
    const queues = (this.#queues = ensure(this.#queues, n));
    let shortest = Infinity;
    // some candidate has a free batch slot (or an unknown limit): a full one's prefix may spill there
    let room = false;
    for (let i = 0; i < n; i++) {
      const q = eps[i].queueEstimate(now);
      queues[i] = q;
      if (q < shortest) shortest = q;
    }
    if (this.#spillAtBatchLimit && n > 1) room = this.#room.fill(eps, n, now);
    const isFull = this.#room.isFull;
    // Queue saturation is relative to the shortest candidate queue: when every
    // replica is backed up, spilling a prefix elsewhere only adds prefill work
    // and KV pressure, so affinity holds until another replica is clearly freer.
    // Likewise a full batch keeps its prefix when every candidate's is full.
    for (let i = 0; i < n; i++) {
      const m = matched[i];
      out[i] = m > 0 && (sat === 0 || queues[i] - shortest < sat) && !(room && isFull[i] === 1) ? Math.min(1, m / total) : 0;
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
    spillAtBatchLimit: boolParam().optional().describe('an endpoint whose batch is full (occupancy at its learned or configured batch limit) scores 0 while another candidate has a free slot (default true)'),
  }),
  create: (p) => new PrefixCacheScorer((p.saturatedQueue as number | undefined) ?? 16, p.blockSize as number | undefined, (p.spillAtBatchLimit as boolean | undefined) ?? true),
};
