// Typed API over the native prefix index (native/prefix_index.cc). The index
// maps chained block hashes to the endpoints that hold them, per KV tier, and
// answers "how many leading blocks of this prompt does each candidate hold" in
// one native call. Semantics: docs/prefix-index.md.
import { native } from './native.js';

export interface PrefixIndexOptions {
  /** Bytes per block in approximate mode (prompt bytes), default 64 (about 16 tokens). */
  blockSize?: number;
  /** Endpoint ids are integers in [0, maxEndpoints); default 1024, at most 16384. */
  maxEndpoints?: number;
  /** Capacity given to an endpoint first seen by record() without setCapacity(); default [16384, 0, 0]. */
  defaultCapacity?: TierCapacity;
}

/** Blocks per tier: [accelerator memory, host memory, disk]; 0 = tier absent. */
export type TierCapacity = readonly [gpu: number, cpu: number, disk: number];

export type Tier = 0 | 1 | 2;

export interface PrefixIndexStats {
  /** Resident (block, endpoint) entries per tier. */
  entries: [number, number, number];
  /** Distinct blocks held by at least one endpoint. */
  blocks: number;
  /** Heap bytes held by the native index (its own allocator accounting). */
  bytes: number;
  /** Endpoints known to the index (setCapacity or record). */
  endpoints: number;
}

export const DEFAULT_BLOCK_SIZE = 64;
export const DEFAULT_MAX_ENDPOINTS = 1024;
export const MAX_ENDPOINTS_LIMIT = 16384;
export const MAX_BLOCK_SIZE = 1 << 20;
export const DEFAULT_CAPACITY: TierCapacity = [16384, 0, 0];
const MAX_U32 = 0xffffffff;

/** Reusable output of a match: hashes of the prompt and per-candidate results. */
export class MatchResult {
  /** The prompt's block hashes (approximate mode); only [0, hashCount) is meaningful. */
  hashes: BigUint64Array;
  hashCount = 0;
  /** Number of candidates filled in matched/tiers. */
  candidates = 0;
  /** matched[i] = leading consecutive blocks held by candidate i. */
  matched: Uint32Array;
  /** tiers[3*i + t] = how many of candidate i's matched blocks sit in tier t. */
  tiers: Uint32Array;

  constructor(hashCapacity = 64, candidateCapacity = 16) {
    this.hashes = new BigUint64Array(hashCapacity);
    this.matched = new Uint32Array(candidateCapacity);
    this.tiers = new Uint32Array(candidateCapacity * 3);
  }

  /** @internal grows the arrays (never shrinks) so the next call needs no allocation. */
  reserve(hashes: number, candidates: number): void {
    if (this.hashes.length < hashes) {
      this.hashes = new BigUint64Array(Math.max(hashes, this.hashes.length * 2));
    }
    if (this.matched.length < candidates) {
      const n = Math.max(candidates, this.matched.length * 2);
      this.matched = new Uint32Array(n);
      this.tiers = new Uint32Array(n * 3);
    }
  }
}

function checkInt(name: string, v: unknown, min: number, max: number): number {
  if (typeof v !== 'number') throw new TypeError(`${name} must be a number, got ${typeof v}`);
  if (!Number.isInteger(v) || v < min || v > max) {
    throw new RangeError(`${name} must be an integer in [${min}, ${max}], got ${v}`);
  }
  return v;
}

function checkCapacity(name: string, cap: unknown): [number, number, number] {
  if (!Array.isArray(cap) || cap.length !== 3) {
    throw new TypeError(`${name} must be an array of three numbers [gpu, cpu, disk]`);
  }
  return [
    checkInt(`${name}[0]`, cap[0], 0, MAX_U32),
    checkInt(`${name}[1]`, cap[1], 0, MAX_U32),
    checkInt(`${name}[2]`, cap[2], 0, MAX_U32),
  ];
}

function checkHashes(hashes: unknown, count: unknown): number {
  if (!(hashes instanceof BigUint64Array)) throw new TypeError('hashes must be a BigUint64Array');
  if (count === undefined) return hashes.length;
  return checkInt('count', count, 0, hashes.length);
}

/** applyPayloads' status per item. */
export const APPLY_STATUS = { applied: 0, malformed: 1, droppedRank: 2, clear: 3 } as const;

