// Every built-in scheduler plugin, registered in one place.
import { PluginRegistry } from './registry.js';
import { modelFilter } from './plugins/model-filter.js';
import { healthyFilter } from './plugins/healthy-filter.js';
import { roleFilter } from './plugins/role-filter.js';
import { sessionAffinityFilter } from './plugins/session-affinity-filter.js';
import { prefixCacheScorer } from './plugins/prefix-cache-scorer.js';
import { queueScorer } from './plugins/queue-scorer.js';
import { kvCacheScorer } from './plugins/kv-cache-scorer.js';
import { loadScorer } from './plugins/load-scorer.js';
import { runningRequestsScorer } from './plugins/running-requests-scorer.js';
import { predictedLatencyScorer } from './plugins/predicted-latency-scorer.js';
import { maxScorePicker } from './plugins/max-score-picker.js';
import { weightedRandomPicker } from './plugins/weighted-random-picker.js';
import { roundRobinPicker } from './plugins/round-robin-picker.js';
import { leastRequestPicker } from './plugins/least-request-picker.js';

export function builtinRegistry(): PluginRegistry {
  return new PluginRegistry()
    .register(modelFilter)
    .register(healthyFilter)
    .register(roleFilter)
    .register(sessionAffinityFilter)
    .register(prefixCacheScorer)
    .register(queueScorer)
    .register(kvCacheScorer)
    .register(loadScorer)
    .register(runningRequestsScorer)
    .register(predictedLatencyScorer)
    .register(maxScorePicker)
    .register(weightedRandomPicker)
    .register(roundRobinPicker)
    .register(leastRequestPicker);
}

/** The shared registry used by the config loader and createScheduler. */
export const registry = builtinRegistry();
