// Scorer `running-requests`: the requests the engine runs (vllm:num_requests_running,
// sglang:num_running_reqs) from the last scrape, plus the requests this router
// sent there since that scrape (up to its own in-flight count). A decode
// endpoint's inter-token latency grows with its batch, so for the decode leg of
// a disaggregated request fewer running requests is better (the default decode
// profile, docs/disaggregation.md). When the metrics are stale or missing: the
// router's own in-flight count. Fewest scores 1, most 0 (min-max over the candidates).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Scorer } from '../types.js';
import { ensure, inverseMinMax } from './score-util.js';

export class RunningRequestsScorer implements Scorer {
  readonly type = 'running-requests';
  readonly name = 'running-requests';
  #vals = new Float64Array(16);
  #out = new Float64Array(16);

  score(ctx: CycleContext, eps: readonly Endpoint[]): Float64Array {
    const n = eps.length;
    this.#vals = ensure(this.#vals, n);
    this.#out = ensure(this.#out, n);
    for (let i = 0; i < n; i++) {
      const ep = eps[i];
      this.#vals[i] = ep.fresh(ctx.now) ? ep.metrics.running + Math.min(ep.sinceScrape, ep.inFlight) : ep.inFlight;
    }
    inverseMinMax(this.#vals, n, this.#out);
    return this.#out;
  }
}

export const runningRequestsScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'running-requests',
  params: pluginParams({}),
  create: () => new RunningRequestsScorer(),
};
