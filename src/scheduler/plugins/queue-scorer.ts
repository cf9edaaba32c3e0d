// Scorer `queue`: the work waiting at each endpoint in expected milliseconds,
// not in requests (docs/scheduling.md, "Load in expected seconds"):
//
//   value = b × (P + X × T + u) / 1000
//
//   P  prefill tokens the router (and its active-active replicas) sent there
//      that have not had a first token (Endpoint.prefillPending, exact);
//   X  requests waiting at the engine that P does not count: the engine's
//      waiting count from the last scrape plus what the router sent since
//      (Endpoint.queueEstimate), less the router's own requests in P; each
//      priced at T, the endpoint's mean uncached prompt (foreign clients' load);
//   u  this request's prompt tokens (the same everywhere: on an equal pool it
//      changes nothing, on a mixed one it is what a slower engine costs more);
//   b  the endpoint's learned prefill cost, ms per thousand tokens
//      (Endpoint.speed, shrunk towards its peers while it has few samples and
//      bounded within 8× of them: src/endpoints/speed.ts).
//
// So a 3× slower engine's queue counts 3× and it takes about a third of a fast
// one's share under load; with equal engines b is common and this is the
// backlog in tokens. Shortest expected wait scores 1, longest 0 (min-max over
// the candidates). No allocation once the scratch arrays have grown.
//
// A candidate whose batch is full (Endpoint.occupancy at its learned or
// configured batch limit, else its pool's: score-util's BatchRoom, the prefix
// scorer's rule) while another has a free slot scores 0: a request
// there waits for a slot, which the prefill work above does not count
// (bench/RESULTS.md, 2026-12-08: small prompts on cheap-prefill engines piled
// 100 deep on one engine while the other had a free slot).
//
// params.unit: `expected-ms` (the default, above) or `requests` (the engine's
// waiting count plus the router's requests since the last scrape, as before
// issue 34: a baseline for benchmarks, or a fleet where speed must not count).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { expectedMsPerKTok } from '../../endpoints/speed.js';
import { z } from '../../config/schema-kit.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Scorer } from '../types.js';
import { BatchRoom, ensure, inverseMinMax, requestTokens } from './score-util.js';

export class QueueScorer implements Scorer {
  readonly type = 'queue';
  readonly name = 'queue';
  #b = new Float64Array(16);
  #vals = new Float64Array(16);
  #out = new Float64Array(16);
  readonly #requests: boolean;
  /** Which candidates' batches are full (the prefix scorer's rule: a pool's learned limit stands for its engines that have not queued yet). */
  readonly #room = new BatchRoom();

  constructor(unit: 'expected-ms' | 'requests' = 'expected-ms') {
    this.#requests = unit === 'requests';
  }

  score(ctx: CycleContext, eps: readonly Endpoint[]): Float64Array {
    const n = eps.length;
    const b = (this.#b = ensure(this.#b, n));
    const vals = (this.#vals = ensure(this.#vals, n));
    const out = (this.#out = ensure(this.#out, n));
    if (this.#requests) {
      for (let i = 0; i < n; i++) vals[i] = eps[i]!.queueEstimate(ctx.now);
      inverseMinMax(vals, n, out);
      return out;
    }
    expectedMsPerKTok(eps, n, b);
    const u = requestTokens(ctx.request);
    for (let i = 0; i < n; i++) {
      const ep = eps[i]!;
      const extra = ep.queueEstimate(ctx.now) - ep.prefillRequests - ep.peerPrefillRequests;
      const w = ep.prefillPending + ep.peerPrefillPending + (extra > 0 ? extra * ep.speed.meanTokens : 0) + u;
      vals[i] = (b[i]! * w) / 1000;
    }
    // A full batch: what waits there waits for a running request to end (its
    // decode), which the prefill work above does not count; on an engine with
    // cheap prefill a long queue of small prompts would read as short. While
    // another candidate has a free slot, a full one scores as the longest wait.
    if (n > 1 && this.#room.fill(eps, n, ctx.now)) {
      const isFull = this.#room.isFull;
      let worst = 0;
      for (let i = 0; i < n; i++) if (vals[i]! > worst) worst = vals[i]!;
      for (let i = 0; i < n; i++) if (isFull[i] === 1) vals[i] = worst + 1;
    }
    inverseMinMax(vals, n, out);
    return out;
  }
}

export const queueScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'queue',
  params: pluginParams({
    unit: z.enum(['expected-ms', 'requests'], { error: 'must be expected-ms or requests' }).optional().describe('expected-ms (default): queued work × the learned speed; requests: the waiting count'),
  }),
  create: (p) => new QueueScorer((p.unit as 'expected-ms' | 'requests' | undefined) ?? 'expected-ms'),
};
