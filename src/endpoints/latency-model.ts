// Each endpoint's latency model, learned online from what the router observes:
//
//   TTFT ≈ a + b × U + c × Q   U = the request's own uncached prompt KB,
//                               Q = uncached KB of requests ahead of it at the
//                               endpoint (the router's without a first token,
//                               other clients' waiting ones at the mean size)
//   TPOT ≈ c + d × R      R = requests decoding at the endpoint
//
// Why this shape: an engine that prefills one request after another (vLLM,
// SGLang, the simulator) makes a new request wait for the prefill compute of
// every request dispatched before it that has not produced its first token
// yet; the router knows exactly those (it sent them, with their uncached
// bytes from the prefix producer's match). A serial engine has b = c; an
// engine that prefills several requests at once has c < b (a request ahead
// costs this one only its share of the batch): two coefficients, so the model
// holds on both without being told which it serves. The per-token
// decode cost grows with the running batch (memory-bound decode steps get
// longer as the batch grows).
//
// The estimator: recursive least squares over the two coefficients, with
//   - exponential forgetting (λ, default 0.98: an effective memory of ~50
//     observations), so drift (a thermally throttled card, a neighbour on the
//     same host, a new engine build) is followed within tens of requests;
//   - a Huber-style clip of each residual at 3× its running mean absolute
//     value, so one outlier (a GC pause, a network hiccup) moves the estimate
//     by a bounded step;
//   - a bound on the covariance's trace (anti-windup): with forgetting and
//     features that do not vary (an idle endpoint always sees W ≈ its own
//     prompt) the covariance would otherwise grow without bound and the next
//     observation would swing the estimate;
//   - coefficients clamped non-negative.
// Why RLS rather than an EWMA of per-token costs: an EWMA of TTFT / tokens
// mixes the fixed part (scheduling, the first decode step, the network) into
// the per-token cost, so short prompts look expensive and long ones cheap;
// RLS separates intercept and slope with the same handful of float updates
// and no allocation. The prior (the pool's accelerator profile or speed)
// seeds both coefficients with a covariance wide enough that tens of
// observations override it.
//
// Cost per request: a few float multiplications at dispatch (prediction), at
// the first token and at the end (updates); no allocation. Error statistics
// (for the metrics) keep the last 256 absolute percentage errors in a ring,
// read at scrape time.

/** A residual clipped to three times the fits' running scale (one outlier moves a fit by a bounded step). */
function clipResidual(e: number, scale: number): number {
  const clip = 3 * scale;
  return e > clip ? clip : e < -clip ? -clip : e;
}

/** The running scale after residual `e`: it follows the (clipped) residuals' size, so a level shift is adopted within a few observations. */
function nextScale(scale: number, e: number): number {
  const abs = e < 0 ? -e : e;
  const clip = 3 * scale;
  const next = 0.9 * scale + 0.1 * (abs < clip ? abs : clip);
  return next < 1e-3 ? 1e-3 : next;
}

/** Two-coefficient recursive least squares: y ≈ a + b·x. */
export class Rls2 {
  a: number;
  b: number;
  #p00: number;
  #p01 = 0;
  #p11: number;
  readonly #lambda: number;
  readonly #pMax: number;
  /** Running mean absolute residual (the clip's scale). */
  #scale: number;
  n = 0;

  /** `scale`: the residual clip's starting scale (default half the intercept; a prior that may be far off wants its typical prediction). */
  constructor(a: number, b: number, varA: number, varB: number, lambda: number, scale = 0.5 * Math.abs(a)) {
    this.a = a;
    this.b = b;
    this.#p00 = varA;
    this.#p11 = varB;
    this.#lambda = lambda;
    this.#pMax = 4 * (varA + varB);
    this.#scale = Math.max(1e-3, scale);
  }

  predict(x: number): number {
    return this.a + this.b * x;
  }

