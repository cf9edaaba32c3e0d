// Admission rules for the bands below the top one (docs/flow-control.md,
// "Admission"). The top band is never shed by admission in any mode.
//
// mode `probabilistic` (the default): hold what can be served in time, shed
// only sustained overload. Its parts live here (WindowedRate, BandOverload);
// FlowController feeds them from its sweep tick, so the request path reads
// numbers and never computes a rate:
//   D      the pool's drain rate: completions per second of busy time (time
//          with something queued, when every completion is capacity-limited),
//          exponentially windowed (WindowedRate over RATE_WINDOW_MS of busy time)
//   D_b    what is left of it for band b: D less the dispatch rates of the
//          bands above b (strict priority: they are served first)
//   hold   a request of band b that would wait is held while
//          (queued in bands 0..b + 1) / D_b <= ttl (Little's law), else shed
//   sojourn the age of band b's oldest queued request at each sweep tick;
//          above `target` continuously for `interval` (CoDel's rule), the
//          band sheds each arrival with probability
//          p_b = clamp(1 - (D_b - (Q_b - D_b·target) / interval) / λ_b, 0, 1)
//          (λ_b its arrival rate, Q_b its queue): the excess of its arrivals
//          over what it drains, plus what brings its queue back to `target`
//          within one interval.
//
// mode `utilisation` (the rule before): above `maxUtilisation`, requests of
// lower bands are admitted with a probability that falls as utilisation
// rises. With u the pool utilisation, m = maxUtilisation and band index b
// (0 = top):
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

/** Window of the drain-rate and arrival-rate meters, ms (of busy time for the drain rate, of wall time for the others). */
export const RATE_WINDOW_MS = 5000;

/** Completions a drain rate needs before it is known (before: requests are held, never shed by it). */
export const MIN_DRAIN_EVENTS = 4;

/**
 * An event rate over an exponentially weighted window: events and elapsed
 * time are both decayed by exp(-Δt / window), and the rate is their ratio,
 * so it has no start-up bias (one interval of 0.5 s with 5 events reads 10/s).
 * Fed in bulk (events and elapsed ms since the last add), from a timer tick.
 */
export class WindowedRate {
  #events = 0;
  #seconds = 0;
  /** Events added since the start, undecayed. */
  total = 0;
  constructor(readonly windowMs: number = RATE_WINDOW_MS) {}

  add(events: number, elapsedMs: number): void {
    if (!(elapsedMs > 0) && events === 0) return;
    const dt = elapsedMs > 0 ? elapsedMs : 0;
    const e = Math.exp(-dt / this.windowMs);
    // the interval's events spread over it, weighed as its time is: ∫ e^{-s/w} ds over [0, dt] = (1 - e)·w
    const weight = dt > 0 ? ((1 - e) * this.windowMs) / dt : 1;
    this.#events = this.#events * e + events * weight;
    this.#seconds = this.#seconds * e + (dt * weight) / 1000;
    this.total += events;
  }

  /** Events per second, 0 before any time passed. */
  get rate(): number {
    return this.#seconds > 0 ? this.#events / this.#seconds : 0;
  }

  reset(): void {
    this.#events = 0;
    this.#seconds = 0;
    this.total = 0;
  }
}

/**
 * One band's sustained-overload state (CoDel's rule over the band's oldest
 * queued request): `dropping` once its age has stayed at or above target for
 * interval (at once when the band left dropping less than an interval ago:
 * the overload is the same one); out of it when the queue empties, or the age
 * is below target and nothing is left to shed (p* = 0).
 */
export class BandOverload {
  /** When the age first went above target (-1: it is below). */
  firstAbove = -1;
  dropping = false;
  /** When the band last left dropping (-Infinity: never). */
  leftAt = -Infinity;
  /** Shed probability for the next arrivals (0 unless dropping). */
  p = 0;

  /**
   * One observation at `now`: the oldest queued request's age (0 with the
   * queue empty), and p*, the shed probability the rates ask for. Returns p.
   */
  observe(now: number, age: number, empty: boolean, pStar: number, targetMs: number, intervalMs: number): number {
    if (empty || age < targetMs) {
      this.firstAbove = -1;
      if (this.dropping && (empty || pStar <= 0)) {
        this.dropping = false;
        this.leftAt = now;
      }
    } else if (!this.dropping) {
      if (now - this.leftAt < intervalMs) this.dropping = true;
      else if (this.firstAbove < 0) this.firstAbove = now + intervalMs;
      else if (now >= this.firstAbove) this.dropping = true;
    }
    this.p = this.dropping ? pStar : 0;
    return this.p;
  }
}

/**
 * p* of a band: the fraction of its arrivals (rate `arrivals`) beyond what it
 * drains (`drain` per second), plus what returns its queue (`queued`) to
 * `targetMs` of drain time within one `intervalMs`. In [0, 1].
 */
export function excessProbability(drain: number, arrivals: number, queued: number, targetMs: number, intervalMs: number): number {
  if (!(arrivals > 0)) return 0;
  const admit = drain - (queued - (drain * targetMs) / 1000) / (intervalMs / 1000);
  const p = 1 - admit / arrivals;
  return p <= 0 ? 0 : p >= 1 ? 1 : p;
}
