// Picker `least-request` (baseline): ignores scores; the candidate with the
// fewest requests in flight from this router and its active-active replicas
// (Endpoint.fleetInFlight), ties broken at random.
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Picker } from '../types.js';

export class LeastRequestPicker implements Picker {
  readonly type = 'least-request';
  readonly name = 'least-request';
  readonly #random: () => number;
  constructor(random: () => number) {
    this.#random = random;
  }

  pick(_ctx: CycleContext, eps: readonly Endpoint[]): number {
    let best = 0;
    let bestLoad = Infinity;
    let ties = 0;
    for (let i = 0; i < eps.length; i++) {
      const l = eps[i].inFlight + eps[i].peerInFlight;
      if (l < bestLoad) {
        best = i;
        bestLoad = l;
        ties = 1;
      } else if (l === bestLoad) {
        ties++;
        if (this.#random() * ties < 1) best = i;
      }
    }
    return best;
  }
}

export const leastRequestPicker: PluginFactory<'picker'> = {
  kind: 'picker',
  type: 'least-request',
  params: pluginParams({}),
  create: (_p, env) => new LeastRequestPicker(env.random),
};
