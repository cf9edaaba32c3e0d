// Scorer `predicted-latency`: scores each candidate by its predicted time to
// first token and time per output token against the request's objectives.
//
//   predicted TTFT = a + b × U + c × Q
//                       U = this request's uncached KB (prompt bytes − the
//                           prefix producer's matched blocks × block size)
//                       Q = the prefill work queued ahead at the endpoint
//                           (uncached KB of the router's requests there
//                           without a first token, plus other clients'
//                           waiting requests at the mean size)
//                       (serial prefill: b = c; parallel prefill: c < b)
//   predicted TPOT = c + d × R   R = requests decoding there, plus this one
//
// with (a, b, c, d) each endpoint's LatencyModel (src/endpoints/
// latency-model.ts), seeded from its pool's accelerator profile or speed and
// learned from the first tokens and streams the director reports.
//
// Objectives: the request's x-slo-ttft-ms / x-slo-tpot-ms (SchedRequest
// sloTtftMs / sloTpotMs), else its band's defaults (params.bands), else
// params.ttftMs / tpotMs (0 = none). Scores (higher is better):
//   - candidates predicted to meet every objective: 0.5 + 0.3 × (cheapest
//     pool cost / this cost) + 0.2 × TTFT headroom share: the cheapest that
//     meets it wins, the most headroom among equally cheap ones;
//   - the others: 0.45 × (fastest predicted / this predicted): when none can
//     meet it the fastest wins (and the pick counts a predicted SLO miss);
//   - with no objective at all: fastest predicted / this predicted.
// The margin is not fixed: margin + the recent miss rate of requests that
// were predicted to meet their objective (EWMA, ~50 requests), at most 0.6.
// Past the capacity cliff (the recent miss rate of all requests with an
// objective above 0.15) the default load score (the `queue` scorer: queued
// work in expected ms) is blended in with weight β = (miss − 0.15) / 0.25,
// up to 1: where no prediction can help, the pick is the default's.
// Composes with other scorers through the profile's weights like any scorer.
import { performance } from 'node:perf_hooks';
import { Counter, Gauge, type Registry } from 'prom-client';
import type { Endpoint } from '../../endpoints/endpoint.js';
import { DEFAULT_LATENCY_PRIORS, LatencyModel, type LatencyPriors } from '../../endpoints/latency-model.js';
import { z } from '../../config/schema-kit.js';
import { numberParam, pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, LatencyNote, PluginEnv, Scorer } from '../types.js';
import { ensure } from './score-util.js';
import { QueueScorer } from './queue-scorer.js';

export interface BandSlo {
  ttftMs?: number;
  tpotMs?: number;
}

export interface PredictedLatencyParams extends Partial<LatencyPriors> {
  /** Default TTFT objective, ms (0 = none). */
  ttftMs?: number;
  tpotMs?: number;
  /** Per flow-control band defaults (band name → objectives). */
  bands?: Record<string, BandSlo>;
  /** Share of an objective kept as a safety margin: a candidate meets it when predicted ≤ (1 − margin) × objective. */
  margin?: number;
}

/** Counters per band: TTFT met, missed; TPOT met, missed; predicted misses at the pick. */
const C_TTFT_MET = 0;
const C_TTFT_MISSED = 1;
const C_TPOT_MET = 2;
const C_TPOT_MISSED = 3;
const C_PREDICTED_MISS = 4;
const C_N = 5;
/** Weight of one observation in the recent miss rates (~50 requests of memory). */
const MISS_ALPHA = 0.02;
/** The margin grows by this times the miss rate of requests predicted to meet their objective, up to MAX_MARGIN. */
const MARGIN_GAIN = 1;
const MAX_MARGIN = 0.6;
/** Above this recent miss rate the default load score is blended in, wholly at BLEND_FULL. */
const BLEND_FROM = 0.15;
const BLEND_FULL = 0.4;
/** Most band labels kept apart; further band names count under "other". */
const MAX_BANDS = 32;

