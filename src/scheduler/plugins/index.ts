// Every built-in scheduler plugin, registered in one place.
import { PluginRegistry } from '../registry.js';
import { modelFilter } from './model-filter.js';
import { healthyFilter } from './healthy-filter.js';
import { roleFilter } from './role-filter.js';
import { sessionAffinityFilter } from './session-affinity-filter.js';
import { prefixCacheScorer } from './prefix-cache-scorer.js';
import { queueScorer } from './queue-scorer.js';
import { kvCacheScorer } from './kv-cache-scorer.js';
import { loadScorer } from './load-scorer.js';
import { runningRequestsScorer } from './running-requests-scorer.js';
import { predictedLatencyScorer } from './predicted-latency-scorer.js';
import { loraAffinityScorer } from './lora-affinity-scorer.js';
import { maxScorePicker } from './max-score-picker.js';
import { weightedRandomPicker } from './weighted-random-picker.js';
import { roundRobinPicker } from './round-robin-picker.js';
import { leastRequestPicker } from './least-request-picker.js';

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
    .register(loraAffinityScorer)
    .register(maxScorePicker)
    .register(weightedRandomPicker)
    .register(roundRobinPicker)
    .register(leastRequestPicker);
}

/** The shared registry used by the config loader and createScheduler. */
export const registry = builtinRegistry();
