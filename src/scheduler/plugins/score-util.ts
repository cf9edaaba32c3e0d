// Shared scoring helpers.

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
