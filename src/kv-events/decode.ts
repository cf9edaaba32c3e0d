// The TS reference decoder of engine KV-event batches (msgpack, vLLM's schema: see
// shared/reference/PROTOCOLS.md and docs/kv-events.md) and flattens them into
// the typed arrays PrefixIndex.applyEvents takes, so a whole drain of batches
// crosses into native code once. Both event layouts (arrays with the tag
// first, maps with "type"), hashes as integers (uint64 or int64) or as digest
// bytes (the last 8 bytes, big-endian). Anything malformed is counted and
// skipped; a payload that is not a batch at all throws KvDecodeError.
//
// The feed decodes natively (PrefixIndex.applyPayloads, native/kv_decode.h);
// this msgpackr path is the reference the native decoder is tested against
// (test/native-kv-decode.property.test.ts) and the ingest benchmark's baseline.
import { Unpackr } from 'msgpackr';
import { SwitchyardError } from '../errors.js';

export class KvDecodeError extends SwitchyardError {
  override readonly code = 'SWY_ERR_KV_EVENT_DECODE';
  constructor(message: string) {
    super(message);
    this.name = 'KvDecodeError';
  }
}

/** What a decode found besides the blocks it queued. */
export interface DecodeCounts {
  /** Events of a type this router does not know (skipped). */
  unknownEvents: number;
  /** Events with a missing or mistyped field, a hash of the wrong width, token ids that do not fill the blocks (skipped). */
  badEvents: number;
  /** BlockStored events whose block_size differs from the configured engine block size (skipped). */
  blockSizeMismatch: number;
}

const OP_WORDS = 8;
const OP_STORED = 1;
const OP_REMOVED = 2;
const OP_CLEARED = 3;

// msgpackr: plain objects for maps, no record extension; integers beyond 2^53 arrive as bigint
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'auto' } as unknown as ConstructorParameters<typeof Unpackr>[0]);

/** The tier of a `medium` value: absent or GPU → 0, CPU → 1, anything else (disk, remote stores) → 2. */
export function tierOf(medium: unknown): number {
  if (medium === undefined || medium === null) return 0;
  if (typeof medium !== 'string') return -1;
  const m = medium.toUpperCase();
  if (m === 'GPU' || m === 'HBM' || m === 'DEVICE') return 0;
  if (m === 'CPU' || m === 'HOST' || m === 'CPU_TIER1') return 1;
  return 2;
}

/**
 * Growable flat buffers of decoded events for one applyEvents call. `holder`
 * maps a batch's data-parallel rank to the index's endpoint id (-1: not
 * routed to, events dropped); `seed` gives the chain seed (hi, lo) of a LoRA
 * adapter name or of the base model (null).
 */
export class EventBatchEncoder {
  ops = new Uint32Array(OP_WORDS * 256);
  words = new Uint32Array(4096);
  tokens = new Uint32Array(65536);
  nOps = 0;
  #nWords = 0;
  #nTokens = 0;
  /** Blocks queued since the last reset (stored + removed). */
  blocks = 0;
  readonly #blockSize: number;
  #hi = 0;
  #lo = 0;

  constructor(blockSize: number) {
    this.#blockSize = blockSize;
  }

  reset(): void {
    this.nOps = 0;
    this.#nWords = 0;
    this.#nTokens = 0;
    this.blocks = 0;
  }

  /** Queues a clear of `holder` (a gap that could not be replayed, a restarted publisher, an overflow). */
  clear(holder: number): void {
    const o = this.#op();
    this.ops[o] = OP_CLEARED;
    this.ops[o + 1] = holder;
  }