  update(x: number, y: number): void {
    if (!(y >= 0) || !Number.isFinite(y) || !Number.isFinite(x)) return;
    const l = this.#lambda;
    const px0 = this.#p00 + this.#p01 * x;
    const px1 = this.#p01 + this.#p11 * x;
    const denom = l + px0 + x * px1;
    const k0 = px0 / denom;
    const k1 = px1 / denom;
    const r = y - (this.a + this.b * x);
    const e = clipResidual(r, this.#scale);
    this.#scale = nextScale(this.#scale, r);
    this.a += k0 * e;
    this.b += k1 * e;
    this.#p00 = (this.#p00 - k0 * px0) / l;
    this.#p01 = (this.#p01 - k0 * px1) / l;
    this.#p11 = (this.#p11 - k1 * px1) / l;
    const tr = this.#p00 + this.#p11;
    if (tr > this.#pMax) {
      const s = this.#pMax / tr;
      this.#p00 *= s;
      this.#p01 *= s;
      this.#p11 *= s;
    }
    if (this.a < 0) this.a = 0;
    if (this.b < 0) this.b = 0;
    this.n++;
  }
}

/**
 * Three-coefficient recursive least squares: y ≈ a + b·x + c·z, with the same
 * forgetting, residual clip, covariance bound and non-negative coefficients
 * as Rls2. The TTFT model's form: x = the request's own prefill work, z = the
 * work queued ahead of it. An engine that prefills one request after another
 * has b ≈ c; one that prefills several at once has c well below b (a request
 * ahead slows this one only by its share of the batch), which one work total
 * cannot express. Storage: a 3×3 covariance in a Float64Array made once.
 */
export class Rls3 {
  a: number;
  b: number;
  c: number;
  readonly #p = new Float64Array(9);
  readonly #lambda: number;
  readonly #pMax: number;
  #scale: number;
  n = 0;

  constructor(a: number, b: number, c: number, varA: number, varB: number, varC: number, lambda: number, scale = 0.5 * Math.abs(a)) {
    this.a = a;
    this.b = b;
    this.c = c;
    this.#p[0] = varA;
    this.#p[4] = varB;
    this.#p[8] = varC;
    this.#lambda = lambda;
    this.#pMax = 4 * (varA + varB + varC);
    this.#scale = Math.max(1e-3, scale);
  }

  /** a + b·x + c·z (z defaults to 0: the prediction for a request with nothing ahead). */
  predict(x: number, z = 0): number {
    return this.a + this.b * x + this.c * z;
  }

  update(x: number, z: number, y: number): void {
    if (!(y >= 0) || !Number.isFinite(y) || !Number.isFinite(x) || !Number.isFinite(z)) return;
    const P = this.#p;
    const l = this.#lambda;
    // Px with the feature vector (1, x, z)
    const q0 = P[0] + P[1] * x + P[2] * z;
    const q1 = P[3] + P[4] * x + P[5] * z;
    const q2 = P[6] + P[7] * x + P[8] * z;
    const denom = l + q0 + x * q1 + z * q2;
    const k0 = q0 / denom;
    const k1 = q1 / denom;
    const k2 = q2 / denom;
    const r = y - (this.a + this.b * x + this.c * z);
    const e = clipResidual(r, this.#scale);
    this.#scale = nextScale(this.#scale, r);
    this.a += k0 * e;
    this.b += k1 * e;
    this.c += k2 * e;
    // P ← (P − k qᵀ) / λ (P symmetric, so qᵀ = xᵀP)
    P[0] = (P[0] - k0 * q0) / l;
    P[1] = (P[1] - k0 * q1) / l;
    P[2] = (P[2] - k0 * q2) / l;
    P[3] = (P[3] - k1 * q0) / l;
    P[4] = (P[4] - k1 * q1) / l;
    P[5] = (P[5] - k1 * q2) / l;
    P[6] = (P[6] - k2 * q0) / l;
    P[7] = (P[7] - k2 * q1) / l;
    P[8] = (P[8] - k2 * q2) / l;
    const tr = P[0] + P[4] + P[8];
    if (tr > this.#pMax) {
      const s = this.#pMax / tr;
      for (let i = 0; i < 9; i++) P[i] *= s;
    }
    if (this.a < 0) this.a = 0;
    if (this.b < 0) this.b = 0;
    if (this.c < 0) this.c = 0;
    this.n++;
  }
}

/** Prediction error statistics of one quantity (TTFT or TPOT) at one endpoint. */
export class ErrorStats {
  count = 0;
  /** Sum of (predicted − observed), ms: the bias is sum / count. */
  signedSum = 0;
  absSum = 0;
  readonly #ape = new Float64Array(256);
  #next = 0;

