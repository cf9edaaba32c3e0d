// Plain TypeScript reference model of the native prefix index: the same
// semantics written as simply as possible (Maps in insertion order as LRU
// lists, BigInt arithmetic for the hash). Property tests drive this and the
// native index with the same random operations and compare every answer.
// Semantics: docs/prefix-index.md.

const M64 = (1n << 64n) - 1n;
const P0 = 0xa0761d6478bd642fn;
const P1 = 0xe7037ed1a0b428dbn;
const P2 = 0x8ebc6af09c88c6e3n;
const P3 = 0x589965cc75374cc3n;

function fold(a: bigint, b: bigint): bigint {
  const r = a * b;
  return (r & M64) ^ (r >> 64n);
}

function load64(p: Uint8Array, i: number): bigint {
  let v = 0n;
  for (let k = 7; k >= 0; k--) v = (v << 8n) | BigInt(p[i + k]!);
  return v;
}

/** The two lanes of a block's bytes (native/prefix_hash.h LanesOf). */
export function lanesOf(p: Uint8Array): [bigint, bigint] {
  const n = p.length;
  let a = P0;
  let b = P1;
  let i = 0;
  for (; n - i >= 32; i += 32) {
    a = fold(load64(p, i) ^ P1, load64(p, i + 8) ^ a);
    b = fold(load64(p, i + 16) ^ P2, load64(p, i + 24) ^ b);
  }
  if (n - i >= 16) {
    a = fold(load64(p, i) ^ P1, load64(p, i + 8) ^ a);
    i += 16;
  }
  if (n - i > 0) {
    const tail = new Uint8Array(16);
    tail.set(p.subarray(i));
    b = fold(load64(tail, 0) ^ P2, load64(tail, 8) ^ b);
  }
  return [a, b];
}

/** One link of the chain for the seed: Fold(parent ^ a, b ^ P3). */
export function link(parent: bigint, [a, b]: [bigint, bigint]): bigint {
  return fold(parent ^ a, b ^ P3);
}

/** A block's hash from its parent's (native/prefix_hash.h BlockHash): lanes of all but the last 16 bytes,
 * then one fold that takes the parent and the last 16 bytes (zero-padded when the block is shorter). */
export function blockHash(parent: bigint, block: Uint8Array): bigint {
  const body = Math.max(0, block.length - 16);
  const [a, b] = lanesOf(block.subarray(0, body));
  const last = new Uint8Array(16);
  last.set(block.subarray(body));
  return fold(parent ^ a ^ load64(last, 0), b ^ load64(last, 8) ^ P3);
}

export function hashPromptModel(prompt: Uint8Array, blockSize: number, seed: bigint): bigint[] {
  const out: bigint[] = [];
  let h = seed;
  for (let b = 0; b + blockSize <= prompt.length; b += blockSize) {
    h = blockHash(h, prompt.subarray(b, b + blockSize));
    out.push(h);
  }
  return out;
}

export function seedModel(model: string, salt = 0n): bigint {
  const bytes = new TextEncoder().encode(model);
  return fold(link(salt, lanesOf(bytes)) ^ P1, BigInt(bytes.length) ^ P2);
}

type Cap = [number, number, number];

interface EndpointModel {
  cap: Cap;
  /** Per tier: key -> true, in recency order (first = least recently used). */
  tiers: [Map<bigint, true>, Map<bigint, true>, Map<bigint, true>];
}

export interface ModelMatch {
  matched: number[];
  tiers: number[];
}

export class PrefixIndexModel {
  readonly eps = new Map<number, EndpointModel>();

  constructor(
    readonly maxEndpoints = 1024,
    readonly defaultCapacity: Cap = [16384, 0, 0],
  ) {}

  #ensure(ep: number): EndpointModel {
    let e = this.eps.get(ep);
    if (!e) {
      e = { cap: [...this.defaultCapacity], tiers: [new Map(), new Map(), new Map()] };
      this.eps.set(ep, e);
    }
    return e;
  }

  #tierOf(e: EndpointModel, key: bigint): number {
    for (let t = 0; t < 3; t++) if (e.tiers[t]!.has(key)) return t;
    return -1;
  }

  /** First tier >= t with a non-zero capacity, or -1. */
  #tierAtOrBelow(e: EndpointModel, t: number): number {
    for (; t < 3; t++) if (e.cap[t]! > 0) return t;
    return -1;
  }

  #enforce(e: EndpointModel, t: number): void {
    const tier = e.tiers[t]!;
    while (tier.size > e.cap[t]!) {
      const lru = tier.keys().next().value as bigint;
      tier.delete(lru);
      const down = this.#tierAtOrBelow(e, t + 1);
      if (down < 0) continue;
      e.tiers[down]!.set(lru, true);
      this.#enforce(e, down);
    }
  }

  setCapacity(ep: number, cap: Cap): void {
    const e = this.#ensure(ep);
    e.cap = [...cap];
    for (let t = 0; t < 3; t++) this.#enforce(e, t);
  }

  record(ep: number, keys: readonly bigint[], tier = 0): void {
    const e = this.#ensure(ep);
    for (let i = keys.length - 1; i >= 0; i--) {
      const key = keys[i]!;
      const target = this.#tierAtOrBelow(e, tier);
      const cur = this.#tierOf(e, key);
      if (cur >= 0) e.tiers[cur]!.delete(key);
      if (target < 0) continue;
      e.tiers[target]!.set(key, true);
      this.#enforce(e, target);
    }
  }

  remove(ep: number, keys: readonly bigint[]): void {
    const e = this.eps.get(ep);
    if (!e) return;
    for (const key of keys) for (const tier of e.tiers) tier.delete(key);
  }

  clear(ep: number): void {
    const e = this.eps.get(ep);
    if (e) for (const tier of e.tiers) tier.clear();
  }

  removeEndpoint(ep: number): void {
    this.eps.delete(ep);
  }

  match(keys: readonly bigint[], candidates: readonly number[]): ModelMatch {
    const matched: number[] = [];
    const tiers: number[] = [];
    for (const c of candidates) {
      const e = this.eps.get(c);
      const per = [0, 0, 0];
      let n = 0;
      if (e) {
        for (const key of keys) {
          const t = this.#tierOf(e, key);
          if (t < 0) break;
          per[t]!++;
          n++;
        }
      }
      matched.push(n);
      tiers.push(...per);
    }
    return { matched, tiers };
  }

  stats(): { entries: [number, number, number]; blocks: number; endpoints: number } {
    const entries: [number, number, number] = [0, 0, 0];
    const blocks = new Set<bigint>();
    for (const e of this.eps.values()) {
      for (let t = 0; t < 3; t++) {
        entries[t] += e.tiers[t]!.size;
        for (const k of e.tiers[t]!.keys()) blocks.add(k);
      }
    }
    return { entries, blocks: blocks.size, endpoints: this.eps.size };
  }

  /** Per endpoint and tier, keys from most to least recently used. */
  dump(ep: number): bigint[][] {
    const e = this.eps.get(ep);
    if (!e) return [[], [], []];
    return e.tiers.map((m) => [...m.keys()].reverse());
  }
}
