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
}

/** The native (C++) prefix index in approximate mode: the router's own record of what it sent where. */
export class NativePrefixStore implements PrefixStore {
  readonly blockSize: number;
  readonly #idx: PrefixIndex;
  readonly #result = new MatchResult(256, 16);
  readonly #view: PrefixMatch = { hashCount: 0, matched: new Uint32Array(0) };

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
    if (r.hashCount > 0) this.#idx.record(endpointId, r.hashes, r.hashCount);
  }

  forget(endpointId: number, prompt: Uint8Array, seed: bigint, fromBlock: number): void {
    const need = Math.floor(prompt.length / this.blockSize);
    if (need <= fromBlock) return;
    // cold path (failures only): a scratch array sized to the prompt
    const hashes = new BigUint64Array(need);
    const n = this.#idx.hashPrompt(prompt, seed, hashes);
    if (n > fromBlock) this.#idx.remove(endpointId, hashes.subarray(fromBlock, n));
  }

  setCapacity(endpointId: number, gpuBlocks: number, cpuBlocks: number, diskBlocks: number): void {
    this.#idx.setCapacity(endpointId, [gpuBlocks, cpuBlocks, diskBlocks]);
  }

  clear(endpointId: number): void {
    this.#idx.clear(endpointId);
  }
}
