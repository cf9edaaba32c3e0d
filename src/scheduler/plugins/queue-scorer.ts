// Scorer `queue`: the engine's waiting-queue length (vllm:num_requests_waiting,
// sglang:num_queue_reqs) from the last scrape plus the requests this router
// sent there since that scrape (which the engine's figures cannot show yet:
// a burst between two scrapes would otherwise see equal queues everywhere).
// When the metrics are stale or missing: the router's own in-flight count.
// Shortest queue scores 1, longest 0 (min-max over the candidates).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Scorer } from '../types.js';
import { ensure, inverseMinMax } from './score-util.js';

export class QueueScorer implements Scorer {
  readonly type = 'queue';
  readonly name = 'queue';
  #vals = new Float64Array(16);
  #out = new Float64Array(16);

  score(ctx: CycleContext, eps: readonly Endpoint[]): Float64Array {
    const n = eps.length;
    this.#vals = ensure(this.#vals, n);
    this.#out = ensure(this.#out, n);
    for (let i = 0; i < n; i++) {
      const ep = eps[i];
      this.#vals[i] = ep.queueEstimate(ctx.now);
    }
    inverseMinMax(this.#vals, n, this.#out);
    return this.#out;
  }
}

export const queueScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'queue',
  params: pluginParams({}),
  create: () => new QueueScorer(),
};
