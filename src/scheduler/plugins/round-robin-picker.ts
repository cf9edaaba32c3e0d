// Picker `round-robin` (baseline): ignores scores; cycles through the candidates.
import type { Endpoint } from '../../endpoints/endpoint.js';
import { knownParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Picker } from '../types.js';

export class RoundRobinPicker implements Picker {
  readonly type = 'round-robin';
  readonly name = 'round-robin';
  #next = 0;

  pick(_ctx: CycleContext, eps: readonly Endpoint[]): number {
    const i = this.#next % eps.length;
    this.#next = (this.#next + 1) % 0x7fffffff;
    return i;
  }
}

export const roundRobinPicker: PluginFactory<'picker'> = {
  kind: 'picker',
  type: 'round-robin',
  validate: (p) => {
    const out: string[] = [];
    knownParams(p, [], out);
    return out;
  },
  create: () => new RoundRobinPicker(),
};
