// Picker `max-score`: the highest total score; ties (within `epsilon` of the
// highest) broken uniformly at random, without allocating: one pass finds the
// highest, a second samples the ties (reservoir sampling).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { numberParam, pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Picker } from '../types.js';

export class MaxScorePicker implements Picker {
  readonly type = 'max-score';
  readonly name = 'max-score';
  readonly #random: () => number;
  readonly #eps: number;
  constructor(random: () => number, epsilon: number) {
    this.#random = random;
    this.#eps = epsilon;
  }

  pick(_ctx: CycleContext, eps: readonly Endpoint[], scores: Float64Array): number {
    const n = eps.length;
    let max = -Infinity;
    for (let i = 0; i < n; i++) if (scores[i] > max) max = scores[i];
    const floor = max - this.#eps;
    let best = 0;
    let ties = 0;
    for (let i = 0; i < n; i++) {
      if (scores[i] >= floor) {
        ties++;
        if (ties === 1 || this.#random() * ties < 1) best = i;
      }
    }
    return best;
  }
}

export const maxScorePicker: PluginFactory<'picker'> = {
  kind: 'picker',
  type: 'max-score',
  params: pluginParams({ epsilon: numberParam(0, 1).optional() }),
  create: (p, env) => new MaxScorePicker(env.random, (p.epsilon as number | undefined) ?? 1e-9),
};
