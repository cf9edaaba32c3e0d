// Each endpoint's prefill speed, learned online from every request the router
// sends it, with no configuration (the default scheduler's load scorers read
// it: docs/scheduling.md, "Load in expected seconds").
//
//   TTFT ≈ a + b × A / 1000     A = prefill tokens ahead of the request at the
//                                   endpoint at the pick, its own included
//                                   (Endpoint.prefillPending of the router and
//                                   its replicas, plus its uncached tokens)
//
// observed at the first body byte of a 200 answer that marks the end of the
// prefill (a streamed answer, or a non-streamed one of one token: the director
// releases the prefill backlog there and nowhere else). `b` (ms per thousand
// tokens) is the speed; `a` the fixed part. The estimator is the latency
// model's recursive least squares (forgetting, residual clip, covariance
// bound, coefficients ≥ 0), seeded from the pool's prefill cost factor (pools[]
// .speed or the accelerator profile) with a covariance wide enough that tens
// of observations override it.
//
// The scorers never use `b` raw: `expectedMsPerKTok` shrinks it towards the
// candidates' common speed while an endpoint has few samples (a cold endpoint
// neither draws every request nor none) and bounds it within a factor of
// SPEED_BOUND of that common speed (an engine that answers nonsense fast or
// hangs cannot take all traffic or be starved for ever). Cost per request: a
// few float operations at the first byte; no allocation.
import { Rls2 } from './latency-model.js';

/** Reference prefill cost of the prior (factor 1): 50 ms per thousand tokens (12.5 ms per KB at 4 bytes a token), 5 ms fixed. */
export const PRIOR_MS_PER_KTOK = 50;
export const PRIOR_BASE_MS = 5;
/** Samples after which an endpoint's own estimate weighs as much as its peers' (shrinkage weight n / (n + SHRINK)). */
export const SPEED_SHRINK = 8;
/** An endpoint's speed is kept within [common / SPEED_BOUND, common × SPEED_BOUND]. */
export const SPEED_BOUND = 8;
/** Estimates within this factor of the fastest candidate's count as the fastest's: equal engines' noise breaks no ties. */
export const SPEED_DEADBAND = 1.4;

export class SpeedModel {
  readonly ttft: Rls2;
  /** The prior's prefill cost factor (1 = the reference). */
  readonly factor: number;
  /** Running mean of a request's uncached prompt tokens here (prices a waiting request the router did not send). */
  meanTokens = 512;

  constructor(prefillCostFactor = 1) {
    this.factor = prefillCostFactor > 0 && Number.isFinite(prefillCostFactor) ? prefillCostFactor : 1;
    const a = PRIOR_BASE_MS * this.factor;
    const b = PRIOR_MS_PER_KTOK * this.factor;
    // forgetting 0.98: ~50 observations of memory, so a slowed card is followed within tens of requests
    // the clip starts at the prior's TTFT of a thousand-token prompt: a prior 3× off is corrected in a few samples, not tens
    this.ttft = new Rls2(a, b, Math.max(1, a * a), b * b, 0.98, a + b);
  }

  /** A request of `tokens` uncached prompt tokens was sent here. */
  sent(tokens: number): void {
    this.meanTokens += 0.05 * (tokens - this.meanTokens);
  }

  /** Observations so far. */
  get samples(): number {
    return this.ttft.n;
  }

  /** A first token `ms` after dispatch, with `aheadTokens` prefill tokens ahead at the pick (own included). */
  observe(aheadTokens: number, ms: number): void {
    if (!(aheadTokens > 0) || !(ms >= 0) || ms > 3_600_000) return;
    this.ttft.update(aheadTokens / 1000, ms);
  }

  /**
   * The learned cost per thousand prefill tokens at this endpoint's typical
   * prompt: (a + b × m) / m, m = the mean uncached prompt in thousands of
   * tokens. Intercept and slope alone trade off against each other when the
   * prompts vary little; their sum at the typical size is what the
   * observations pin down.
   */
  msPerKTok(): number {
    const m = this.meanTokens > 100 ? this.meanTokens / 1000 : 0.1;
    const v = this.ttft.predict(m) / m;
    return v > 1e-6 ? v : 1e-6;
  }

  /** msPerKTok over the prior's factor (a log-average of these is the candidates' common speed). */
  normalised(): number {
    return this.msPerKTok() / this.factor;
  }
}

/**
 * Per candidate, the cost in ms per thousand prefill tokens the scorers use
 * (into `out[0..n)`): each endpoint's estimate shrunk towards the candidates'
 * common speed (the sample-weighted log-average of their normalised
 * estimates, times the endpoint's own prior factor) by n / (n + SPEED_SHRINK),
 * then bounded within SPEED_BOUND of that common speed; those within
 * SPEED_DEADBAND of the fastest are taken as the fastest (equal engines measure a
 * little apart: that noise must not send every request of an idle pool to
 * the one that measured fastest). No allocation.
 */
export function expectedMsPerKTok(speeds: { readonly speed: SpeedModel }[] | readonly { readonly speed: SpeedModel }[], n: number, out: Float64Array): void {
  let logSum = 0;
  let wSum = 0;
  for (let i = 0; i < n; i++) {
    const s = speeds[i]!.speed;
    const w = s.samples + 1;
    logSum += w * Math.log(s.normalised());
    wSum += w;
  }
  const common = Math.exp(logSum / wSum);
  let min = Infinity;
  for (let i = 0; i < n; i++) {
    const s = speeds[i]!.speed;
    const peer = common * s.factor;
    const k = s.samples / (s.samples + SPEED_SHRINK);
    let b = k * s.msPerKTok() + (1 - k) * peer;
    const lo = peer / SPEED_BOUND;
    const hi = peer * SPEED_BOUND;
    if (!(b >= lo)) b = lo;
    else if (b > hi) b = hi;
    out[i] = b;
    if (b < min) min = b;
  }
  const snap = min * SPEED_DEADBAND;
  for (let i = 0; i < n; i++) if (out[i]! < snap) out[i] = min;
}
