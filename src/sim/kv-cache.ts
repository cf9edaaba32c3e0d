// The simulated engine's KV cache with automatic prefix caching.
//
// A prompt's full blocks (blockSize tokens each; a token is 4 bytes of the
// rendered prompt, see tokenizer.ts) are hashed in a chain: the hash of block k
// covers block k's bytes and the hash of block k-1, so equal hashes mean equal
// prefixes. Blocks live in a map keyed by that hash. A block used by a running
// request is pinned (reference count > 0); when its last user finishes it goes
// to the tail of an LRU list, where it still serves prefix hits until it is
// evicted to make room. Occupied = cached blocks + private blocks (the partial
// last prompt block and the blocks of generated tokens, reserved up front so a
// running request is never preempted). Usage reported to metrics counts only
// blocks held by running requests, like vLLM (cached idle blocks are free).

// With a host-memory tier (--cpu-offload-blocks, kv-offload.ts) an evicted
// block moves there instead of vanishing, and a later prompt that needs it
// loads it back (a hit, at a per-block reload cost instead of recompute). With
// KV events on (kv-events.ts) every store, removal and offload is reported.
import type { KvEventSink } from './kv-events.js';
import { HostTier } from './kv-offload.js';
import { BYTES_PER_TOKEN } from './tokenizer.js';

export interface KvBlock {
  hash: number;
  refs: number;
  prev: KvBlock | null;
  next: KvBlock | null;
  /** With events or a host tier: the parent block's hash and this block's token ids. */
  parent: number | null;
  tokens: Uint32Array | null;
  loraId: number | null;
  loraName: string | null;
  /** Forgotten by a restart while a request held it: freed when released, never cached again. */
  doomed: boolean;
}

/** What a request holds while it runs. */
export interface KvLease {
  blocks: KvBlock[];
  privateBlocks: number;
  cachedTokens: number;
  /** Of the hit blocks, how many were loaded back from the host tier. */
  hostBlocks: number;
}

/** Per-request facts the events need: the prompt's token ids (blockSize per block) and its LoRA adapter. */
export interface KvBlockMeta {
  tokens: Uint32Array;
  loraId: number | null;
  loraName: string | null;
}

const HASH_SCALE = 2 ** 21;

/**
 * The chain hash: per full block of `blockLen` values of `src[0, len)`, two
 * 32-bit lanes seeded with (h1, h2) and carried from block to block, folded
 * into a 53-bit integer in `out`. Returns the number of full blocks.
 */
function chainHash(src: ArrayLike<number>, len: number, blockLen: number, h1: number, h2: number, out: number[]): number {
  const n = Math.floor(len / blockLen);
  for (let b = 0; b < n; b++) {
    const end = (b + 1) * blockLen;
    for (let i = b * blockLen; i < end; i++) {
      const c = src[i]! | 0;
      h1 = Math.imul(h1 ^ c, 0x01000193);
      h2 = Math.imul(h2 ^ c, 0x5bd1e995);
      h2 ^= h2 >>> 15;
    }
    h1 = Math.imul(h1 ^ (h1 >>> 16), 0x85ebca6b);
    h2 = Math.imul(h2 ^ (h2 >>> 13), 0xc2b2ae35);
    out[b] = (h1 >>> 0) * HASH_SCALE + ((h2 >>> 0) & (HASH_SCALE - 1));
  }
  out.length = n;
  return n;
}

/**
 * Chain-hashes the full blocks of `bytes[0, len)` into `out` (53-bit integers),
 * returns the number of full blocks. `blockBytes` = blockSize × 4.
 */
export function hashByteBlocks(bytes: Uint8Array, len: number, blockBytes: number, out: number[]): number {
  return chainHash(bytes, len, blockBytes, 0x811c9dc5, 0x2545f491, out);
}

/** Same chain hash over token ids (a prompt given as integers), blockSize ids per block; its own seeds, so
 * a token-id prompt never shares blocks with a text prompt. */
export function hashTokenBlocks(ids: ArrayLike<number>, blockSize: number, out: number[]): number {
  return chainHash(ids, ids.length, blockSize, 0x6a09e667, 0x3c6ef372, out);
}

export const BLOCK_BYTES_PER_TOKEN = BYTES_PER_TOKEN;

