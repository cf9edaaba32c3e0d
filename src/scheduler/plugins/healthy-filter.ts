// Filter `healthy`: drops endpoints whose /health check failed or whose
// circuit breaker is open. Unknown health (not checked yet) passes.
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Filter } from '../types.js';
import { keepIf } from './filter-base.js';

export class HealthyFilter implements Filter {
  readonly type = 'healthy';
  readonly name = 'healthy';
  readonly #scratch: Endpoint[] = [];
  #now = 0;
  readonly #pass = (ep: Endpoint): boolean => ep.routable(this.#now);

  filter(ctx: CycleContext, eps: readonly Endpoint[]): readonly Endpoint[] {
    this.#now = ctx.now;
    return keepIf(eps, this.#scratch, this.#pass);
  }
}

export const healthyFilter: PluginFactory<'filter'> = {
  kind: 'filter',
  type: 'healthy',
  params: pluginParams({}),
  create: () => new HealthyFilter(),
};
