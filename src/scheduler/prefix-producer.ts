// The prefix producer: prefix matching once per request, for every plugin that
// reads it. The scheduler calls it after the filters: it hashes the prompt and
// matches it against the candidates in one native call, records the blocks as
// held by the picked endpoint (approximate mode: the router's own record of
// what it sent where), forgets them again when the dispatch failed before the
// engine took the prompt, and applies each endpoint's capacity. Scorers only
// read its result from the cycle context (ctx.promptBlocks, ctx.prefixMatched).
//
// Precise mode (docs/prefix-index.md): a second native index fed by engines'
// KV events (src/kv-events/), keyed by the router's own chained hash of token
// ids. When the request carries its tokens (req.tokens) and a candidate's event
// stream is healthy, that candidate's match comes from the precise index; any
// other candidate (an approximate pool, a stream that is down, a request whose
// tokenization failed) keeps the approximate match, scaled to precise blocks.
// The approximate index is always kept up to date, so it is a warm fallback.
// Matched blocks are also weighed by the tier they sit in (ctx.prefixWeighted).
import { MatchResult, PrefixIndex } from '../../bindings/index.js';
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

/** The event-fed side of precise mode (src/kv-events/feed.ts implements it). */
export interface PreciseSource {
  /** The precise index: blockSize = engine tokens per block × 4 bytes. */
  readonly index: PrefixIndex;
  /** Whether endpoint `id`'s entries come from a healthy event stream. */
  healthy(id: number): boolean;
  /** How long a pick's blocks count as held before the engine's events confirm them, ms (0 or absent: off). */
  readonly speculativeMs?: number;
}

/** Weights of a matched block by the tier it sits in: [GPU, host memory, disk]. */
export type TierWeights = readonly [number, number, number];

/**
 * Defaults from the simulator's costs (bench/tier-weights.ts measures them): a GPU hit saves the whole
 * recompute of a block (16 tokens × 50 µs = 800 µs); a host-memory hit saves it minus the reload
 * (100 µs/block: 0.875); a disk hit minus a slower reload (400 µs/block: 0.5).
 */
export const DEFAULT_TIER_WEIGHTS: TierWeights = [1, 0.875, 0.5];

/** Counters of precise mode (read by the router's metrics). */
export class PreciseCounters {
  /** Candidates scored from the precise index / by the approximate fallback (stream unhealthy or no tokens). */
  precise = 0;
  fallbackUnhealthy = 0;
  fallbackNoTokens = 0;
  /** Precise candidates whose match the speculative entries raised. */
  speculative = 0;
  /** Candidates whose host-memory / disk blocks were not counted: no GPU room to load them while another candidate had room. */
  noRoom = 0;
}

/**
 * Precise mode's speculative entries. Between routing a prompt and its engine's
 * BlockStored events lie the queue, the prefill and the publish interval:
 * seconds under load. In that gap the event-fed index does not know where the
 * prompt went, so followers of the same prefix would be spread by the load
 * scorers and each engine would prefill it again (the approximate mode records
 * on the pick and has no such gap). So the pick is recorded here too, as held
 * in GPU memory, and forgotten after `ms` whether confirmed or not: two
 * generations of a native index, the older cleared every ms / 2, so an entry
 * lives between ms / 2 and ms. No per-request allocation; a match is two
 * native calls over the candidates.
 */
class SpeculativeEntries {
  readonly #gens: [PrefixIndex, PrefixIndex];
  /** Endpoint ids recorded in each generation (cleared at its rotation), and their marks. */
  readonly #touched: [number[], number[]] = [[], []];
  readonly #marks: [Uint8Array, Uint8Array];
  readonly #halfMs: number;
  readonly #a = new MatchResult(0, 16);
  readonly #b = new MatchResult(0, 16);
  #best = new Uint32Array(16);
  #scratch = new BigUint64Array(256);
  #cur = 0;
  #since: number;

