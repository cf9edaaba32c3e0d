// Scorer `load`: the router's own in-flight count per endpoint (always fresh),
// plus its active-active replicas' (Endpoint.peerInFlight, as of their last
// reports), each request weighted by the endpoint's learned prefill cost
// (Endpoint.speed, shrunk and bounded: src/endpoints/speed.ts): requests in
// expected time, so a 3× slower engine's requests count 3×. Fewest scores 1,
// most scores 0 (min-max over the candidates).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { expectedMsPerKTok } from '../../endpoints/speed.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Scorer } from '../types.js';
import { ensure, inverseMinMax } from './score-util.js';

export class LoadScorer implements Scorer {
  readonly type = 'load';
  readonly name = 'load';
  #b = new Float64Array(16);
  #out = new Float64Array(16);

  score(_ctx: CycleContext, eps: readonly Endpoint[]): Float64Array {
    const n = eps.length;
    const b = (this.#b = ensure(this.#b, n));
    const out = (this.#out = ensure(this.#out, n));
    expectedMsPerKTok(eps, n, b);
    for (let i = 0; i < n; i++) b[i] = b[i]! * (eps[i]!.inFlight + eps[i]!.peerInFlight);
    inverseMinMax(b, n, out);
    return out;
  }
}

export const loadScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'load',
  params: pluginParams({}),
  create: () => new LoadScorer(),
};
