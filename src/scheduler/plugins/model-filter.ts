// Filter `model`: keeps endpoints whose pool serves the requested model and
// whose engine does (its /v1/models, read by the data layer, lists it). For
// a LoRA adapter: endpoints of its base model whose engine holds the adapter,
// or whose pool loads adapters on demand (pools[].adapterLoading).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Filter, PluginEnv } from '../types.js';
import { keepIf } from './filter-base.js';

export class ModelFilter implements Filter {
  readonly type = 'model';
  readonly name = 'model';
  readonly #scratch: Endpoint[] = [];
  readonly #env: PluginEnv | null;
  #model = '';
  #base = '';
  #now = 0;
  // and whose engine lists it in its /v1/models (an engine serving another model would answer 404)
  readonly #pass = (ep: Endpoint): boolean => ep.models.includes(this.#model) && (ep.missingModels === null || !ep.missingModels.includes(this.#model));
  readonly #passAdapter = (ep: Endpoint): boolean => ep.serves(this.#base) && (ep.adapters.has(this.#model) || ep.canLoad(this.#model, this.#now));

  constructor(env: PluginEnv | null = null) {
    this.#env = env;
  }

  filter(ctx: CycleContext, eps: readonly Endpoint[]): readonly Endpoint[] {
    const m = (this.#model = ctx.request.model);
    const base = eps.length > 0 && !eps[0].models.includes(m) ? this.#env?.endpoints.baseOf(m) : undefined;
    if (base !== undefined) {
      this.#base = base;
      this.#now = ctx.now;
      return keepIf(eps, this.#scratch, this.#passAdapter);
    }
    return keepIf(eps, this.#scratch, this.#pass);
  }
}

export const modelFilter: PluginFactory<'filter'> = {
  kind: 'filter',
  type: 'model',
  params: pluginParams({}),
  create: (_p, env) => new ModelFilter(env),
};
