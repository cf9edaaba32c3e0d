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
