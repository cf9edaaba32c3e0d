// The one histogram type of the router, flow control and the simulator: fixed
// upper bounds, per-bucket counts in a typed array, sum and count as plain
// numbers. observe() allocates nothing; Prometheus sees it at scrape time
// through a HistogramMetric (./prom.ts), which makes the buckets cumulative.

export class Histogram {
  /** Upper bounds, ascending. */
  readonly bounds: Float64Array;
  /** Observations per bucket (not cumulative); those above the last bound count only in `count`. */
  readonly counts: Float64Array;
  sum = 0;
  count = 0;

  constructor(bounds: readonly number[]) {
    for (let i = 0; i < bounds.length; i++) {
      const b = bounds[i]!;
      if (!Number.isFinite(b) || (i > 0 && !(b > bounds[i - 1]!))) {
        throw new RangeError(`Histogram: bounds must be finite and strictly ascending, got ${b} at index ${i}`);
      }
    }
    this.bounds = Float64Array.from(bounds);
    this.counts = new Float64Array(bounds.length);
  }

  observe(v: number): void {
    const b = this.bounds;
    let i = 0;
    while (i < b.length && v > b[i]!) i++;
    if (i < b.length) this.counts[i]!++;
    this.sum += v;
    this.count++;
  }

  /** Observations at or below `bounds[i]` (the cumulative `le` bucket). */
  cumulative(i: number): number {
    let acc = 0;
    for (let k = 0; k <= i && k < this.counts.length; k++) acc += this.counts[k]!;
    return acc;
  }

  reset(): void {
    this.counts.fill(0);
    this.sum = 0;
    this.count = 0;
  }
}