  /**
   * Decodes one payload and queues its events. Returns the batch's data-parallel rank (null if none).
   * Throws KvDecodeError when the payload is not a batch.
   */
  add(payload: Uint8Array, holder: (rank: number | null) => number, seed: (lora: string | null) => readonly [number, number], counts: DecodeCounts): number | null {
    let batch: unknown;
    try {
      batch = unpackr.unpack(payload);
    } catch (err) {
      throw new KvDecodeError(`malformed msgpack: ${(err as Error).message}`);
    }
    if (!Array.isArray(batch) || batch.length < 2 || typeof batch[0] !== 'number' || !Array.isArray(batch[1])) {
      throw new KvDecodeError('not an event batch [ts, events, data_parallel_rank]');
    }
    const dp = batch[2];
    const rank = typeof dp === 'number' && Number.isInteger(dp) && dp >= 0 ? dp : null;
    if (dp !== undefined && dp !== null && rank === null) throw new KvDecodeError('data_parallel_rank must be an integer >= 0 or null');
    const ep = holder(rank);
    const events = batch[1] as unknown[];
    for (let i = 0; i < events.length; i++) {
      const e = events[i];
      if (Array.isArray(e)) this.#arrayEvent(e, ep, seed, counts);
      else if (typeof e === 'object' && e !== null) this.#mapEvent(e as Record<string, unknown>, ep, seed, counts);
      else counts.badEvents++;
    }
    return rank;
  }

