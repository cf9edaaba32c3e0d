// Scorer `running-requests`: the requests the engine runs (vllm:num_requests_running,
// sglang:num_running_reqs) from the last scrape, plus the requests this router
// sent there since that scrape (up to its own in-flight count). A decode
// endpoint's inter-token latency grows with its batch, so for the decode leg of
// a disaggregated request fewer running requests is better (the default decode
// profile, docs/disaggregation.md). When the metrics are stale or missing: the
// router's own in-flight count (both with its active-active replicas' share, Endpoint.peer*). Fewest scores 1, most 0 (min-max over the candidates).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import { FewestScorer } from './score-util.js';

export class RunningRequestsScorer extends FewestScorer {
  readonly type = 'running-requests';
  readonly name = 'running-requests';

  protected value(ep: Endpoint, now: number): number {
    return ep.fresh(now) ? ep.metrics.running + Math.min(ep.sinceScrape, ep.inFlight) + ep.peerUnseen : ep.inFlight + ep.peerInFlight;
  }
}

export const runningRequestsScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'running-requests',
  params: pluginParams({}),
  create: () => new RunningRequestsScorer(),
};
