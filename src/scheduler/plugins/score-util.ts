// Shared scoring helpers.
import type { Endpoint } from '../../endpoints/endpoint.js';
import type { CycleContext, SchedRequest, Scorer } from '../types.js';

/** Writes (max - v) / (max - min) for v in vals[0..n) into out; all 1 when equal. Lower is better. */
export function inverseMinMax(vals: Float64Array, n: number, out: Float64Array): void {
  let min = Infinity;
  let max = -Infinity;
  for (let i = 0; i < n; i++) {
    const v = vals[i];
    if (v < min) min = v;
    if (v > max) max = v;
  }
  const span = max - min;
  for (let i = 0; i < n; i++) out[i] = span > 0 ? (max - vals[i]) / span : 1;
}

/** Grows a scratch Float64Array to hold at least n entries. */
export function ensure(arr: Float64Array<ArrayBuffer>, n: number): Float64Array<ArrayBuffer> {
  return arr.length >= n ? arr : new Float64Array(Math.max(n, arr.length * 2));
}

/**
 * A scorer over one number per endpoint where fewer is better (in flight,
 * queued, running): `value` per candidate, then inverseMinMax. Scratch arrays
 * are kept, so a score allocates nothing once they have grown.
 */
export abstract class FewestScorer implements Scorer {
  abstract readonly type: string;
  abstract readonly name: string;
  #vals = new Float64Array(16);
  #out = new Float64Array(16);

  protected abstract value(ep: Endpoint, now: number): number;

  score(ctx: CycleContext, eps: readonly Endpoint[]): Float64Array {
    const n = eps.length;
    this.#vals = ensure(this.#vals, n);
    this.#out = ensure(this.#out, n);
    for (let i = 0; i < n; i++) this.#vals[i] = this.value(eps[i]!, ctx.now);
    inverseMinMax(this.#vals, n, this.#out);
    return this.#out;
  }
}

/** A request's prompt tokens: its token ids in precise mode, else its bytes / 4 (the prefix index's conversion); 0 without a prompt. */
export function requestTokens(req: SchedRequest): number {
  const t = req.tokens;
  if (t !== undefined) return t.length >>> 2;
  const p = req.prompt;
  return p !== undefined ? p.length / 4 : 0;
}

/**
 * Which candidates' batches are full, by one rule for every scorer that asks
 * (prefix-cache's spill, queue's full-batch wait): an endpoint's batch limit
 * is its own learned (or configured) one, else the largest one learned by a
 * candidate of the same pool (a pool's replicas are one deployment: an engine
 * that never queued yet has its peers' max-num-seqs), else unknown (never
 * full); full = the fleet's requests there (Endpoint.occupancy) at or above
 * it. Scratch kept: no allocation once grown (a fleet has few pools).
 */
export class BatchRoom {
  /** Per candidate of the last fill: its batch limit as far as it is known (0: not known). */
  limits = new Float64Array(16);
  /** Per candidate of the last fill: 1 when its batch is full. */
  isFull = new Uint8Array(16);
  readonly #pools: string[] = [];
  readonly #poolLimits: number[] = [];

  /** Fills `limits` and `isFull` for eps[0..n); returns whether some candidate has a free slot (or an unknown limit). */
  fill(eps: readonly Endpoint[], n: number, now: number): boolean {
    if (this.limits.length < n) this.limits = new Float64Array(Math.max(n, this.limits.length * 2));
    if (this.isFull.length < n) this.isFull = new Uint8Array(Math.max(n, this.isFull.length * 2));
    const limits = this.limits;
    const pools = this.#pools;
    const pl = this.#poolLimits;
    pools.length = 0;
    pl.length = 0;
    let unknown = false;
    for (let i = 0; i < n; i++) {
      const ep = eps[i]!;
      const l = ep.batch.learned;
      limits[i] = l;
      if (l > 0) {
        const k = pools.indexOf(ep.pool);
        if (k < 0) {
          pools.push(ep.pool);
          pl.push(l);
        } else if (l > pl[k]!) pl[k] = l;
      } else unknown = true;
    }
    if (unknown && pools.length > 0) {
      for (let i = 0; i < n; i++) {
        if (limits[i]! > 0) continue;
        const k = pools.indexOf(eps[i]!.pool);
        if (k >= 0) limits[i] = pl[k]!;
      }
    }
    let room = false;
    for (let i = 0; i < n; i++) {
      const l = limits[i]!;
      const full = l > 0 && eps[i]!.occupancy(now) >= l;
      this.isFull[i] = full ? 1 : 0;
      if (!full) room = true;
    }
    return room;
  }
}