  add(predicted: number, observed: number): void {
    const e = predicted - observed;
    this.count++;
    this.signedSum += e;
    this.absSum += e < 0 ? -e : e;
    if (observed > 0) {
      this.#ape[this.#next] = (e < 0 ? -e : e) / observed;
      this.#next = (this.#next + 1) & 255;
    }
  }

  /** Median absolute percentage error (as a ratio) over the last 256 observations; NaN before any. */
  medianApe(): number {
    const n = Math.min(this.count, 256);
    if (n === 0) return NaN;
    const v = Float64Array.prototype.slice.call(this.#ape, 0, n).sort();
    return n % 2 === 1 ? v[(n - 1) >> 1] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
}

/** Reference costs of the `nvidia` profile (the simulator's defaults at 4 bytes per token); an endpoint's priors multiply them by its cost factors. */
export interface LatencyPriors {
  /** TTFT of an idle endpoint with nothing to prefill, ms. */
  ttftBaseMs: number;
  /** Prefill cost per uncached prompt kilobyte, ms. */
  prefillMsPerKB: number;
  /** Inter-token latency with a batch of one, ms. */
  itlMs: number;
  /** ITL growth per additional running request, ms. */
  itlPerRunningMs: number;
  /** RLS forgetting factor in (0, 1]. */
  forgetting: number;
}

export const DEFAULT_LATENCY_PRIORS: LatencyPriors = Object.freeze({
  ttftBaseMs: 5,
  prefillMsPerKB: 12.5,
  itlMs: 10,
  itlPerRunningMs: 0.1,
  forgetting: 0.98,
});

export class LatencyModel {
  /** TTFT ≈ a + b × own KB + c × KB queued ahead. */
  readonly ttft: Rls3;
  readonly tpot: Rls2;
  readonly ttftErr = new ErrorStats();
  readonly tpotErr = new ErrorStats();
  /** Uncached prompt bytes of the router's requests dispatched here that have not produced a first token. */
  pendingBytes = 0;
  /** Those requests. */
  pendingReqs = 0;
  /** Running mean of a request's uncached bytes (prices a foreign waiting request). */
  meanBytes = 0;

  constructor(priors: LatencyPriors, prefillCostFactor: number, decodeCostFactor: number) {
    const a = priors.ttftBaseMs * prefillCostFactor;
    const b = priors.prefillMsPerKB * prefillCostFactor;
    // the queue coefficient starts as a serial engine's (c = b), wide enough that a parallel engine's is learnt in tens of requests;
    // the clip starts at the prior's TTFT of a kilobyte-sized prompt, so a prior several times off is corrected within a few samples
    this.ttft = new Rls3(a, b, b, Math.max(1, a * a), Math.max(0.01, b * b), Math.max(0.01, b * b), priors.forgetting, a + b);
    const c = priors.itlMs * decodeCostFactor;
    const d = priors.itlPerRunningMs * decodeCostFactor;
    this.tpot = new Rls2(c, d, Math.max(1, c * c), Math.max(0.01, (c / 10) ** 2), priors.forgetting);
  }

  /** Prefill work (KB) queued ahead of a new request here: the router's pending bytes and `foreignWaiting` requests of other clients at the mean size. */
  ahead(foreignWaiting: number): number {
    return (this.pendingBytes + foreignWaiting * this.meanBytes) / 1000;
  }

  dispatched(uncachedBytes: number): void {
    this.pendingBytes += uncachedBytes;
    this.pendingReqs++;
    this.meanBytes += 0.05 * (uncachedBytes - this.meanBytes);
  }

  /** The request no longer waits for its prefill (first token, or it ended). */
  prefilled(uncachedBytes: number): void {
    this.pendingBytes -= uncachedBytes;
    if (this.pendingBytes < 0.5) this.pendingBytes = 0;
    if (this.pendingReqs > 0) this.pendingReqs--;
  }
}
