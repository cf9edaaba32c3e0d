// /metrics of a simulated engine with the real engines' metric names (vLLM V1
// or SGLang), every series labelled model_name. One prom-client registry per
// engine (no process metrics: every series carries model_name); the metrics
// read the scheduler's plain counters and Histograms at scrape time.
import { Counter, Gauge } from 'prom-client';
import type { Histogram } from '../metrics/histogram.js';
import { HistogramMetric, newRegistry, type Registry } from '../metrics/prom.js';
import type { ResolvedSimOptions } from './options.js';
import type { Scheduler } from './scheduler.js';

export { ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS } from './buckets.js';
import { ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS } from './buckets.js';

/** A bound as the Python client writes it in `le` (1 → "1.0"), as the real engines do. */
export function pyFloat(v: number): string {
  return Number.isInteger(v) ? v.toFixed(1) : String(v);
}

type Labels = Record<string, string>;
type Series = readonly (readonly [Labels, () => number])[];

export class SimMetrics {
  readonly registry: Registry = newRegistry({ defaultMetrics: false });

  constructor(o: ResolvedSimOptions, s: Scheduler) {
    const model = o.models[0]!;
    if (o.engine === 'vllm') this.#vllm(o, s, model);
    else this.#sglang(o, s, model);
    this.#gauge('switchyard_sim_info', 'Simulated engine: engine type, revision and role labels.', [
      [{ engine_type: o.engine, model_name: model, revision: o.revision, role: o.role }, () => 1],
    ]);
  }

  /** The text GET /metrics answers. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  #vllm(o: ResolvedSimOptions, s: Scheduler, model: string): void {
    const l: Labels = o.legacy ? { model_name: model } : { engine: '0', model_name: model };
    const engine: Labels = o.legacy ? {} : { engine: '0' };
    const c = s.cache;
    this.#gauge('vllm:num_requests_running', 'Number of requests in model execution batches.', [[l, () => s.running]]);
    this.#gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.', [[l, () => s.waiting]]);
    const usageName = o.legacy ? 'vllm:gpu_cache_usage_perc' : 'vllm:kv_cache_usage_perc';
    this.#gauge(usageName, 'KV-cache usage. 1 means 100 percent usage.', [[l, () => c.usage]]);
    this.#counter('vllm:prefix_cache_queries_total', 'Prefix cache queries, in terms of number of queried tokens.', [[l, () => s.prefixQueryTokens]]);
    this.#counter('vllm:prefix_cache_hits_total', 'Prefix cache hits, in terms of number of cached tokens.', [[l, () => s.prefixHitTokens]]);
    this.#counter('vllm:num_preemptions_total', 'Cumulative number of preemption from the engine.', [[l, () => 0]]);
    this.#counter('vllm:prompt_tokens_total', 'Number of prefill tokens processed.', [[l, () => s.promptTokensTotal]]);
    this.#counter('vllm:generation_tokens_total', 'Number of generation tokens processed.', [[l, () => s.generationTokensTotal]]);
    this.#counter('vllm:request_success_total', 'Count of successfully processed requests.', [
      [{ ...l, finished_reason: 'length' }, () => s.finishedLength],
      [{ ...l, finished_reason: 'stop' }, () => s.finishedStop],
      [{ ...l, finished_reason: 'abort' }, () => s.aborted],
    ]);
    this.#gauge('vllm:cache_config_info', 'Information of the LLMEngine CacheConfig', [
      [
        {
          block_size: String(o.blockSize),
          cache_dtype: 'auto',
          enable_prefix_caching: 'True',
          ...engine,
          model_name: model,
          num_cpu_blocks: '0',
          num_gpu_blocks: String(o.kvCacheBlocks),
        },
        () => 1,
      ],
    ]);
    if (o.enableLora) {
      const labelNames = [...Object.keys(engine), 'max_lora', 'model_name', 'running_lora_adapters', 'waiting_lora_adapters'];
      new Gauge({
        name: 'vllm:lora_requests_info',
        help: 'Running stats on lora requests.',
        labelNames,
        registers: [this.registry],
        collect() {
          this.reset();
          const labels: Labels = {
            ...engine,
            max_lora: String(o.maxLoras),
            model_name: model,
            running_lora_adapters: [...s.runningLoras.keys()].join(','),
            waiting_lora_adapters: [...s.waitingLoras.keys()].join(','),
          };
          this.set(labels, Date.now() / 1000);
        },
      });
    }
    this.#histogram('vllm:time_to_first_token_seconds', 'Histogram of time to first token in seconds.', TTFT_BUCKETS, l, s.ttft);
    this.#histogram('vllm:inter_token_latency_seconds', 'Histogram of inter-token latency in seconds.', ITL_BUCKETS, l, s.itl);
    this.#histogram('vllm:e2e_request_latency_seconds', 'Histogram of e2e request latency in seconds.', REQUEST_LATENCY_BUCKETS, l, s.e2e);
    this.#histogram(
      'vllm:request_queue_time_seconds',
      'Histogram of time spent in WAITING phase for request.',
      REQUEST_LATENCY_BUCKETS,
      l,
      s.queueTime,
    );
  }

  #sglang(o: ResolvedSimOptions, s: Scheduler, model: string): void {
    const l: Labels = { model_name: model };
    const c = s.cache;
    this.#gauge('sglang:num_running_reqs', 'The number of running requests.', [[l, () => s.running]]);
    this.#gauge('sglang:num_queue_reqs', 'The number of requests in the waiting queue.', [[l, () => s.waiting]]);
    this.#gauge('sglang:num_used_tokens', 'The number of used tokens.', [[l, () => c.usedBlocks * o.blockSize]]);
    this.#gauge('sglang:token_usage', 'The token usage.', [[l, () => c.usage]]);
    this.#gauge('sglang:cache_hit_rate', 'The prefix cache hit rate.', [
      [l, () => (s.prefixQueryTokens > 0 ? s.prefixHitTokens / s.prefixQueryTokens : 0)],
    ]);
    this.#gauge('sglang:cache_config_info', 'Information of the KV cache configuration.', [
      [{ model_name: model, num_pages: String(o.kvCacheBlocks), page_size: String(o.blockSize) }, () => 1],
    ]);
    this.#counter('sglang:prompt_tokens_total', 'Number of prefill tokens processed.', [[l, () => s.promptTokensTotal]]);
    this.#counter('sglang:generation_tokens_total', 'Number of generation tokens processed.', [[l, () => s.generationTokensTotal]]);
    this.#counter('sglang:num_requests_total', 'Number of requests processed.', [[l, () => s.finishedLength + s.finishedStop]]);
    this.#histogram('sglang:time_to_first_token_seconds', 'Histogram of time to first token in seconds.', TTFT_BUCKETS, l, s.ttft);
    this.#histogram('sglang:inter_token_latency_seconds', 'Histogram of inter-token latency in seconds.', ITL_BUCKETS, l, s.itl);
    this.#histogram('sglang:e2e_request_latency_seconds', 'Histogram of End-to-end request latency in seconds', REQUEST_LATENCY_BUCKETS, l, s.e2e);
  }

  #gauge(name: string, help: string, series: Series): void {
    new Gauge({
      name,
      help,
      labelNames: Object.keys(series[0]![0]),
      registers: [this.registry],
      collect() {
        for (const [labels, read] of series) this.set(labels, read());
      },
    });
  }

  #counter(name: string, help: string, series: Series): void {
    new Counter({
      name,
      help,
      labelNames: Object.keys(series[0]![0]),
      registers: [this.registry],
      collect() {
        this.reset();
        for (const [labels, read] of series) this.inc(labels, read());
      },
    });
  }

  #histogram(name: string, help: string, buckets: readonly number[], labels: Labels, h: Histogram): void {
    new HistogramMetric({
      name,
      help,
      labelNames: Object.keys(labels),
      buckets,
      formatLe: pyFloat,
      registers: [this.registry],
      series: (emit) => emit(labels, h),
    });
  }
}