export class PredictedLatencyScorer implements Scorer {
  readonly type = 'predicted-latency';
  readonly name = 'predicted-latency';
  readonly usesPrefix = true;
  readonly usesLatency = true;
  readonly #endpoints: readonly Endpoint[];
  readonly #blockSize: number;
  readonly #defTtft: number;
  readonly #defTpot: number;
  /** 1 − margin: the share of an objective a prediction may use (the margin grows with the measured miss rate). */
  #within: number;
  readonly #baseMargin: number;
  #marginNow: number;
  /** EWMA of TTFT misses among requests with an objective, and among those predicted to meet it. */
  #missRate = 0;
  #predMissRate = 0;
  /** The default load scorer (expected ms of queued work): blended in when the miss rate says the model is past the cliff. */
  readonly #fallback = new QueueScorer();
  /** band name → index into #bandSlo / #counts ('' = no band: index 0). */
  readonly #bandIndex = new Map<string, number>([['', 0]]);
  readonly #bandNames: string[] = ['default'];
  #bandSlo = new Float64Array(2 * MAX_BANDS);
  readonly #counts = new Float64Array(C_N * (MAX_BANDS + 1));
  #ttft = new Float64Array(16);
  #tpot = new Float64Array(16);
  #out = new Float64Array(16);

  constructor(env: Pick<PluginEnv, 'endpoints' | 'prefixBlockSize'>, p: PredictedLatencyParams = {}) {
    this.#endpoints = env.endpoints.all;
    this.#blockSize = env.prefixBlockSize;
    const priors: LatencyPriors = { ...DEFAULT_LATENCY_PRIORS };
    for (const k of Object.keys(DEFAULT_LATENCY_PRIORS) as (keyof LatencyPriors)[]) if (p[k] !== undefined) priors[k] = p[k]!;
    // one model per endpoint, shared by every scheduler over the same set (the first one seeds it)
    for (const ep of env.endpoints.all) ep.latency ??= new LatencyModel(priors, ep.prefillCostFactor, ep.decodeCostFactor);
    this.#baseMargin = this.#marginNow = p.margin ?? 0.2;
    this.#within = 1 - this.#baseMargin;
    this.#defTtft = p.ttftMs ?? 0;
    this.#defTpot = p.tpotMs ?? 0;
    this.#bandSlo[0] = this.#defTtft;
    this.#bandSlo[1] = this.#defTpot;
    for (const [band, slo] of Object.entries(p.bands ?? {})) {
      const i = this.#band(band);
      this.#bandSlo[2 * i] = slo.ttftMs ?? this.#defTtft;
      this.#bandSlo[2 * i + 1] = slo.tpotMs ?? this.#defTpot;
    }
  }

  /** The counters' index of a band name (a new one gets the defaults), bounded. */
  #band(name: string): number {
    const i = this.#bandIndex.get(name);
    if (i !== undefined) return i;
    if (this.#bandNames.length >= MAX_BANDS) return this.#bandIndex.get('other') ?? this.#addBand('other');
    return this.#addBand(name);
  }