  #arrayEvent(e: unknown[], ep: number, seed: (lora: string | null) => readonly [number, number], counts: DecodeCounts): void {
    const tag = e[0];
    if (tag === 'BlockStored') this.#stored(e[1], e[2], e[3], e[4], e[5], e[6], e[7], ep, seed, counts);
    else if (tag === 'BlockRemoved') this.#removed(e[1], e[2], ep, counts);
    else if (tag === 'AllBlocksCleared') {
      if (ep >= 0) this.clear(ep);
    } else counts.unknownEvents++;
  }

  #mapEvent(e: Record<string, unknown>, ep: number, seed: (lora: string | null) => readonly [number, number], counts: DecodeCounts): void {
    const tag = e.type;
    if (tag === 'BlockStored') this.#stored(e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, e.lora_id, e.medium, e.lora_name, ep, seed, counts);
    else if (tag === 'BlockRemoved') this.#removed(e.block_hashes, e.medium, ep, counts);
    else if (tag === 'AllBlocksCleared') {
      if (ep >= 0) this.clear(ep);
    } else counts.unknownEvents++;
  }

  #stored(
    hashes: unknown,
    parent: unknown,
    tokenIds: unknown,
    blockSize: unknown,
    _loraId: unknown,
    medium: unknown,
    loraName: unknown,
    ep: number,
    seed: (lora: string | null) => readonly [number, number],
    counts: DecodeCounts,
  ): void {
    if (!Array.isArray(hashes) || !Array.isArray(tokenIds) || typeof blockSize !== 'number' || !Number.isInteger(blockSize) || blockSize < 1) {
      counts.badEvents++;
      return;
    }
    const tier = tierOf(medium);
    const n = hashes.length;
    if (tier < 0 || tokenIds.length !== n * blockSize || (loraName !== undefined && loraName !== null && typeof loraName !== 'string')) {
      counts.badEvents++;
      return;
    }
    if (blockSize !== this.#blockSize) {
      counts.blockSizeMismatch++;
      return;
    }
    if (ep < 0 || n === 0) return;
    const hasParent = parent !== undefined && parent !== null;
    const w0 = this.#nWords;
    this.#reserveWords(4 + 2 * n);
    const words = this.words;
    const [sh, sl] = seed(typeof loraName === 'string' && loraName !== '' ? loraName : null);
    words[w0] = sh;
    words[w0 + 1] = sl;
    if (hasParent) {
      if (!this.#split(parent)) {
        counts.badEvents++;
        return;
      }
      words[w0 + 2] = this.#hi;
      words[w0 + 3] = this.#lo;
    } else words[w0 + 2] = words[w0 + 3] = 0;
    for (let i = 0; i < n; i++) {
      if (!this.#split(hashes[i])) {
        counts.badEvents++;
        return;
      }
      words[w0 + 4 + 2 * i] = this.#hi;
      words[w0 + 5 + 2 * i] = this.#lo;
    }
    const t0 = this.#nTokens;
    const nt = tokenIds.length;
    this.#reserveTokens(nt);
    const toks = this.tokens;
    for (let i = 0; i < nt; i++) {
      const t = tokenIds[i];
      if (typeof t !== 'number' || !(t >= 0 && t <= 0xffffffff) || !Number.isInteger(t)) {
        counts.badEvents++;
        return;
      }
      toks[t0 + i] = t;
    }
    this.#nWords = w0 + 4 + 2 * n;
    this.#nTokens = t0 + nt;
    const o = this.#op();
    const ops = this.ops;
    ops[o] = OP_STORED;
    ops[o + 1] = ep;
    ops[o + 2] = tier;
    ops[o + 3] = n;
    ops[o + 4] = hasParent ? 1 : 0;
    ops[o + 5] = t0;
    ops[o + 6] = w0;
    this.blocks += n;
  }

  #removed(hashes: unknown, medium: unknown, ep: number, counts: DecodeCounts): void {
    const tier = tierOf(medium);
    if (!Array.isArray(hashes) || tier < 0) {
      counts.badEvents++;
      return;
    }
    if (ep < 0 || hashes.length === 0) return;
    const n = hashes.length;
    const w0 = this.#nWords;
    this.#reserveWords(2 * n);
    const words = this.words;
    for (let i = 0; i < n; i++) {
      if (!this.#split(hashes[i])) {
        counts.badEvents++;
        return;
      }
      words[w0 + 2 * i] = this.#hi;
      words[w0 + 2 * i + 1] = this.#lo;
    }
    this.#nWords = w0 + 2 * n;
    const o = this.#op();
    const ops = this.ops;
    ops[o] = OP_REMOVED;
    ops[o + 1] = ep;
    ops[o + 2] = tier;
    ops[o + 3] = n;
    ops[o + 6] = w0;
    this.blocks += n;
  }

  /** A block hash as (hi, lo) in #hi/#lo; false for anything that is not a 64-bit hash. */
  #split(h: unknown): boolean {
    if (typeof h === 'number') {
      // msgpackr gives a number for an int in [-2^53, 2^53] (a bigint beyond): every int keeps its 64 bits
      if (!Number.isInteger(h) || Math.abs(h) > 2 ** 53) return false;
      if (h >= 0) {
        this.#hi = Math.floor(h / 0x100000000);
        this.#lo = h >>> 0;
        return true;
      }
      // int64 two's complement
      const u = BigInt.asUintN(64, BigInt(h));
      this.#hi = Number(u >> 32n);
      this.#lo = Number(u & 0xffffffffn);
      return true;
    }
    if (typeof h === 'bigint') {
      if (h < -(1n << 63n) || h >= 1n << 64n) return false;
      const u = BigInt.asUintN(64, h);
      this.#hi = Number(u >> 32n);
      this.#lo = Number(u & 0xffffffffn);
      return true;
    }
    if (h instanceof Uint8Array) {
      const n = h.length;
      if (n < 8) return false;
      this.#hi = ((h[n - 8]! << 24) | (h[n - 7]! << 16) | (h[n - 6]! << 8) | h[n - 5]!) >>> 0;
      this.#lo = ((h[n - 4]! << 24) | (h[n - 3]! << 16) | (h[n - 2]! << 8) | h[n - 1]!) >>> 0;
      return true;
    }
    return false;
  }

  #op(): number {
    if ((this.nOps + 1) * OP_WORDS > this.ops.length) {
      const next = new Uint32Array(this.ops.length * 2);
      next.set(this.ops);
      this.ops = next;
    }
    const o = this.nOps++ * OP_WORDS;
    this.ops.fill(0, o, o + OP_WORDS);
    return o;
  }

  #reserveWords(n: number): void {
    if (this.#nWords + n <= this.words.length) return;
    const next = new Uint32Array(Math.max(this.#nWords + n, this.words.length * 2));
    next.set(this.words.subarray(0, this.#nWords));
    this.words = next;
  }

  #reserveTokens(n: number): void {
    if (this.#nTokens + n <= this.tokens.length) return;
    const next = new Uint32Array(Math.max(this.#nTokens + n, this.tokens.length * 2));
    next.set(this.tokens.subarray(0, this.#nTokens));
    this.tokens = next;
  }
}
