// The prefix producer: prefix matching once per request, for every plugin that
// reads it. The scheduler calls it after the filters: it hashes the prompt and
// matches it against the candidates in one native call, records the blocks as
// held by the picked endpoint (approximate mode: the router's own record of
// what it sent where), forgets them again when the dispatch failed before the
// engine took the prompt, and applies each endpoint's capacity. Scorers only
// read its result from the cycle context (ctx.promptBlocks, ctx.prefixMatched).
//
// This is the one place where event-fed (precise) matching plugs in: another
// PrefixStore, fed from engines' KV events, behind the same calls.
import type { Endpoint } from '../endpoints/endpoint.js';
import { indexBlocksFor } from '../endpoints/engine-metrics.js';
import { NativePrefixStore, type PrefixStore } from './prefix-store.js';
import type { CycleContext, PickBlocks, SchedRequest } from './types.js';

/** The index's per-tier capacity limit (uint32); an engine's reported cache can convert to more. */
const MAX_BLOCKS = 0xffffffff;
const NO_MATCH = new Uint32Array(0);

function fnv1a64(s: string): bigint {
  let h = 0xcbf29ce484222325n;
  for (let i = 0; i < s.length; i++) {
    h ^= BigInt(s.charCodeAt(i));
    h = (h * 0x100000001b3n) & 0xffffffffffffffffn;
  }
  return h;
}

export interface PrefixProducerOptions {
  /** Bytes per block of the index. */
  blockSize: number;
  /** Bytes per block of a configured capacity (scheduling.prefixBlockSize); the index's own blocks may differ. */
  capacityBlockSize: number;
  maxEndpoints: number;
  /** Where the blocks live; default: the native index of this process. */
  store?: PrefixStore;
}

export class PrefixProducer {
  readonly store: PrefixStore;
  readonly #capacityBlockSize: number;
  readonly #seeds = new Map<string, bigint>();
  readonly #ids: Int32Array;
  readonly #idViews: Int32Array[] = [];
  /** Blocks hashed by the last match (0: nothing to record). */
  #hashCount = 0;
  #matched: Uint32Array = NO_MATCH;

  constructor(o: PrefixProducerOptions) {
    const max = Math.max(1, o.maxEndpoints);
    this.store = o.store ?? new NativePrefixStore(o.blockSize, max);
    this.#capacityBlockSize = o.capacityBlockSize;
    this.#ids = new Int32Array(max);
  }

  get blockSize(): number {
    return this.store.blockSize;
  }

  #seed(model: string): bigint {
    let s = this.#seeds.get(model);
    if (s === undefined) {
      // bounded: a model name reaches here only once the scheduler knows the model
      this.#seeds.set(model, (s = fnv1a64(model)));
    }
    return s;
  }

  /** The view of the first n ids, made once per candidate count (room is kept for every id the set may use). */
  #idView(n: number): Int32Array {
    const v = this.#ids.subarray(0, n);
    this.#idViews[n] = v;
    return v;
  }

  /** Hashes and matches the cycle's prompt against `eps`; fills ctx.promptBlocks and ctx.prefixMatched. */
  produce(ctx: CycleContext, eps: readonly Endpoint[]): void {
    const prompt = ctx.request.prompt;
    this.#hashCount = 0;
    if (!prompt || prompt.length < this.store.blockSize) {
      ctx.promptBlocks = 0;
      ctx.prefixMatched = NO_MATCH;
      return;
    }
    const n = eps.length;
    for (let i = 0; i < n; i++) this.#ids[i] = eps[i].id;
    const m = this.store.match(prompt, this.#seed(ctx.request.model), this.#idViews[n] ?? this.#idView(n));
    this.#hashCount = m.hashCount;
    this.#matched = m.matched;
    ctx.promptBlocks = m.hashCount;
    ctx.prefixMatched = m.matched;
  }

  /** The picker chose eps[index]: its matched blocks go to the decision, the prompt's blocks to the index. */
  record(ctx: CycleContext, ep: Endpoint, index: number): void {
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
  forget(ep: Endpoint, blocks: PickBlocks, req: SchedRequest): void {
    if (req.prompt === undefined || blocks.promptBlocks <= blocks.matchedBlocks) return;
    this.store.forget(ep.id, req.prompt, this.#seed(req.model), blocks.matchedBlocks);
  }

  /** Applies a configured capacity or one learnt from the engine's cache_config_info. */
  setCapacity(ep: Endpoint): void {
    const c = ep.configuredCapacity;
    if (c) this.store.setCapacity(ep.id, this.#blocks(c.gpuBlocks), this.#blocks(c.cpuBlocks), this.#blocks(c.diskBlocks));
    else if (ep.metrics.cacheBlocks > 0)
      this.store.setCapacity(ep.id, Math.min(MAX_BLOCKS, indexBlocksFor(ep.metrics.cacheBlocks, ep.metrics.cacheBlockTokens, this.store.blockSize)), 0, 0);
  }

  /** Drops everything an endpoint is believed to hold. */
  clear(ep: Endpoint): void {
    this.store.clear(ep.id);
  }

  /** Configured blocks (of scheduling.prefixBlockSize bytes) in the index's blocks. */
  #blocks(configured: number): number {
    const bs = this.store.blockSize;
    return bs === this.#capacityBlockSize ? configured : Math.min(MAX_BLOCKS, Math.floor((configured * this.#capacityBlockSize) / bs));
  }
}
