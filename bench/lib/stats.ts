// Small statistics helpers shared by the benchmarks.

/** The q-quantile (0..1) of `xs` by nearest rank; sorts a copy. NaN when empty. */
export function quantile(xs: ArrayLike<number>, q: number): number {
  if (xs.length === 0) return NaN;
  const s = Float64Array.from(xs).sort();
  const i = Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1));
  return s[i]!;
}

/** The median of `xs` (for an even count, the upper of the two middle values); sorts a copy. */
export function median(xs: readonly number[]): number {
  return [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
}

export function mean(xs: ArrayLike<number>): number {
  let t = 0;
  for (let i = 0; i < xs.length; i++) t += xs[i]!;
  return xs.length ? t / xs.length : NaN;
}

/** Formats a number with `digits` significant decimals, '—' for NaN. */
export function fmt(x: number, digits = 1): string {
  return Number.isFinite(x) ? x.toFixed(digits) : '—';
}

/** A seeded PRNG (the one flow control uses) so workloads and arrivals are reproducible. */
export { seededRng as rng } from '../../src/flow/admission.js';

/** Exponential inter-arrival time (seconds) for a Poisson process of `rate` per second. */
export function expGap(rand: () => number, rate: number): number {
  return -Math.log(1 - rand()) / rate;
}