/** applyPayloads' totals, by index. */
export const PAYLOAD_TOTALS = {
  stored: 0,
  removed: 1,
  orphans: 2,
  unknownRemovals: 3,
  forgotten: 4,
  events: 5,
  unknownEvents: 6,
  badEvents: 7,
  badHashes: 8,
  blockSizeMismatch: 9,
  droppedRanks: 10,
  malformed: 11,
  batches: 12,
} as const;
export const PAYLOAD_TOTALS_LENGTH = 13;

/**
 * Which endpoints hold which prefix blocks, in which KV tier.
 *
 * Tiers: 0 = accelerator memory, 1 = host memory, 2 = disk. When a tier is
 * over capacity its least-recently-used block moves to the next configured
 * tier (becoming the most recent there), and out of the index after the last.
 * record() refreshes recency and moves a block to the recorded tier (a hit
 * promotes a block back to tier 0). match*() is read-only.
 */
export class PrefixIndex {
  readonly blockSize: number;
  readonly maxEndpoints: number;
  readonly defaultCapacity: TierCapacity;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  readonly #h: any;
  readonly #statsOut = new Float64Array(6);

  constructor(opts: PrefixIndexOptions = {}) {
    if (opts === null || typeof opts !== 'object') throw new TypeError('PrefixIndex options must be an object');
    this.blockSize = checkInt('blockSize', opts.blockSize ?? DEFAULT_BLOCK_SIZE, 1, MAX_BLOCK_SIZE);
    this.maxEndpoints = checkInt('maxEndpoints', opts.maxEndpoints ?? DEFAULT_MAX_ENDPOINTS, 1, MAX_ENDPOINTS_LIMIT);
    const cap = checkCapacity('defaultCapacity', opts.defaultCapacity ?? DEFAULT_CAPACITY);
    this.defaultCapacity = Object.freeze(cap) as unknown as TierCapacity;
    this.#h = new native.PrefixIndex(this.blockSize, this.maxEndpoints, cap[0], cap[1], cap[2]);
  }

  /**
   * A chain seed from a model name (and optional cache salt): prompts for
   * different models or salts never share blocks.
   */
  static seedFor(model: string, salt: bigint = 0n): bigint {
    if (typeof model !== 'string') throw new TypeError('model must be a string');
    if (typeof salt !== 'bigint') throw new TypeError('salt must be a bigint');
    return native.prefixSeed(Buffer.from(model, 'utf8'), salt) as bigint;
  }

  /** Sets an endpoint's capacity per tier (creating the endpoint); shrinking demotes or evicts LRU blocks. */
  setCapacity(endpoint: number, capacity: TierCapacity): void {
    const cap = checkCapacity('capacity', capacity);
    this.#h.setCapacity(endpoint, cap[0], cap[1], cap[2]);
  }

  /** Number of full blocks a prompt of `bytes` bytes has. */
  blockCount(bytes: number): number {
    return Math.floor(bytes / this.blockSize);
  }

  /**
   * Hashes the full blocks of `prompt` chained from `seed` into `out`; returns
   * the count written. Throws RangeError if `out` is too small.
   */
  hashPrompt(prompt: Uint8Array, seed: bigint, out: BigUint64Array): number {
    return this.#h.hashPrompt(prompt, seed, out) as number;
  }

  /**
   * One call: hash the prompt and match the candidates. Fills result.hashes
   * (grown as needed) with the prompt's block hashes for a later record().
   */
  matchPrompt(prompt: Uint8Array, seed: bigint, candidates: Int32Array, result: MatchResult = new MatchResult()): MatchResult {
    if (!(prompt instanceof Uint8Array)) throw new TypeError('prompt must be a Uint8Array (or Buffer)');
    if (!(candidates instanceof Int32Array)) throw new TypeError('candidates must be an Int32Array');
    if (!(result instanceof MatchResult)) throw new TypeError('result must be a MatchResult');
    result.reserve(Math.floor(prompt.length / this.blockSize), candidates.length);
    result.hashCount = this.#h.matchPrompt(prompt, seed, result.hashes, candidates, result.matched, result.tiers);
    result.candidates = candidates.length;
    return result;
  }

  /** Precise mode: match externally supplied block hashes (e.g. from engine KV events). */
  matchHashes(hashes: BigUint64Array, count: number, candidates: Int32Array, result: MatchResult = new MatchResult()): MatchResult {
    const n = checkHashes(hashes, count);
    if (!(candidates instanceof Int32Array)) throw new TypeError('candidates must be an Int32Array');
    if (!(result instanceof MatchResult)) throw new TypeError('result must be a MatchResult');
    result.reserve(0, candidates.length);
    this.#h.matchHashes(hashes, n, candidates, result.matched, result.tiers);
    result.candidates = candidates.length;
    return result;
  }

