// Filter `model`: keeps endpoints whose pool serves the requested model and
// whose engine does (its /v1/models, read by the data layer, lists it).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Filter } from '../types.js';
import { keepIf } from './filter-base.js';

export class ModelFilter implements Filter {
  readonly type = 'model';
  readonly name = 'model';
  readonly #scratch: Endpoint[] = [];
  #model = '';
  // and whose engine lists it in its /v1/models (an engine serving another model would answer 404)
  readonly #pass = (ep: Endpoint): boolean => ep.models.includes(this.#model) && (ep.missingModels === null || !ep.missingModels.includes(this.#model));

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