  constructor(blockSize: number, maxEndpoints: number, ms: number) {
    const o = { blockSize, maxEndpoints, defaultCapacity: [0xffffffff, 0, 0] as [number, number, number] };
    this.#gens = [new PrefixIndex(o), new PrefixIndex(o)];
    this.#marks = [new Uint8Array(maxEndpoints), new Uint8Array(maxEndpoints)];
    this.#halfMs = ms / 2;
    this.#since = performance.now();
  }

  #clear(g: number): void {
    const ids = this.#touched[g]!;
    const idx = this.#gens[g]!;
    const marks = this.#marks[g]!;
    for (let i = 0; i < ids.length; i++) {
      idx.clear(ids[i]!);
      marks[ids[i]!] = 0;
    }
    ids.length = 0;
  }

  /** Drops the older generation every halfMs (both when a whole window passed). */
  rotate(now: number): void {
    const age = now - this.#since;
    if (age < this.#halfMs) return;
    const old = 1 - this.#cur;
    this.#clear(old);
    if (age >= 2 * this.#halfMs) this.#clear(this.#cur);
    this.#cur = old;
    this.#since = now;
  }

  /** Per candidate: leading blocks of `hashes` picked for it recently (max over both generations). */
  match(hashes: BigUint64Array, count: number, ids: Int32Array): Uint32Array {
    const n = ids.length;
    if (this.#best.length < n) this.#best = new Uint32Array(n * 2);
    const a = this.#gens[0].matchHashes(hashes, count, ids, this.#a).matched;
    const b = this.#gens[1].matchHashes(hashes, count, ids, this.#b).matched;
    const best = this.#best;
    for (let i = 0; i < n; i++) best[i] = a[i]! > b[i]! ? a[i]! : b[i]!;
    return best;
  }

  record(id: number, hashes: BigUint64Array, count: number): void {
    const g = this.#cur;
    if (this.#marks[g]![id] === 0) {
      this.#marks[g]![id] = 1;
      this.#touched[g]!.push(id);
    }
    this.#gens[g]!.record(id, hashes, count, 0);
  }

  /** Forgets every pick recorded for endpoint `id` (its engine restarted, or it left the set). */
  clearEndpoint(id: number): void {
    this.#gens[0].clear(id);
    this.#gens[1].clear(id);
  }

  /** A failed dispatch: the engine never took the prompt (`tokens` hashed with `seed` as the precise index does). */
  forget(id: number, index: PrefixIndex, tokens: Uint8Array, seed: bigint): void {
    const need = Math.floor(tokens.length / index.blockSize);
    if (need === 0) return;
    if (this.#scratch.length < need) this.#scratch = new BigUint64Array(need * 2);
    const n = index.hashPrompt(tokens, seed, this.#scratch);
    this.#gens[0].remove(id, this.#scratch, n);
    this.#gens[1].remove(id, this.#scratch, n);
  }
}

export interface PrefixProducerOptions {
  /** Bytes per block of the index. */
  blockSize: number;
  /** Bytes per block of a configured capacity (scheduling.prefixBlockSize); the index's own blocks may differ. */
  capacityBlockSize: number;
  maxEndpoints: number;
  /** Where the blocks live; default: the native index of this process. */
  store?: PrefixStore;
  /** Precise mode's event-fed index (absent: approximate only). */
  precise?: PreciseSource;
  tierWeights?: TierWeights;
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
  readonly precise: PreciseSource | null;
  readonly preciseCounters = new PreciseCounters();
  readonly tierWeights: TierWeights;
  readonly #pSeeds = new Map<string, bigint>();
  readonly #pResult = new MatchResult(256, 16);
  /** Precise mode's speculative entries (null: precise mode off, or speculativeMs 0). */
  readonly #spec: SpeculativeEntries | null;
  /** Blocks the last produce() hashed for the precise index (0: nothing to record speculatively). */
  #pCount = 0;
  #combined = new Uint32Array(16);
  #weighted = new Float64Array(16);
  /** subarray(0, n) views of #combined / #weighted, made once per size (no allocation per request). */
  #combinedViews: Uint32Array[] = [];
  #weightedViews: Float64Array[] = [];
  /** Per candidate of the last produce(): tiers[3i + t] of its matched blocks, and the tokens per block of the answer. */
  #tiers = new Uint32Array(48);
  #tokensPerBlock = 0;
  /** Per candidate of the last precise produce(): 1 when it can admit the prompt now (#roomCheck). */
  #fits = new Uint8Array(16);
  #lastN = 0;
  /** Candidate index the last pick chose (-1: none since the last produce()). */
  #pickedIndex = -1;

  constructor(o: PrefixProducerOptions) {
    const max = Math.max(1, o.maxEndpoints);
    this.store = o.store ?? new NativePrefixStore(o.blockSize, max);
    this.#capacityBlockSize = o.capacityBlockSize;
    this.#ids = new Int32Array(max);
    this.precise = o.precise ?? null;
    this.tierWeights = o.tierWeights ?? DEFAULT_TIER_WEIGHTS;
    const ms = this.precise?.speculativeMs ?? 0;
    this.#spec = this.precise !== null && ms > 0 ? new SpeculativeEntries(this.precise.index.blockSize, max, ms) : null;
  }

  #preciseSeed(model: string): bigint {
    let s = this.#pSeeds.get(model);
    if (s === undefined) this.#pSeeds.set(model, (s = PrefixIndex.seedFor(model)));
    return s;
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

  /** Prompt tokens per block of the last produce() (precise or approximate blocks, as ctx.matchedBlocks counts them). */
  get tokensPerBlock(): number {
    return this.#tokensPerBlock;
  }

  /** Hashes and matches the cycle's prompt against `eps`; fills ctx.promptBlocks, ctx.prefixMatched and ctx.prefixWeighted. */
  produce(ctx: CycleContext, eps: readonly Endpoint[]): void {
    const prompt = ctx.request.prompt;
    this.#hashCount = 0;
    this.#lastN = 0;
    this.#pCount = 0;
    this.#pickedIndex = -1;
    ctx.prefixWeighted = undefined;
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
    this.#tokensPerBlock = this.store.blockSize / 4;
    if (this.precise !== null) this.#producePrecise(ctx, eps, m.matched, m.hashCount, m.tiers);
    else if (m.tiers !== undefined) this.#weigh(ctx, n, m.tiers);
  }

  #producePrecise(ctx: CycleContext, eps: readonly Endpoint[], approx: Uint32Array, approxCount: number, approxTiers: Uint32Array | undefined): void {
    const n = eps.length;
    const c = this.preciseCounters;
    const tokens = ctx.request.tokens;
    const p = this.precise!;
    if (tokens === undefined || tokens.length < p.index.blockSize) {
      c.fallbackNoTokens += n;
      if (approxTiers !== undefined) this.#weigh(ctx, n, approxTiers);
      return;
    }
    const ids = this.#idViews[n] ?? this.#idView(n);
    const r = p.index.matchPrompt(tokens, this.#preciseSeed(ctx.request.model), ids, this.#pResult);
    const count = r.hashCount;
    let spec: Uint32Array | null = null;
    if (this.#spec !== null && count > 0) {
      this.#spec.rotate(performance.now());
      spec = this.#spec.match(r.hashes, count, ids);
      this.#pCount = count;
    }
    if (this.#combined.length < n) {
      this.#combined = new Uint32Array(n * 2);
      this.#combinedViews = [];
    }
    if (this.#tiers.length < 3 * n) this.#tiers = new Uint32Array(6 * n);
    const out = this.#combined;
    const tiers = this.#tiers;
    // approximate blocks in precise units (the same prompt cut in two block sizes)
    const scale = approxCount > 0 ? count / approxCount : 0;
    for (let i = 0; i < n; i++) {
      if (p.healthy(eps[i].id)) {
        c.precise++;
        out[i] = r.matched[i]!;
        tiers[3 * i] = r.tiers[3 * i]!;
        tiers[3 * i + 1] = r.tiers[3 * i + 1]!;
        tiers[3 * i + 2] = r.tiers[3 * i + 2]!;
        // blocks picked for this endpoint that its engine has not confirmed yet count as held in GPU memory
        if (spec !== null && spec[i]! > out[i]!) {
          c.speculative++;
          tiers[3 * i] += spec[i]! - out[i]!;
          out[i] = spec[i]!;
        }
      } else {
        c.fallbackUnhealthy++;
        const v = Math.min(count, Math.floor(approx[i]! * scale));
        out[i] = v;
        const m = approx[i]!;
        // the approximate index's own tier split, scaled
        const f = m > 0 && approxTiers !== undefined ? v / m : 0;
        tiers[3 * i] = approxTiers !== undefined ? Math.round(approxTiers[3 * i]! * f) : v;
        tiers[3 * i + 1] = approxTiers !== undefined ? Math.round(approxTiers[3 * i + 1]! * f) : 0;
        tiers[3 * i + 2] = approxTiers !== undefined ? Math.round(approxTiers[3 * i + 2]! * f) : 0;
      }
    }
    ctx.promptBlocks = count;
    ctx.prefixMatched = this.#combinedViews[n] ??= out.subarray(0, n);
    this.#matched = ctx.prefixMatched;
    this.#tokensPerBlock = p.index.blockSize / 4;
    this.#weigh(ctx, n, tiers);
    this.#roomCheck(ctx, eps, count);
  }

  /**
   * Host-memory and disk blocks save their recompute only once the engine can
   * load them into GPU memory, i.e. admit the request. An engine whose GPU is
   * full of running requests' blocks (vLLM's kv_cache_usage_perc counts the
   * blocks in use, not the idle cached ones), or that already has requests
   * waiting, queues the request until running ones finish — seconds, a whole
   * decode — while an engine with room prefills it now. So when some candidate
   * can admit the prompt at once, a candidate that cannot has its non-GPU
   * blocks weighted 0 (its GPU-resident match still counts): a group whose
   * prefix survives only in a busy engine's host tier is not pulled onto it.
   * When no candidate has room, the request waits wherever it goes and the
   * weights stay as they are. Room is read from fresh metrics and the engine's
   * block count (cache_config_info); without them a candidate counts as having
   * room. Predicted matches (ctx.prefixMatched, the tiers for cachedTokens)
   * are unchanged: the blocks are there, they are only not worth the wait.
   */
  #roomCheck(ctx: CycleContext, eps: readonly Endpoint[], count: number): void {
    const n = eps.length;
    const tiers = this.#tiers;
    const tpb = this.#tokensPerBlock;
    const now = ctx.now;
    let roomy = false;
    let tight = false;
    const fits = this.#fits.length >= n ? this.#fits : (this.#fits = new Uint8Array(n * 2));
    for (let i = 0; i < n; i++) {
      const ep = eps[i];
      const m = ep.metrics;
      let f = 1;
      if (ep.fresh(now) && m.cacheBlocks > 0 && m.kvUsage === m.kvUsage) {
        if (m.waiting > 0) f = 0;
        else {
          const ebt = m.cacheBlockTokens > 0 ? m.cacheBlockTokens : tpb;
          const need = Math.ceil(((count - tiers[3 * i]!) * tpb) / ebt);
          if (need > m.cacheBlocks * (1 - m.kvUsage)) f = 0;
        }
      }
      fits[i] = f;
      if (f === 1) roomy = true;
      else if (tiers[3 * i + 1]! + tiers[3 * i + 2]! > 0) tight = true;
    }
    if (!roomy || !tight) return;
    const w0 = this.tierWeights[0];
    const weighted = this.#weighted;
    for (let i = 0; i < n; i++) {
      if (fits[i] === 1 || tiers[3 * i + 1]! + tiers[3 * i + 2]! === 0) continue;
      weighted[i] = tiers[3 * i]! * w0;
      this.preciseCounters.noRoom++;
    }
  }

  /** ctx.prefixWeighted[i] = Σ_t weight[t] × tiers[3i + t] (and remembers the tiers for cachedTokens()). */
  #weigh(ctx: CycleContext, n: number, tiers: Uint32Array): void {
    if (this.#weighted.length < n) {
      this.#weighted = new Float64Array(n * 2);
      this.#weightedViews = [];
    }
    if (this.#tiers.length < 3 * n) this.#tiers = new Uint32Array(6 * n);
    const w = this.tierWeights;
    const out = this.#weighted;
    const keep = this.#tiers;
    for (let i = 0; i < n; i++) {
      const g = tiers[3 * i]!, h = tiers[3 * i + 1]!, d = tiers[3 * i + 2]!;
      if (keep !== tiers) {
        keep[3 * i] = g;
        keep[3 * i + 1] = h;
        keep[3 * i + 2] = d;
      }
      out[i] = g * w[0] + h * w[1] + d * w[2];
    }
    this.#lastN = n;
    ctx.prefixWeighted = this.#weightedViews[n] ??= out.subarray(0, n);
  }

  /**
   * The tier-weighted cached-token count of candidate `index` in the last produce() (the P/D decider
   * reads it: a prompt mostly cached on the decode endpoint needs no remote prefill). `out`, if given,
   * receives the unweighted tokens per tier [GPU, host, disk]. 0 when nothing was matched.
   */
  cachedTokens(index: number, out?: Float64Array): number {
    if (index < 0 || index >= this.#lastN) {
      if (out) out.fill(0, 0, 3);
      return 0;
    }
    const t = this.#tiers;
    const tpb = this.#tokensPerBlock;
    const w = this.tierWeights;
    if (out) {
      out[0] = t[3 * index]! * tpb;
      out[1] = t[3 * index + 1]! * tpb;
      out[2] = t[3 * index + 2]! * tpb;
    }
    return (t[3 * index]! * w[0] + t[3 * index + 1]! * w[1] + t[3 * index + 2]! * w[2]) * tpb;
  }

  /**
   * The tier-weighted cached tokens of the endpoint the last pick chose, read
   * right after the pick (the P/D decider); -1 when that pick matched no prefix
   * with tiers (the caller falls back to the matched block count).
   */
  pickedCachedTokens(): number {
    return this.#pickedIndex < 0 || this.#pickedIndex >= this.#lastN ? -1 : this.cachedTokens(this.#pickedIndex);
  }

  /** The picker chose eps[index]: its matched blocks go to the decision, the prompt's blocks to the index. */
  record(ctx: CycleContext, ep: Endpoint, index: number): void {
    this.#pickedIndex = index;
    if (this.#hashCount === 0) return;
    ctx.matchedBlocks = this.#matched[index];
    this.store.recordLast(ep.id);
    if (this.#pCount > 0 && this.precise!.healthy(ep.id)) this.#spec!.record(ep.id, this.#pResult.hashes, this.#pCount);
  }

  /**
   * A dispatch that failed (connect error, reset, 5xx before any byte) never
   * made the engine compute the prompt: forget the blocks the pick recorded
   * beyond those the endpoint already held, so the next request for this
   * prefix is not drawn to an endpoint that lacks it.
   */
  forget(ep: Endpoint, blocks: PickBlocks, req: SchedRequest): void {
    if (this.#spec !== null && req.tokens !== undefined) this.#spec.forget(ep.id, this.precise!.index, req.tokens, this.#preciseSeed(req.model));
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

  /** Drops everything an endpoint is believed to hold (its approximate record and precise mode's speculative entries). */
  clear(ep: Endpoint): void {
    this.store.clear(ep.id);
    this.#spec?.clearEndpoint(ep.id);
  }

  /** Configured blocks (of scheduling.prefixBlockSize bytes) in the index's blocks. */
  #blocks(configured: number): number {
    const bs = this.store.blockSize;
    return bs === this.#capacityBlockSize ? configured : Math.min(MAX_BLOCKS, Math.floor((configured * this.#capacityBlockSize) / bs));
  }
}