export class KvCache {
  readonly capacity: number;
  readonly blockSize: number;
  readonly #map = new Map<number, KvBlock>();
  // LRU of idle cached blocks: head = next to evict.
  #head: KvBlock | null = null;
  #tail: KvBlock | null = null;
  #idle = 0;
  #private = 0;
  #pinned = 0;
  /** Pinned blocks a restart forgot: still allocated to their requests, no longer cached. */
  #doomed = 0;
  evictions = 0;
  readonly host: HostTier | null;
  #events: KvEventSink | null;
  /** GPU blocks evicted during the current operation (reported once it ends). */
  readonly #evicted: number[] = [];

  constructor(capacity: number, blockSize: number, hostBlocks = 0, events: KvEventSink | null = null) {
    this.capacity = capacity;
    this.blockSize = blockSize;
    this.#events = events;
    this.host = hostBlocks > 0 ? new HostTier(hostBlocks, events) : null;
  }

  /** Where KV events go (null: nowhere). */
  setEvents(events: KvEventSink | null): void {
    this.#events = events;
    this.host?.setEvents(events);
  }

  /** Blocks held by running requests (pinned cached + private). */
  get usedBlocks(): number {
    return this.#pinned + this.#private;
  }
  /** Cached blocks (pinned or idle). */
  get cachedBlocks(): number {
    return this.#map.size;
  }
  get idleBlocks(): number {
    return this.#idle;
  }
  /** Used / capacity, in [0,1]. */
  get usage(): number {
    return this.usedBlocks / this.capacity;
  }

  has(hash: number): boolean {
    return this.#map.has(hash);
  }

