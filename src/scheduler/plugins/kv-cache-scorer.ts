// Scorer `kv-cache-utilization`: 1 - KV-cache usage (vllm:kv_cache_usage_perc,
// old vllm:gpu_cache_usage_perc, sglang:token_usage). When an endpoint's
// metrics are stale or it reports no usage, its score comes from the router's
// in-flight count instead (its own and its active-active replicas'):
// 1 - inFlight / (max in-flight over candidates + 1).
import type { Endpoint } from '../../endpoints/endpoint.js';
import { pluginParams, type PluginFactory } from '../registry.js';
import type { CycleContext, Scorer } from '../types.js';
import { ensure } from './score-util.js';

export class KvCacheScorer implements Scorer {
  readonly type = 'kv-cache-utilization';
  readonly name = 'kv-cache-utilization';
  #out = new Float64Array(16);

  score(ctx: CycleContext, eps: readonly Endpoint[]): Float64Array {
    const n = eps.length;
    const out = (this.#out = ensure(this.#out, n));
    let maxInFlight = 0;
    for (let i = 0; i < n; i++) {
      const f = eps[i].inFlight + eps[i].peerInFlight;
      if (f > maxInFlight) maxInFlight = f;
    }
    for (let i = 0; i < n; i++) {
      const ep = eps[i];
      const kv = ep.metrics.kvUsage;
      out[i] = ep.fresh(ctx.now) && kv === kv ? 1 - kv : 1 - (ep.inFlight + ep.peerInFlight) / (maxInFlight + 1);
    }
    return out;
  }
}

export const kvCacheScorer: PluginFactory<'scorer'> = {
  kind: 'scorer',
  type: 'kv-cache-utilization',
  params: pluginParams({}),
  create: () => new KvCacheScorer(),
};
