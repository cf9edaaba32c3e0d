// A Prometheus histogram (cumulative buckets rendered at scrape time).

export class Histogram {
  readonly bounds: readonly number[];
  readonly counts: Float64Array;
  sum = 0;
  count = 0;

  constructor(bounds: readonly number[]) {
    this.bounds = bounds;
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

  /** Appends the `_bucket`, `_sum` and `_count` lines; `labels` is `k="v",...` without braces. */
  render(name: string, labels: string, out: string[]): void {
    let acc = 0;
    for (let i = 0; i < this.bounds.length; i++) {
      acc += this.counts[i]!;
      out.push(`${name}_bucket{${labels},le="${fmt(this.bounds[i]!)}"} ${fmt(acc)}`);
    }
    out.push(`${name}_bucket{${labels},le="+Inf"} ${fmt(this.count)}`);
    out.push(`${name}_sum{${labels}} ${fmt(this.sum)}`);
    out.push(`${name}_count{${labels}} ${fmt(this.count)}`);
  }
}

/** Prometheus float formatting in the Python client's style (1 → "1.0"). */
export function fmt(v: number): string {
  if (Number.isInteger(v)) return v.toFixed(1);
  if (v === Infinity) return '+Inf';
  if (v === -Infinity) return '-Inf';
  if (Number.isNaN(v)) return 'NaN';
  return String(v);
}

/** vLLM's bucket bounds for time to first token, seconds. */
export const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/** vLLM's bucket bounds for inter-token latency, seconds. */
export const ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/** vLLM's bucket bounds for request latencies (e2e, queue), seconds. */
export const REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0];