  /**
   * Number of leading blocks of `hashes` present in the cache (the prefix a new
   * request would reuse), not counting the limit on hits.
   */
  matchPrefix(hashes: readonly number[], n: number): number {
    let k = 0;
    const host = this.host;
    while (k < n && (this.#map.has(hashes[k]!) || (host !== null && host.has(hashes[k]!)))) k++;
    return k;
  }

  /** Whether a request needing these blocks plus `privateBlocks` can be admitted now. */
  canAdmit(hashes: readonly number[], n: number, privateBlocks: number): boolean {
    let missing = 0;
    let idleHits = 0;
    for (let i = 0; i < n; i++) {
      const b = this.#map.get(hashes[i]!);
      if (b === undefined) missing++;
      else if (b.refs === 0) idleHits++;
    }
    const free = this.capacity - this.#map.size - this.#doomed - this.#private;
    return missing + privateBlocks <= free + (this.#idle - idleHits);
  }

  /**
   * Pins the prompt's blocks (reusing cached ones, allocating the rest and
   * evicting idle blocks as needed) and reserves `privateBlocks`. The caller
   * checks canAdmit first. `maxHitBlocks` caps the reported hit (the engine
   * always computes at least the prompt's last token).
   */
  acquire(hashes: readonly number[], n: number, privateBlocks: number, maxHitBlocks: number, meta: KvBlockMeta | null = null): KvLease {
    const blocks = new Array<KvBlock>(n);
    let hit = 0;
    let hostHit = 0;
    let contiguous = true;
    const host = this.host;
    // Pin the cached ones first so eviction below cannot take them.
    for (let i = 0; i < n; i++) {
      const b = this.#map.get(hashes[i]!);
      if (b === undefined) {
        if (contiguous && host !== null && host.has(hashes[i]!)) {
          hit++;
          hostHit++;
        } else contiguous = false;
        continue;
      }
      if (contiguous) hit++;
      this.#pin(b);
      blocks[i] = b;
    }
    const events = this.#events;
    let runStart = -1;
    for (let i = 0; i < n; i++) {
      if (blocks[i] !== undefined) {
        if (runStart >= 0) this.#storedRun(blocks, runStart, i);
        runStart = -1;
        continue;
      }
      this.#makeRoom(1);
      const b: KvBlock = { hash: hashes[i]!, refs: 1, prev: null, next: null, parent: null, tokens: null, loraId: null, loraName: null, doomed: false };
      if (meta !== null) {
        b.parent = i > 0 ? hashes[i - 1]! : null;
        b.tokens = meta.tokens.subarray(i * this.blockSize, (i + 1) * this.blockSize);
        b.loraId = meta.loraId;
        b.loraName = meta.loraName;
      }
      this.#map.set(b.hash, b);
      this.#pinned++;
      blocks[i] = b;
      if (runStart < 0) runStart = i;
    }
    if (runStart >= 0) this.#storedRun(blocks, runStart, n);
    this.#makeRoom(privateBlocks);
    this.#private += privateBlocks;
    if (events !== null) this.#flushEvicted();
    if (hit > maxHitBlocks) {
      hostHit = Math.max(0, hostHit - (hit - maxHitBlocks));
      hit = maxHitBlocks;
    }
    return { blocks, privateBlocks, cachedTokens: hit * this.blockSize, hostBlocks: hostHit };
  }

  /** BlockStored (GPU) for the newly allocated blocks [from, to) of a prompt: one event per run. */
  #storedRun(blocks: KvBlock[], from: number, to: number): void {
    const events = this.#events;
    const first = blocks[from]!;
    if (events === null || first.tokens === null) return;
    const hashes = new Array<number>(to - from);
    for (let i = from; i < to; i++) hashes[i - from] = blocks[i]!.hash;
    const bs = this.blockSize;
    const base = first.tokens;
    // the run's tokens are contiguous in the prompt's token array
    const tokens = new Uint32Array(base.buffer, base.byteOffset, (to - from) * bs);
    events.stored(hashes, first.parent, tokens, first.loraId, first.loraName, 'GPU');
  }

  #flushEvicted(): void {
    this.host?.flush();
    if (this.#evicted.length > 0) {
      this.#events!.removed(this.#evicted, 'GPU');
      this.#evicted.length = 0;
    }
  }

  /** Unpins a request's blocks; the last block goes idle first so chains lose their tails first. */
  release(lease: KvLease): void {
    const blocks = lease.blocks;
    for (let i = blocks.length - 1; i >= 0; i--) {
      const b = blocks[i]!;
      if (--b.refs === 0) {
        this.#pinned--;
        if (b.doomed) this.#doomed--;
        else this.#pushIdle(b);
      }
    }
    this.#private -= lease.privateBlocks;
    lease.blocks = EMPTY;
    lease.privateBlocks = 0;
  }

  /** Drops every idle cached block (pinned ones stay). */
  clear(): void {
    const host = this.host;
    // a cleared cache keeps nothing in host memory either
    while (this.#head !== null) this.#drop(this.#head);
    host?.clear();
    if (this.#events !== null) this.#flushEvicted();
  }

  /**
   * An engine restart: every cached block is forgotten, idle or held by a running request (those stay
   * allocated until released, then are freed, not cached), and the host tier is emptied. The removals
   * are queued as events like clear()'s; the caller restarts the publisher, which discards them.
   */
  forgetAll(): void {
    this.clear();
    for (const b of this.#map.values()) {
      // only pinned blocks are left
      b.doomed = true;
      this.#doomed++;
    }
    this.#map.clear();
  }

  #drop(b: KvBlock): void {
    this.#unlinkIdle(b);
    this.#map.delete(b.hash);
    this.evictions++;
    if (this.#events !== null) this.#evicted.push(b.hash);
  }

  #pin(b: KvBlock): void {
    if (b.refs++ === 0) {
      this.#unlinkIdle(b);
      this.#pinned++;
    }
  }

  #makeRoom(n: number): void {
    while (this.#map.size + this.#doomed + this.#private + n > this.capacity && this.#head !== null) this.#evictHead();
  }

  #evictHead(): void {
    const b = this.#head!;
    this.#drop(b);
    // offload: the block's KV is copied to host memory before its GPU block is reused
    if (this.host !== null) this.host.put(b);
  }

  #pushIdle(b: KvBlock): void {
    b.prev = this.#tail;
    b.next = null;
    if (this.#tail !== null) this.#tail.next = b;
    else this.#head = b;
    this.#tail = b;
    this.#idle++;
  }

  #unlinkIdle(b: KvBlock): void {
    if (b.prev !== null) b.prev.next = b.next;
    else this.#head = b.next;
    if (b.next !== null) b.next.prev = b.prev;
    else this.#tail = b.prev;
    b.prev = b.next = null;
    this.#idle--;
  }
}

const EMPTY: KvBlock[] = [];
