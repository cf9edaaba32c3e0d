// Picker `weighted-random`: picks endpoint i with probability score_i / Σ scores
// (uniformly when every score is 0).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Picker } from '../types.js';

export class WeightedRandomPicker implements Picker {
  readonly type = 'weighted-random';
  readonly name = 'weighted-random';
  readonly #random: () => number;
  constructor(random: () => number) {
    this.#random = random;
  }

  pick(_ctx: CycleContext, eps: readonly Endpoint[], scores: Float64Array): number {
    const n = eps.length;
    let sum = 0;
    for (let i = 0; i < n; i++) sum += scores[i] > 0 ? scores[i] : 0;
    if (!(sum > 0)) return Math.min(n - 1, Math.floor(this.#random() * n));
    let r = this.#random() * sum;
    for (let i = 0; i < n; i++) {
      const s = scores[i] > 0 ? scores[i] : 0;
      if (r < s) return i;
      r -= s;
    }
    for (let i = n - 1; i >= 0; i--) if (scores[i] > 0) return i;
    return n - 1;
  }
}

export const weightedRandomPicker: PluginFactory<'picker'> = {
  kind: 'picker',
  type: 'weighted-random',
  params: pluginParams({}),
  create: (_p, env) => new WeightedRandomPicker(env.random),
};
