// Saturation detection per endpoint, from the engine's scraped metrics and the
// router's own in-flight count. An endpoint's load is the largest of
//   waiting / queueDepthThreshold, kvUsage / kvThreshold, inFlight / maxConcurrency
// and it is saturated at load >= 1. Stale or missing metrics never halt
// dispatch: then only the in-flight term counts.
import type { SaturationConfig } from './config.js';

/** What the detector needs to know about one endpoint (structurally matches the router's Endpoint). */
export interface EndpointLoad {
  /** Requests the router has dispatched there and not completed. Always fresh. */
  readonly inFlight: number;
  readonly metrics: { readonly waiting: number; readonly kvUsage: number };
  /** True when the metrics were scraped within `staleAfterMs` of `now`. */
  fresh(now: number, staleAfterMs: number): boolean;
}

export class SaturationDetector {
  readonly #cfg: SaturationConfig;
  readonly #staleAfterMs: number;

  /** `staleAfterMs`: the router's one staleness setting, dataLayer.staleAfterMs (default 2000). */
  constructor(cfg: SaturationConfig, staleAfterMs = 2_000) {
    this.#cfg = cfg;
    this.#staleAfterMs = staleAfterMs;
  }

  /** Load of one endpoint; >= 1 means saturated. */
  load(ep: EndpointLoad, now: number): number {
    const c = this.#cfg;
    let u = ep.inFlight / c.maxConcurrency;
    if (ep.fresh(now, this.#staleAfterMs)) {
      const w = ep.metrics.waiting / c.queueDepthThreshold;
      if (w > u) u = w;
      const kv = ep.metrics.kvUsage;
      if (kv === kv) {
        // kvUsage is NaN when the engine does not report it
        const k = kv / c.kvThreshold;
        if (k > u) u = k;
      }
    }
    return u;
  }

  saturated(ep: EndpointLoad, now: number): boolean {
    return this.load(ep, now) >= 1;
  }

  /**
   * Load of a set of candidate endpoints: the least loaded one's (the pool can
   * take a request as long as one candidate can). Infinity when there are none.
   */
  poolLoad(eps: Iterable<EndpointLoad>, now: number): number {
    let best = Infinity;
    for (const ep of eps) {
      const u = this.load(ep, now);
      if (u < best) best = u;
    }
    return best;
  }
}
