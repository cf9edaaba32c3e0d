// A bound on the distinct values one metric label may take (a tenant, a
// flow): the first `max` values seen keep their own series, every later one
// is counted under `(overflow)`. Callers ask once per new series (never per
// request), so the Set lookup is off the hot path. A leaf: imports nothing.

/** The label value every value past the cap is counted under. */
export const OVERFLOW_LABEL = '(overflow)';

/** Default cap (config `metrics.maxLabelValues`). */
export const DEFAULT_MAX_LABEL_VALUES = 1000;

export class LabelCap {
  readonly max: number;
  readonly #seen = new Set<string>();
  /** Values refused their own series (counted under OVERFLOW_LABEL). */
  overflowed = 0;

  constructor(max: number = DEFAULT_MAX_LABEL_VALUES) {
    this.max = max;
  }

  /** The label value to count `v` under: `v` itself while the cap allows, else OVERFLOW_LABEL. */
  value(v: string): string {
    if (v === OVERFLOW_LABEL || this.#seen.has(v)) return v;
    if (this.#seen.size >= this.max) {
      this.overflowed++;
      return OVERFLOW_LABEL;
    }
    this.#seen.add(v);
    return v;
  }

  get size(): number {
    return this.#seen.size;
  }
}
