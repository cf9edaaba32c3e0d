// Picker `round-robin` (baseline): ignores scores; cycles through the candidates.
// One turn counter per model: with a shared one, requests for two models that
// alternate would each always land on the same endpoint of their pool.
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Picker } from '../types.js';

export class RoundRobinPicker implements Picker {
  readonly type = 'round-robin';
  readonly name = 'round-robin';
  /** Next turn per model (bounded by the configured models: the scheduler never picks for an unknown one). */
  readonly #next = new Map<string, number>();

  pick(ctx: CycleContext, eps: readonly Endpoint[]): number {
    const model = ctx.request.model;
    const next = this.#next.get(model) ?? 0;
    this.#next.set(model, (next + 1) % 0x7fffffff);
    return next % eps.length;
  }
}

export const roundRobinPicker: PluginFactory<'picker'> = {
  kind: 'picker',
  type: 'round-robin',
  params: pluginParams({}),
  create: () => new RoundRobinPicker(),
};