  #addBand(name: string): number {
    const i = this.#bandNames.length;
    this.#bandNames.push(name);
    this.#bandIndex.set(name, i);
    this.#bandSlo[2 * i] = this.#defTtft;
    this.#bandSlo[2 * i + 1] = this.#defTpot;
    return i;
  }

  #uncached(ctx: CycleContext, i: number): number {
    const bytes = ctx.request.prompt?.length ?? 0;
    const cached = ctx.promptBlocks > 0 ? ctx.prefixMatched[i] * this.#blockSize : 0;
    return bytes > cached ? bytes - cached : 0;
  }

  #predict(ctx: CycleContext, eps: readonly Endpoint[]): void {
    const n = eps.length;
    const ttft = (this.#ttft = ensure(this.#ttft, n));
    const tpot = (this.#tpot = ensure(this.#tpot, n));
    const now = ctx.now;
    for (let i = 0; i < n; i++) {
      const ep = eps[i];
      const m = ep.latency!;
      const fresh = ep.fresh(now);
      const foreignWaiting = fresh && ep.metrics.waiting > m.pendingReqs ? ep.metrics.waiting - m.pendingReqs : 0;
      ttft[i] = m.ttft.predict(this.#uncached(ctx, i) / 1000, m.ahead(foreignWaiting));
      tpot[i] = m.tpot.predict(running(ep, now) + 1);
    }
  }

  score(ctx: CycleContext, eps: readonly Endpoint[]): Float64Array {
    const n = eps.length;
    const out = (this.#out = ensure(this.#out, n));
    this.#predict(ctx, eps);
    const ttft = this.#ttft;
    const tpot = this.#tpot;
    const r = ctx.request;
    const bi = r.band ? this.#band(r.band) : 0;
    // the objectives less the safety margin
    const sloT = (r.sloTtftMs || this.#bandSlo[2 * bi]) * this.#within;
    const sloP = (r.sloTpotMs || this.#bandSlo[2 * bi + 1]) * this.#within;
    // "speed" of each candidate: predicted latency against the objective (or the fastest candidate)
    let minT = Infinity;
    let minP = Infinity;
    for (let i = 0; i < n; i++) {
      if (ttft[i] < minT) minT = ttft[i];
      if (tpot[i] < minP) minP = tpot[i];
    }
    const refT = sloT > 0 ? sloT : Math.max(minT, 1e-3);
    const refP = sloP > 0 ? sloP : Math.max(minP, 1e-3);
    let fastest = Infinity;
    let minCost = Infinity;
    let anyMeets = false;
    for (let i = 0; i < n; i++) {
      const slow = ttft[i] / refT + (sloP > 0 ? tpot[i] / refP : 0);
      out[i] = slow; // temporarily: the normalised predicted latency
      if (slow < fastest) fastest = slow;
      if ((sloT > 0 || sloP > 0) && meets(ttft[i], tpot[i], sloT, sloP)) {
        anyMeets = true;
        if (eps[i].cost < minCost) minCost = eps[i].cost;
      }
    }
    fastest = Math.max(fastest, 1e-9);
    for (let i = 0; i < n; i++) {
      const slow = Math.max(out[i], 1e-9);
      if (!anyMeets) out[i] = sloT > 0 || sloP > 0 ? 0.45 * (fastest / slow) : fastest / slow;
      else if (meets(ttft[i], tpot[i], sloT, sloP)) {
        const c = eps[i].cost;
        const cheap = c > 0 ? minCost / c : 1;
        const head = sloT > 0 ? (sloT - ttft[i]) / sloT : sloP > 0 ? (sloP - tpot[i]) / sloP : 0;
        out[i] = 0.5 + 0.3 * cheap + 0.2 * head;
      } else out[i] = 0.45 * (fastest / slow);
    }
    // past the capacity cliff (most recent requests missed): never below the default scorers' choice
    const miss = this.#missRate;
    if (miss > BLEND_FROM && (sloT > 0 || sloP > 0)) {
      const beta = miss >= BLEND_FULL ? 1 : (miss - BLEND_FROM) / (BLEND_FULL - BLEND_FROM);
      const q = this.#fallback.score(ctx, eps);
      for (let i = 0; i < n; i++) out[i] = (1 - beta) * out[i] + beta * q[i];
    }
    return out;
  }

  onDecision(ctx: CycleContext, ep: Endpoint, index: number, note: LatencyNote): void {
    const m = ep.latency!;
    const r = ctx.request;
    const bi = r.band ? this.#band(r.band) : 0;
    const sloT = r.sloTtftMs || this.#bandSlo[2 * bi];
    const sloP = r.sloTpotMs || this.#bandSlo[2 * bi + 1];
    const uncached = this.#uncached(ctx, index);
    const fresh = ep.fresh(ctx.now);
    const foreignWaiting = fresh && ep.metrics.waiting > m.pendingReqs ? ep.metrics.waiting - m.pendingReqs : 0;
    const ahead = m.ahead(foreignWaiting);
    note.latWork = ahead;
    note.latOwn = uncached / 1000;
    note.latPredTtftMs = m.ttft.predict(note.latOwn, ahead);
    note.latPredTpotMs = m.tpot.predict(running(ep, ctx.now) + 1);
    note.latSloTtftMs = sloT;
    note.latSloTpotMs = sloP;
    note.latBand = bi;
    note.latPending = uncached;
    m.dispatched(uncached);
    if ((sloT > 0 || sloP > 0) && !meets(note.latPredTtftMs, note.latPredTpotMs, sloT * this.#within, sloP * this.#within)) this.#counts[bi * C_N + C_PREDICTED_MISS]++;
  }

  onFirstToken(ep: Endpoint, note: LatencyNote, ms: number): void {
    const m = ep.latency!;
    if (note.latPending >= 0) {
      m.prefilled(note.latPending);
      note.latPending = -1; // prefilled: onEnd has nothing to release
    }
    m.ttftErr.add(note.latPredTtftMs, ms);
    m.ttft.update(note.latOwn, note.latWork, ms);
    note.latRunning = running(ep, performance.now());
    if (note.latSloTtftMs > 0) this.#observed(note, ms);
  }

  onStreamEnd(ep: Endpoint, note: LatencyNote, tokens: number, decodeMs: number): void {
    if (tokens < 1 || note.latPending !== -1) return;
    const m = ep.latency!;
    const tpot = decodeMs / tokens;
    m.tpotErr.add(note.latPredTpotMs, tpot);
    m.tpot.update(note.latRunning, tpot);
    if (note.latSloTpotMs > 0 && note.latBand >= 0) this.#counts[note.latBand * C_N + (tpot <= note.latSloTpotMs ? C_TPOT_MET : C_TPOT_MISSED)]++;
  }

  /**
   * A non-streamed answer: its total time is TTFT + (tokens − 1) × TPOT, one
   * equation in two unknowns. The TTFT model learns from it only when the
   * predicted decode part is at most a quarter of the total (short answers:
   * the TPOT model's error times the token count would otherwise land whole on
   * the TTFT estimate); the TPOT model never does (it would need the TTFT).
   */
  onAnswer(ep: Endpoint, note: LatencyNote, totalMs: number, tokens: number): void {
    if (note.latPending < 0 || tokens < 1) return;
    const decode = (tokens - 1) * note.latPredTpotMs;
    if (decode > 0.25 * totalMs) return;
    const m = ep.latency!;
    m.ttft.update(note.latOwn, note.latWork, totalMs - decode);
    // a one-token answer's whole time is its TTFT: an observation like a streamed first token (error statistics, SLO counts, miss rate)
    if (tokens === 1) {
      m.ttftErr.add(note.latPredTtftMs, totalMs);
      if (note.latSloTtftMs > 0) this.#observed(note, totalMs);
    }
  }

  /** An observed TTFT of a request with an objective: SLO counters and the recent miss rates. */
  #observed(note: LatencyNote, ms: number): void {
    const missed = ms > note.latSloTtftMs ? 1 : 0;
    if (note.latBand >= 0) this.#counts[note.latBand * C_N + (missed ? C_TTFT_MISSED : C_TTFT_MET)]++;
    this.#missRate += MISS_ALPHA * (missed - this.#missRate);
    // of the requests predicted to meet it (with the margin then in force): the model's own misses, which widen the margin
    if (note.latPredTtftMs <= note.latSloTtftMs * (1 - this.#margin)) this.#predMissRate += MISS_ALPHA * (missed - this.#predMissRate);
    this.#marginNow = Math.min(MAX_MARGIN, this.#baseMargin + MARGIN_GAIN * this.#predMissRate);
    this.#within = 1 - this.#marginNow;
  }

  /** The recent TTFT miss rate (all requests with an objective) and the margin in force (tests, metrics). */
  get missRate(): number {
    return this.#missRate;
  }

  get margin(): number {
    return this.#marginNow;
  }

  get #margin(): number {
    return this.#marginNow;
  }

  onEnd(ep: Endpoint, note: LatencyNote): void {
    // still counted as waiting for its prefill (no first token came: an error, an abort, a non-streamed answer)
    if (note.latPending >= 0) ep.latency!.prefilled(note.latPending);
    note.latPending = -1;
  }

  /** SLO counters of a band (tests, benchmarks): met / missed per objective, predicted misses. */
  sloCounts(band = ''): { ttftMet: number; ttftMissed: number; tpotMet: number; tpotMissed: number; predictedMiss: number } {
    const i = this.#bandIndex.get(band) ?? -1;
    const c = (k: number) => (i < 0 ? 0 : this.#counts[i * C_N + k]);
    return { ttftMet: c(C_TTFT_MET), ttftMissed: c(C_TTFT_MISSED), tpotMet: c(C_TPOT_MET), tpotMissed: c(C_TPOT_MISSED), predictedMiss: c(C_PREDICTED_MISS) };
  }

  registerMetrics(registry: Registry): void {
    const eps = this.#endpoints;
    const r = [registry];
    const perEp = (name: string, help: string, value: (m: LatencyModel) => number, extra: Record<string, string> = {}) =>
      new Gauge({
        name,
        help,
        labelNames: ['endpoint', ...Object.keys(extra)],
        registers: r,
        collect() {
          this.reset();
          for (const ep of eps) {
            const v = ep.latency ? value(ep.latency) : NaN;
            if (Number.isFinite(v)) this.set({ endpoint: ep.name, ...extra }, v);
          }
        },
      });
    perEp('switchyard_latency_ttft_error_ratio', 'Median absolute percentage error of the predicted TTFT (last 256 streamed requests), as a ratio.', (m) => m.ttftErr.medianApe());
    perEp('switchyard_latency_ttft_bias_ms', 'Mean predicted minus observed TTFT, ms (positive: the model is pessimistic).', (m) => (m.ttftErr.count > 0 ? m.ttftErr.signedSum / m.ttftErr.count : NaN));
    perEp('switchyard_latency_tpot_error_ratio', 'Median absolute percentage error of the predicted time per output token, as a ratio.', (m) => m.tpotErr.medianApe());
    perEp('switchyard_latency_tpot_bias_ms', 'Mean predicted minus observed time per output token, ms.', (m) => (m.tpotErr.count > 0 ? m.tpotErr.signedSum / m.tpotErr.count : NaN));
    new Gauge({
      name: 'switchyard_latency_model',
      help: "The endpoint's learned latency coefficients: TTFT base (ms) and prefill cost (ms per uncached KB), TPOT base (ms) and growth per running request (ms).",
      labelNames: ['endpoint', 'coefficient'],
      registers: r,
      collect() {
        this.reset();
        for (const ep of eps) {
          const m = ep.latency;
          if (!m) continue;
          this.set({ endpoint: ep.name, coefficient: 'ttft_base_ms' }, m.ttft.a);
          this.set({ endpoint: ep.name, coefficient: 'prefill_ms_per_kb' }, m.ttft.b);
          this.set({ endpoint: ep.name, coefficient: 'queue_ms_per_kb' }, m.ttft.c);
          this.set({ endpoint: ep.name, coefficient: 'tpot_base_ms' }, m.tpot.a);
          this.set({ endpoint: ep.name, coefficient: 'tpot_ms_per_running' }, m.tpot.b);
        }
      },
    });
    const self = this;
    new Gauge({
      name: 'switchyard_latency_margin_ratio',
      help: 'The safety margin in force: the configured margin plus the recent TTFT miss rate of requests predicted to meet their objective (capped at 0.6).',
      registers: r,
      collect() {
        this.set(self.margin);
      },
    });
    new Gauge({
      name: 'switchyard_slo_recent_miss_ratio',
      help: 'Recent TTFT miss rate of requests with an objective (about the last 50); above 0.15 the default load score is blended into predicted-latency, wholly at 0.4.',
      registers: r,
      collect() {
        this.set(self.missRate);
      },
    });
    const counts = this.#counts;
    const names = this.#bandNames;
    new Counter({
      name: 'switchyard_slo_requests_total',
      help: 'Streamed requests with an objective, by band, objective (ttft, tpot) and outcome (met, missed), as observed.',
      labelNames: ['band', 'objective', 'outcome'],
      registers: r,
      collect() {
        this.reset();
        for (let i = 0; i < names.length; i++) {
          const band = names[i];
          const b = i * C_N;
          if (counts[b + C_TTFT_MET] + counts[b + C_TTFT_MISSED] > 0) {
            this.inc({ band, objective: 'ttft', outcome: 'met' }, counts[b + C_TTFT_MET]);
            this.inc({ band, objective: 'ttft', outcome: 'missed' }, counts[b + C_TTFT_MISSED]);
          }
          if (counts[b + C_TPOT_MET] + counts[b + C_TPOT_MISSED] > 0) {
            this.inc({ band, objective: 'tpot', outcome: 'met' }, counts[b + C_TPOT_MET]);
            this.inc({ band, objective: 'tpot', outcome: 'missed' }, counts[b + C_TPOT_MISSED]);
          }
        }
      },
    });
    new Counter({
      name: 'switchyard_slo_predicted_miss_total',
      help: 'Requests no candidate endpoint was predicted to serve within their objectives (sent to the fastest), by band.',
      labelNames: ['band'],
      registers: r,
      collect() {
        this.reset();
        for (let i = 0; i < names.length; i++) if (counts[i * C_N + C_PREDICTED_MISS] > 0) this.inc({ band: names[i] }, counts[i * C_N + C_PREDICTED_MISS]);
      },
    });
  }
}

/** Requests decoding at `ep` now: the router's own past their first token, plus other clients' running ones while the metrics are fresh. */
function running(ep: Endpoint, now: number): number {
  const m = ep.latency!;
  const own = ep.inFlight - m.pendingReqs;
  const foreign = ep.fresh(now) && ep.metrics.running > ep.inFlight ? ep.metrics.running - ep.inFlight : 0;
  return (own > 0 ? own : 0) + foreign;
}

function meets(ttft: number, tpot: number, sloT: number, sloP: number): boolean {
  return (sloT <= 0 || ttft <= sloT) && (sloP <= 0 || tpot <= sloP);
}

const sloMs = () => numberParam(0, 3_600_000).optional();

export const predictedLatencyScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'predicted-latency',
  params: pluginParams({
    ttftMs: sloMs().describe('default TTFT objective, ms (0 = none); x-slo-ttft-ms overrides it per request'),
    tpotMs: sloMs().describe('default time-per-output-token objective, ms (0 = none); x-slo-tpot-ms overrides it'),
    bands: z
      .record(z.string().min(1), z.strictObject({ ttftMs: sloMs(), tpotMs: sloMs() }, { error: 'must be a mapping {ttftMs, tpotMs}' }), {
        error: 'must be a mapping of band name to {ttftMs, tpotMs}',
      })
      .optional()
      .describe('objectives per flow-control band (band name → {ttftMs, tpotMs}); a request\'s headers override them'),
    ttftBaseMs: numberParam(0, 1e6).optional().describe(`prior TTFT of an idle reference endpoint, ms (default ${DEFAULT_LATENCY_PRIORS.ttftBaseMs}); scaled by the pool's prefill cost factor`),
    prefillMsPerKB: numberParam(0, 1e6).optional().describe(`prior prefill cost per uncached prompt KB on the reference accelerator, ms (default ${DEFAULT_LATENCY_PRIORS.prefillMsPerKB})`),
    itlMs: numberParam(0, 1e6).optional().describe(`prior inter-token latency with a batch of one on the reference accelerator, ms (default ${DEFAULT_LATENCY_PRIORS.itlMs})`),
    itlPerRunningMs: numberParam(0, 1e6).optional().describe(`prior ITL growth per running request, ms (default ${DEFAULT_LATENCY_PRIORS.itlPerRunningMs})`),
    margin: numberParam(0, 0.9).optional().describe('share of an objective kept as a safety margin: a candidate meets it when predicted ≤ (1 − margin) × objective (default 0.2)'),
    forgetting: numberParam(0.5, 1).optional().describe(`RLS forgetting factor (default ${DEFAULT_LATENCY_PRIORS.forgetting}; 1 = never forget)`),
  }),
  create: (p, env) => new PredictedLatencyScorer(env, p as PredictedLatencyParams),
};
