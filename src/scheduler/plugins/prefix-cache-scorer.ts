// Scorer `prefix-cache`: the share of the prompt's leading blocks an endpoint
// is believed to hold, from the prefix index in approximate mode (the router
// records each routing decision). Score = matched blocks / prompt blocks,
// except on a saturated endpoint (a queue `saturatedQueue` or more requests
// longer than the shortest candidate's: the engine's waiting count plus what
// this router sent since the last scrape, or the router's in-flight count when
// metrics are stale), which scores 0 so a hot prefix spills over to replicas
// with room instead of piling up.
// Capacity per endpoint (how many blocks it can hold before the index evicts
// its least recently used ones) comes from the config or the engine's
// cache_config_info (see engine-metrics.ts for the token → byte conversion).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { indexBlocksFor } from '../../endpoints/engine-metrics.js';
import { knownParams, numParam, type PluginFactory } from '../registry.js';
import { NativePrefixStore, type PrefixStore } from '../prefix-store.js';
import type { CycleContext, PickBlocks, PluginEnv, SchedRequest, Scorer } from '../types.js';
import { ensure } from './score-util.js';

/** The index's per-tier capacity limit (uint32); an engine's reported cache can convert to more. */
const MAX_BLOCKS = 0xffffffff;

function fnv1a64(s: string): bigint {
  let h = 0xcbf29ce484222325n;
  for (let i = 0; i < s.length; i++) {
    h ^= BigInt(s.charCodeAt(i));
    h = (h * 0x100000001b3n) & 0xffffffffffffffffn;
  }
  return h;
}

export class PrefixCacheScorer implements Scorer {
  readonly type = 'prefix-cache';
  readonly name = 'prefix-cache';
  readonly store: PrefixStore;
  readonly #seeds = new Map<string, bigint>();
  readonly #ids: Int32Array;
  readonly #idViews: Int32Array[] = [];
  #out = new Float64Array(16);
  #queues = new Float64Array(16);
  #matched: Uint32Array = new Uint32Array(0);
  #hashCount = 0;

  readonly #saturatedQueue: number;
  /** Bytes per block of a configured capacity (scheduling.prefixBlockSize); the store's own blocks may be larger or smaller. */
  readonly #capacityBlockSize: number;

  constructor(store: PrefixStore, maxEndpoints: number, saturatedQueue = 16, capacityBlockSize = store.blockSize) {
    this.store = store;
    this.#saturatedQueue = saturatedQueue;
    this.#capacityBlockSize = capacityBlockSize;
    this.#ids = new Int32Array(Math.max(1, maxEndpoints));
    for (let n = 0; n <= this.#ids.length; n++) this.#idViews.push(this.#ids.subarray(0, n));
  }

  #seed(model: string): bigint {
    let s = this.#seeds.get(model);
    if (s === undefined) this.#seeds.set(model, (s = fnv1a64(model)));
    return s;
  }

  score(ctx: CycleContext, eps: readonly Endpoint[]): Float64Array {
    const n = eps.length;
    const out = (this.#out = ensure(this.#out, n));
    const prompt = ctx.request.prompt;
    this.#hashCount = 0;
    if (!prompt || prompt.length < this.store.blockSize) {
      for (let i = 0; i < n; i++) out[i] = 0;
      ctx.promptBlocks = 0;
      return out;
    }
    for (let i = 0; i < n; i++) this.#ids[i] = eps[i].id;
    const m = this.store.match(prompt, this.#seed(ctx.request.model), this.#idViews[n]);
    const total = m.hashCount;
    this.#hashCount = total;
    this.#matched = m.matched;
    ctx.promptBlocks = total;
    const sat = this.#saturatedQueue;
    const queues = (this.#queues = ensure(this.#queues, n));
    let shortest = Infinity;
    for (let i = 0; i < n; i++) {
      const ep = eps[i];
      const q = ep.queueEstimate(ctx.now);
      queues[i] = q;
      if (q < shortest) shortest = q;
    }
    // Saturation is relative to the shortest candidate queue: when every
    // replica is backed up, spilling a prefix elsewhere only adds prefill work
    // and KV pressure, so affinity holds until another replica is clearly freer.
    for (let i = 0; i < n; i++) {
      out[i] = total > 0 && (sat === 0 || queues[i] - shortest < sat) ? Math.min(1, m.matched[i] / total) : 0;
    }
    return out;
  }

  onPicked(ctx: CycleContext, ep: Endpoint, index: number): void {
    if (this.#hashCount === 0) return;
    ctx.matchedBlocks = this.#matched[index];
    this.store.recordLast(ep.id);
  }

  /**
   * A dispatch that failed (connect error, reset, 5xx before any byte) never
   * made the engine compute the prompt: forget the blocks the pick recorded
   * beyond those the endpoint already held, so the next request for this
   * prefix is not drawn to an endpoint that lacks it.
   */
  onComplete(ep: Endpoint, failed: boolean, blocks?: PickBlocks, req?: SchedRequest): void {
    if (!failed || blocks === undefined || req?.prompt === undefined) return;
    if (blocks.promptBlocks > blocks.matchedBlocks) this.store.forget(ep.id, req.prompt, this.#seed(req.model), blocks.matchedBlocks);
  }

  /** Applies a configured capacity or one learnt from cache_config_info. */
  onCapacity(ep: Endpoint): void {
    const c = ep.configuredCapacity;
    if (c) this.store.setCapacity(ep.id, this.#blocks(c.gpuBlocks), this.#blocks(c.cpuBlocks), this.#blocks(c.diskBlocks));
    else if (ep.metrics.cacheBlocks > 0)
      this.store.setCapacity(ep.id, Math.min(MAX_BLOCKS, indexBlocksFor(ep.metrics.cacheBlocks, ep.metrics.cacheBlockTokens, this.store.blockSize)), 0, 0);
  }

  /** Configured blocks (of scheduling.prefixBlockSize bytes) in the store's blocks. */
  #blocks(configured: number): number {
    const bs = this.store.blockSize;
    return bs === this.#capacityBlockSize ? configured : Math.min(MAX_BLOCKS, Math.floor((configured * this.#capacityBlockSize) / bs));
  }
}

export const prefixCacheScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'prefix-cache',
  validate: (p) => {
    const out: string[] = [];
    knownParams(p, ['blockSize', 'saturatedQueue'], out);
    numParam(p, 'blockSize', 1, 1 << 20, out, true);
    numParam(p, 'saturatedQueue', 0, 1e9, out);
    return out;
  },
  create: (p, env: PluginEnv) => {
    const blockSize = (p.blockSize as number | undefined) ?? env.prefixBlockSize;
    const max = env.endpoints.all.length;
    const s = new PrefixCacheScorer(new NativePrefixStore(blockSize, max), max, (p.saturatedQueue as number | undefined) ?? 16, env.prefixBlockSize);
    for (const ep of env.endpoints.all) s.onCapacity(ep);
    return s;
  },
};
