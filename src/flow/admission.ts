// Probabilistic admission: above `maxUtilisation`, requests of lower bands are
// admitted with a probability that falls as utilisation rises; the top band
// is never shed. With u the pool utilisation, m = maxUtilisation and band
// index b (0 = top):
//   p(b, u) = 1                               when b = 0 or u <= m
//   p(b, u) = (1 - (u - m) / (1 - m)) ^ b     otherwise (0 at u >= 1)
// so the lowest bands are shed first and hardest.

/** A source of uniform random numbers in [0, 1). */
export type Rng = () => number;

/** Small seeded generator (mulberry32) for reproducible tests and simulations. */
export function seededRng(seed: number): Rng {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function admitProbability(band: number, utilisation: number, maxUtilisation: number): number {
  if (band <= 0 || !(utilisation > maxUtilisation)) return 1;
  if (utilisation >= 1 || maxUtilisation >= 1) return 0;
  const headroom = 1 - (utilisation - maxUtilisation) / (1 - maxUtilisation);
  return headroom ** band;
}

export class ProbabilisticAdmission {
  readonly #max: number;
  readonly #rng: Rng;

  constructor(maxUtilisation: number, rng: Rng = Math.random) {
    this.#max = maxUtilisation;
    this.#rng = rng;
  }

  /** True when a request of `band` may enter at pool utilisation `utilisation`. */
  admit(band: number, utilisation: number): boolean {
    const p = admitProbability(band, utilisation, this.#max);
    return p >= 1 || (p > 0 && this.#rng() < p);
  }
}
