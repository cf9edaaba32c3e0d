// Scorer `load`: the router's own in-flight count per endpoint (always fresh).
// Fewest in flight scores 1, most scores 0 (min-max over the candidates).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Scorer } from '../types.js';
import { ensure, inverseMinMax } from './score-util.js';

export class LoadScorer implements Scorer {
  readonly type = 'load';
  readonly name = 'load';
  #vals = new Float64Array(16);
  #out = new Float64Array(16);

  score(_ctx: CycleContext, eps: readonly Endpoint[]): Float64Array {
    const n = eps.length;
    this.#vals = ensure(this.#vals, n);
    this.#out = ensure(this.#out, n);
    for (let i = 0; i < n; i++) this.#vals[i] = eps[i].inFlight;
    inverseMinMax(this.#vals, n, this.#out);
    return this.#out;
  }
}

export const loadScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'load',
  params: pluginParams({}),
  create: () => new LoadScorer(),
};
