// Saturation detection per endpoint. An endpoint's load is the largest of
//   occupancy / batchLimit      requests at the engine now (the router's own
//                               in-flight count, plus other clients' requests the
//                               last fresh scrape showed) over the engine's batch
//                               limit (learned from its running/waiting counts)
//   inFlight / maxConcurrency   the operator's cap on the routers' requests
//                               (this one's and, active-active, its replicas')
//   waiting / queueDepthThreshold, kvUsage / kvThreshold   from fresh metrics only
//   prefillPending × prefillCostFactor / prefillBacklogTokens
//                               the prefill backlog: uncached prompt tokens
//                               the router dispatched there that have not
//                               had a first byte back (the scheduler counts
//                               them at the pick from the prefix producer's
//                               match and releases them at the first body
//                               byte or the request's end, whichever comes
//                               first; a non-streamed generation, whose
//                               first byte comes after its decode, is not
//                               counted), weighed by the pool's prefill speed.
//                               An engine that prefills one request after
//                               another makes every new request wait for
//                               all of it; none of the other terms sees it
//                               (a batch half empty can have seconds of
//                               prefill queued). It counts only while at
//                               least two requests wait for their first
//                               byte there (one prefilling, one queued
//                               behind it): the engine always has its next
//                               prefill at hand, so holding never idles it
//                               (one long prompt alone never saturates).
//                               0 = off.
// and it is saturated at load >= 1. The first term is exact between scrapes:
// a burst that arrives right after a scrape is counted request by request as
// the router dispatches it, so it is held once the engines' batches are full,
// whenever the next scrape comes. With active-active replicas (src/ha/fleet.ts)
// every term counts their requests and backlog too, as of their last reports
// (at most ha.flushMs plus a read old). Stale or missing metrics never halt
// dispatch: then only the router's own counts apply. Freshness is the
// endpoint's own (the data layer's `staleAfterMs`).
import type { SaturationConfig } from './config.js';

/** What the detector needs to know about one endpoint (structurally matches the router's Endpoint). */
export interface EndpointLoad {
  /** Requests the router has dispatched there and not completed. Always fresh. */
  readonly inFlight: number;
  readonly metrics: { readonly waiting: number; readonly kvUsage: number };
  /** True when the metrics are recent enough to use (the endpoint's own staleness setting). */
  fresh(now: number): boolean;
  /** Requests at the engine now, running or waiting (at least `inFlight`). */
  occupancy(now: number): number;
  /** How many requests the engine runs at once (learned, or a default until learned). */
  readonly batchLimit: number;
  /** Uncached prompt tokens the router dispatched here without a first byte back yet (its prefill backlog); absent = 0. */
  readonly prefillPending?: number;
  /** Other router replicas' requests there and prefill backlog (active-active, as of their last reports); absent = 0. */
  readonly peerInFlight?: number;
  readonly peerPrefillPending?: number;
  readonly peerPrefillRequests?: number;
  /** How many requests prefillPending counts; absent: the term applies whatever the count. */
  readonly prefillRequests?: number;
  /** The pool's prefill cost against the reference accelerator (2 = half as fast); absent = 1. */
  readonly prefillCostFactor?: number;
}

/** The thresholds the detector reads (the config's `saturation` block). */
export type SaturationThresholds = Pick<SaturationConfig, 'queueDepthThreshold' | 'kvThreshold' | 'maxConcurrency'> &
  Partial<Pick<SaturationConfig, 'prefillBacklogTokens'>>;

export class SaturationDetector {
  readonly #cfg: SaturationThresholds;
  /** 1 / prefillBacklogTokens, 0 when the term is off. */
  readonly #perBacklogToken: number;

  constructor(cfg: SaturationThresholds) {
    this.#cfg = cfg;
    const t = cfg.prefillBacklogTokens ?? 0;
    this.#perBacklogToken = t > 0 ? 1 / t : 0;
  }

  /** Load of one endpoint; >= 1 means saturated. */
  load(ep: EndpointLoad, now: number): number {
    return this.withBacklog(ep, this.baseLoad(ep, now));
  }

  /** `base` (an endpoint's baseLoad) raised to its prefill-backlog term when that is larger (the term off: `base`). */
  withBacklog(ep: EndpointLoad, base: number): number {
    const pb = this.#perBacklogToken;
    if (pb === 0) return base;
    const pending = (ep.prefillPending ?? 0) + (ep.peerPrefillPending ?? 0);
    if (!(pending > 0)) return base;
    // one request alone (prefilling, nothing queued behind it) never holds the next: the engine would idle
    const n = ep.prefillRequests === undefined ? undefined : ep.prefillRequests + (ep.peerPrefillRequests ?? 0);
    if (n !== undefined && n < 2) return base;
    const p = pending * (ep.prefillCostFactor ?? 1) * pb;
    return p > base ? p : base;
  }

  /**
   * Load of one endpoint without the prefill-backlog term: what probabilistic
   * admission sheds by (a backlog is a reason to hold a request, which it
   * drains in a prefill's time, not to refuse it).
   */
  baseLoad(ep: EndpointLoad, now: number): number {
    const c = this.#cfg;
    let u = (ep.inFlight + (ep.peerInFlight ?? 0)) / c.maxConcurrency;
    const b = ep.occupancy(now) / ep.batchLimit;
    if (b > u) u = b;
    if (ep.fresh(now)) {
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
