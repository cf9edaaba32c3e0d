// Scorer `queue`: the engine's waiting-queue length (vllm:num_requests_waiting,
// sglang:num_queue_reqs) from the last scrape plus the requests this router
// sent there since that scrape (which the engine's figures cannot show yet:
// a burst between two scrapes would otherwise see equal queues everywhere).
// When the metrics are stale or missing: the router's own in-flight count.
// Shortest queue scores 1, longest 0 (min-max over the candidates).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import { FewestScorer } from './score-util.js';

export class QueueScorer extends FewestScorer {
  readonly type = 'queue';
  readonly name = 'queue';

  protected value(ep: Endpoint, now: number): number {
    return ep.queueEstimate(now);
  }
}

export const queueScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'queue',
  params: pluginParams({}),
  create: () => new QueueScorer(),
};
