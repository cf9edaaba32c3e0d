// The prefix-cache state behind a small interface, so where it lives (this
// process's native index today; shared memory or a remote store later) does
// not touch the scorer. The native implementation hashes and matches in one
// call per request and records the picked endpoint without rehashing.
import { MatchResult, PrefixIndex } from '../../bindings/index.js';

export interface PrefixMatch {
  /** Full blocks hashed from the prompt. */
  hashCount: number;
  /** Per candidate (same order as the ids passed): leading blocks that endpoint holds. */
  matched: Uint32Array;
  /** Per candidate, how many of those sit in each tier: tiers[3i + t] (absent: the store does not know). */
  tiers?: Uint32Array;
}

/**
 * Sees every change the router makes to a store, synchronously (the hot
 * standby's delta publisher, src/ha/): it copies what it needs at once, since
 * `hashes` is reused by the next request.
 */
export interface PrefixObserver {
  recorded(endpointId: number, hashes: BigUint64Array, count: number): void;
  removed(endpointId: number, hashes: BigUint64Array, count: number): void;
  cleared(endpointId: number): void;
}

export interface PrefixStore {
  readonly blockSize: number;
  /** Hashes `prompt` (blocks of `blockSize` bytes, chained from `seed`) and matches it against ids[0..n). */
  match(prompt: Uint8Array, seed: bigint, ids: Int32Array): PrefixMatch;
  /** Records the last match's blocks as held by `endpointId`. */
  recordLast(endpointId: number): void;
  /** Removes `prompt`'s blocks from `fromBlock` on from what `endpointId` is believed to hold (a failed dispatch). */
  forget(endpointId: number, prompt: Uint8Array, seed: bigint, fromBlock: number): void;
  setCapacity(endpointId: number, gpuBlocks: number, cpuBlocks: number, diskBlocks: number): void;
  clear(endpointId: number): void;
  /** Sets (null: removes) the one observer of changes; a store that cannot be replicated leaves this out. */
  observe?(o: PrefixObserver | null): void;
  /** Applies block hashes recorded elsewhere (a standby following its active's deltas). */
  applyRecord?(endpointId: number, hashes: BigUint64Array, count: number): void;
  /** Applies block hashes removed elsewhere. */
  applyRemove?(endpointId: number, hashes: BigUint64Array, count: number): void;
  /**
   * Applies a batch of changes made elsewhere in one call (active-active replicas, the standby's follower):
   * `ops` holds `nOps` triples [kind (1 record, 2 remove, 3 clear), endpoint id (-1: skip), count], their
   * hashes in order in `hashes[0, nHashes)`. Returns the ops applied. Throws RangeError (nothing applied).
   */
  applyOps?(ops: Int32Array, nOps: number, hashes: BigUint64Array, nHashes: number): number;
}

/** The native (C++) prefix index in approximate mode: the router's own record of what it sent where. */
export class NativePrefixStore implements PrefixStore {
  readonly blockSize: number;
  readonly #idx: PrefixIndex;
  readonly #result = new MatchResult(256, 16);
  readonly #view: PrefixMatch = { hashCount: 0, matched: new Uint32Array(0) };
  #observer: PrefixObserver | null = null;

  constructor(blockSize: number, maxEndpoints: number) {
    this.blockSize = blockSize;
    this.#idx = new PrefixIndex({ blockSize, maxEndpoints: Math.max(1, maxEndpoints) });
  }

  match(prompt: Uint8Array, seed: bigint, ids: Int32Array): PrefixMatch {
    const r = this.#idx.matchPrompt(prompt, seed, ids, this.#result);
    this.#view.hashCount = r.hashCount;
    this.#view.matched = r.matched;
    this.#view.tiers = r.tiers;
    return this.#view;
  }

  recordLast(endpointId: number): void {
    const r = this.#result;
    if (r.hashCount > 0) {
      this.#idx.record(endpointId, r.hashes, r.hashCount);
      this.#observer?.recorded(endpointId, r.hashes, r.hashCount);
    }
  }

  forget(endpointId: number, prompt: Uint8Array, seed: bigint, fromBlock: number): void {
    const need = Math.floor(prompt.length / this.blockSize);
    if (need <= fromBlock) return;
    // cold path (failures only): a scratch array sized to the prompt
    const hashes = new BigUint64Array(need);
    const n = this.#idx.hashPrompt(prompt, seed, hashes);
    if (n > fromBlock) {
      const gone = hashes.subarray(fromBlock, n);
      this.#idx.remove(endpointId, gone);
      this.#observer?.removed(endpointId, gone, gone.length);
    }
  }

  setCapacity(endpointId: number, gpuBlocks: number, cpuBlocks: number, diskBlocks: number): void {
    this.#idx.setCapacity(endpointId, [gpuBlocks, cpuBlocks, diskBlocks]);
  }

  clear(endpointId: number): void {
    this.#idx.clear(endpointId);
    this.#observer?.cleared(endpointId);
  }

  observe(o: PrefixObserver | null): void {
    this.#observer = o;
  }

  applyRecord(endpointId: number, hashes: BigUint64Array, count: number): void {
    if (count > 0) this.#idx.record(endpointId, hashes, count);
  }

  applyRemove(endpointId: number, hashes: BigUint64Array, count: number): void {
    if (count > 0) this.#idx.remove(endpointId, hashes, count);
  }

  applyOps(ops: Int32Array, nOps: number, hashes: BigUint64Array, nHashes: number): number {
    return this.#idx.applyOps(ops, nOps, hashes, nHashes);
  }
}
