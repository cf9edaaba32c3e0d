// Each endpoint's prefill speed, learned online from every request the router
// sends it, with no configuration (the default scheduler's load scorers read
// it: docs/scheduling.md, "Load in expected seconds").
//
//   TTFT ≈ a + b × U / 1000 + c × Q / 1000
//
//     U = the request's own uncached prompt tokens;
//     Q = prefill tokens ahead of it at the endpoint at the pick
//         (Endpoint.prefillPending of the router and its replicas, less U)
//
// observed at the first body byte of a 200 answer that marks the end of the
// prefill (a streamed answer, or a non-streamed one of one token: the director
// releases the prefill backlog there and nowhere else). `b` (ms per thousand
// tokens) is the speed; `a` the fixed part; `c` what a token queued ahead
// costs this request. An engine that prefills one request after another has
// c ≈ b; one that prefills several at once (a continuous batch) has c well
// below b: a request ahead slows this one by its share of the batch, not by
// its whole prefill. One work total (U + Q, the model before 2026-12-04)
// cannot tell the two apart: on a parallel engine its slope fell as the queue
// grew (TTFT rises with the batch's size, the tokens ahead faster), so a
// loaded engine looked faster per queued token the more it was given.
// The estimator is the latency model's recursive least squares (forgetting,
// residual clip, covariance bound, coefficients ≥ 0), seeded from the pool's
// prefill cost factor (pools[].speed or the accelerator profile) as a serial
// engine (c = b) with a covariance wide enough that tens of observations
// override it.
//
// The scorers never use the coefficients raw: `expectedMsPerKTok` shrinks the
// speed towards the candidates' common speed while an endpoint has few
// samples (a cold endpoint neither draws every request nor none) and bounds it
// within a factor of SPEED_BOUND of that common speed (an engine that answers
// nonsense fast or hangs cannot take all traffic or be starved for ever);
// `queueWeight` shrinks c / b towards 1 (serial) the same way and bounds it
// within [QUEUE_WEIGHT_MIN, 1]. Cost per request: a few float operations at
// the first byte; no allocation.
import { Rls3 } from './latency-model.js';

/** Reference prefill cost of the prior (factor 1): 50 ms per thousand tokens (12.5 ms per KB at 4 bytes a token), 5 ms fixed. */
export const PRIOR_MS_PER_KTOK = 50;
export const PRIOR_BASE_MS = 5;
/** Samples after which an endpoint's own estimate weighs as much as its peers' (shrinkage weight n / (n + SHRINK)). */
export const SPEED_SHRINK = 8;
/** An endpoint's speed is kept within [common / SPEED_BOUND, common × SPEED_BOUND]. */
export const SPEED_BOUND = 8;
/** A queued token counts at least this fraction of an own token (c / b is bounded within [QUEUE_WEIGHT_MIN, 1]). */
export const QUEUE_WEIGHT_MIN = 0.1;
/** Estimates within this factor of the fastest candidate's count as the fastest's: equal engines' noise breaks no ties. */
export const SPEED_DEADBAND = 1.4;

export class SpeedModel {
  /** TTFT ≈ a + b × own k-tokens + c × k-tokens queued ahead. */
  readonly ttft: Rls3;
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
    this.ttft = new Rls3(a, b, b, Math.max(1, a * a), b * b, b * b, 0.98, a + b);
  }

  /** A request of `tokens` uncached prompt tokens was sent here. */
  sent(tokens: number): void {
    this.meanTokens += 0.05 * (tokens - this.meanTokens);
  }

  /** Observations so far. */
  get samples(): number {
    return this.ttft.n;
  }

  /** A first token `ms` after dispatch of a request of `ownTokens` uncached tokens, `queuedTokens` prefill tokens ahead of it at the pick. */
  observe(ownTokens: number, queuedTokens: number, ms: number): void {
    if (!(ownTokens > 0) || !(queuedTokens >= 0) || !(ms >= 0) || ms > 3_600_000) return;
    this.ttft.update(ownTokens / 1000, queuedTokens / 1000, ms);
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
    const v = this.ttft.predict(m, 0) / m;
    return v > 1e-6 ? v : 1e-6;
  }

  /**
   * What a token queued ahead costs against one of the request's own: c / b,
   * shrunk towards 1 (the serial prior) by n / (n + SPEED_SHRINK) and bounded
   * within [QUEUE_WEIGHT_MIN, 1]. About 1 on an engine that prefills serially,
   * well below on one that batches its prefills.
   */
  queueWeight(): number {
    const t = this.ttft;
    const r = t.b > 1e-9 ? t.c / t.b : 1;
    const n = t.n;
    const k = n / (n + SPEED_SHRINK);
    const w = k * r + (1 - k);
    return w > 1 ? 1 : w < QUEUE_WEIGHT_MIN ? QUEUE_WEIGHT_MIN : w;
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
