// Filter `model`: keeps endpoints whose pool serves the requested model.
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Filter } from '../types.js';
import { keepIf } from './filter-base.js';

export class ModelFilter implements Filter {
  readonly type = 'model';
  readonly name = 'model';
  readonly #scratch: Endpoint[] = [];
  #model = '';
  readonly #pass = (ep: Endpoint): boolean => ep.models.includes(this.#model);

  filter(ctx: CycleContext, eps: readonly Endpoint[]): readonly Endpoint[] {
    this.#model = ctx.request.model;
    return keepIf(eps, this.#scratch, this.#pass);
  }
}

export const modelFilter: PluginFactory<'filter'> = {
  kind: 'filter',
  type: 'model',
  params: pluginParams({}),
  create: () => new ModelFilter(),
};
