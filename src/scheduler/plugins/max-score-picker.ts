// Picker `max-score`: the highest total score; ties (within `epsilon`) broken
// uniformly at random, without allocating (reservoir sampling over the ties).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { knownParams, numParam, type PluginFactory } from '../registry.js';
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
    let best = 0;
    let bestScore = -Infinity;
    let ties = 0;
    for (let i = 0; i < eps.length; i++) {
      const s = scores[i];
      if (s > bestScore + this.#eps) {
        best = i;
        bestScore = s;
        ties = 1;
      } else if (s >= bestScore - this.#eps) {
        ties++;
        if (this.#random() * ties < 1) best = i;
      }
    }
    return best;
  }
}

export const maxScorePicker: PluginFactory<'picker'> = {
  kind: 'picker',
  type: 'max-score',
  validate: (p) => {
    const out: string[] = [];
    knownParams(p, ['epsilon'], out);
    numParam(p, 'epsilon', 0, 1, out);
    return out;
  },
  create: (p, env) => new MaxScorePicker(env.random, (p.epsilon as number | undefined) ?? 1e-9),
};
