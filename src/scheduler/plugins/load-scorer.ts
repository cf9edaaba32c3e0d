// Scorer `load`: the router's own in-flight count per endpoint (always fresh),
// plus its active-active replicas' (Endpoint.peerInFlight, as of their last reports).
// Fewest in flight scores 1, most scores 0 (min-max over the candidates).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import { FewestScorer } from './score-util.js';

export class LoadScorer extends FewestScorer {
  readonly type = 'load';
  readonly name = 'load';

  protected value(ep: Endpoint): number {
    return ep.inFlight + ep.peerInFlight;
  }
}

export const loadScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'load',
  params: pluginParams({}),
  create: () => new LoadScorer(),
};