  /** Records that `endpoint` holds these blocks in `tier` (default 0), refreshing recency. */
  record(endpoint: number, hashes: BigUint64Array, count?: number, tier: Tier = 0): void {
    this.#h.record(endpoint, hashes, checkHashes(hashes, count), tier);
  }

  /** Forgets these blocks on `endpoint` (engine BlockRemoved events). Unknown blocks are ignored. */
  remove(endpoint: number, hashes: BigUint64Array, count?: number): void {
    this.#h.remove(endpoint, hashes, checkHashes(hashes, count));
  }

  /** Forgets every block of `endpoint`, keeping its capacity (engine AllBlocksCleared). */
  clear(endpoint: number): void {
    this.#h.clear(endpoint);
  }

  /** Forgets the endpoint entirely: its blocks and its capacity. */
  removeEndpoint(endpoint: number): void {
    this.#h.removeEndpoint(endpoint);
  }

  /**
   * Precise mode's ingest: applies a batch of KV events in one native call (native/kv_events.h).
   * `ops` holds `nOps` records of 8 uint32 ([kind, endpoint, tier, blocks, flags, tokenOffset,
   * wordOffset, 0]; kind 1 stored, 2 removed, 3 cleared), `words` the 64-bit values as (hi, lo) uint32
   * pairs, `tokens` the stored blocks' token ids; `totals` (Float64Array(4)) gets [stored, removed,
   * orphans, unknown] added. Needs a blockSize that is a multiple of 4 (tokens are hashed as
   * little-endian uint32 bytes, as matchPrompt hashes a tokenized prompt).
   */
  applyEvents(ops: Uint32Array, nOps: number, words: Uint32Array, tokens: Uint32Array, totals: Float64Array): void {
    this.#h.applyEvents(ops, nOps, words, tokens, totals);
  }

  /**
   * Precise mode's ingest from raw payloads: decodes a whole drain of msgpack event batches and applies
   * them in one native call (native/kv_decode.h; the TS reference decoder is src/kv-events/decode.ts).
   * `items` holds `nItems` records of 8 uint32 ([kind, start, end, holder, rankOff, rankLen, seedHi,
   * seedLo]; kind 1: `data[start, end)` is one batch, kind 2: clear the holders); `ranks` maps a batch's
   * data-parallel rank r < rankLen to `ranks[rankOff + r]` (-1: no holder). `status[i]` gets item i's
   * outcome (APPLY_STATUS). `totals` (Float64Array(13), see PAYLOAD_TOTALS) is added to. Throws
   * RangeError (nothing applied) for an item that points outside `data` or `ranks` or at an endpoint
   * out of range; malformed payloads never throw.
   */
  applyPayloads(data: Uint8Array, items: Uint32Array, nItems: number, ranks: Int32Array, status: Uint8Array, totals: Float64Array): void {
    this.#h.applyPayloads(data, items, nItems, ranks, status, totals);
  }

  /**
   * Another router's prefix records (active-active replicas, the standby's follower: src/ha/deltas.ts) in
   * one native call: `ops` holds `nOps` triples [kind, endpoint, count] (kind 1 record, 2 remove, 3 clear;
   * endpoint -1 skips the op and its hashes); each op's `count` hashes follow the previous op's in
   * `hashes[0, nHashes)`. Throws RangeError (nothing applied) for an op out of range. Returns the ops applied.
   */
  applyOps(ops: Int32Array, nOps: number, hashes: BigUint64Array, nHashes: number): number {
    return this.#h.applyOps(ops, nOps, hashes, nHashes) as number;
  }

  /**
   * Engine block hashes remembered per endpoint for precise mode (default 1 048 576). Past it the least
   * recently stored-or-used hash is forgotten and its key removed from the index (counted in totals[4]).
   */
  setEventMapLimit(limit: number): void {
    this.#h.setEventMapLimit(checkInt('limit', limit, 1, MAX_U32));
  }

  /** Engine block hashes remembered for `endpoint` (precise mode's engine hash → key map). */
  mappedBlocks(endpoint: number): number {
    return this.#h.mappedBlocks(endpoint) as number;
  }

  stats(): PrefixIndexStats {
    const o = this.#statsOut;
    this.#h.stats(o);
    return { entries: [o[0]!, o[1]!, o[2]!], blocks: o[3]!, bytes: o[4]!, endpoints: o[5]! };
  }
}
