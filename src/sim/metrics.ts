// /metrics of a simulated engine: Prometheus text (format 0.0.4) with the real
// engines' metric names (vLLM V1 or SGLang), every series labelled model_name.

import { fmt } from './histogram.js';
import type { Scheduler } from './scheduler.js';
import type { ResolvedSimOptions } from './options.js';

function esc(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');
}

function head(out: string[], name: string, type: string, help: string): void {
  out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
}

export function renderMetrics(o: ResolvedSimOptions, s: Scheduler): string {
  const out: string[] = [];
  const model = esc(o.models[0]!);
  if (o.engine === 'vllm') renderVllm(o, s, model, out);
  else renderSglang(o, s, model, out);
  head(out, 'switchyard_sim_info', 'gauge', 'Simulated engine: engine type, revision and role labels.');
  out.push(`switchyard_sim_info{engine_type="${o.engine}",model_name="${model}",revision="${esc(o.revision)}",role="${o.role}"} 1.0`);
  return out.join('\n') + '\n';
}

function renderVllm(o: ResolvedSimOptions, s: Scheduler, model: string, out: string[]): void {
  const l = o.legacy ? `model_name="${model}"` : `engine="0",model_name="${model}"`;
  const c = s.cache;
  head(out, 'vllm:num_requests_running', 'gauge', 'Number of requests in model execution batches.');
  out.push(`vllm:num_requests_running{${l}} ${fmt(s.running)}`);
  head(out, 'vllm:num_requests_waiting', 'gauge', 'Number of requests waiting to be processed.');
  out.push(`vllm:num_requests_waiting{${l}} ${fmt(s.waiting)}`);
  const usageName = o.legacy ? 'vllm:gpu_cache_usage_perc' : 'vllm:kv_cache_usage_perc';
  head(out, usageName, 'gauge', 'KV-cache usage. 1 means 100 percent usage.');
  out.push(`${usageName}{${l}} ${fmt(c.usage)}`);
  head(out, 'vllm:prefix_cache_queries_total', 'counter', 'Prefix cache queries, in terms of number of queried tokens.');
  out.push(`vllm:prefix_cache_queries_total{${l}} ${fmt(s.prefixQueryTokens)}`);
  head(out, 'vllm:prefix_cache_hits_total', 'counter', 'Prefix cache hits, in terms of number of cached tokens.');
  out.push(`vllm:prefix_cache_hits_total{${l}} ${fmt(s.prefixHitTokens)}`);
  head(out, 'vllm:num_preemptions_total', 'counter', 'Cumulative number of preemption from the engine.');
  out.push(`vllm:num_preemptions_total{${l}} 0.0`);
  head(out, 'vllm:prompt_tokens_total', 'counter', 'Number of prefill tokens processed.');
  out.push(`vllm:prompt_tokens_total{${l}} ${fmt(s.promptTokensTotal)}`);
  head(out, 'vllm:generation_tokens_total', 'counter', 'Number of generation tokens processed.');
  out.push(`vllm:generation_tokens_total{${l}} ${fmt(s.generationTokensTotal)}`);
  head(out, 'vllm:request_success_total', 'counter', 'Count of successfully processed requests.');
  out.push(`vllm:request_success_total{${l},finished_reason="length"} ${fmt(s.finishedLength)}`);
  out.push(`vllm:request_success_total{${l},finished_reason="stop"} ${fmt(s.finishedStop)}`);
  out.push(`vllm:request_success_total{${l},finished_reason="abort"} ${fmt(s.aborted)}`);
  head(out, 'vllm:cache_config_info', 'gauge', 'Information of the LLMEngine CacheConfig');
  out.push(
    `vllm:cache_config_info{block_size="${o.blockSize}",cache_dtype="auto",enable_prefix_caching="True",` +
      `${o.legacy ? '' : 'engine="0",'}model_name="${model}",num_cpu_blocks="0",num_gpu_blocks="${o.kvCacheBlocks}"} 1.0`,
  );
  if (o.loras.length > 0) {
    head(out, 'vllm:lora_requests_info', 'gauge', 'Running stats on lora requests.');
    const running = [...s.runningLoras.keys()].join(',');
    const waiting = [...s.waitingLoras.keys()].join(',');
    out.push(
      `vllm:lora_requests_info{${o.legacy ? '' : 'engine="0",'}max_lora="${o.maxLoras}",model_name="${model}",running_lora_adapters="${esc(running)}",waiting_lora_adapters="${esc(waiting)}"} ${fmt(Date.now() / 1000)}`,
    );
  }
  head(out, 'vllm:time_to_first_token_seconds', 'histogram', 'Histogram of time to first token in seconds.');
  s.ttft.render('vllm:time_to_first_token_seconds', l, out);
  head(out, 'vllm:inter_token_latency_seconds', 'histogram', 'Histogram of inter-token latency in seconds.');
  s.itl.render('vllm:inter_token_latency_seconds', l, out);
  head(out, 'vllm:e2e_request_latency_seconds', 'histogram', 'Histogram of e2e request latency in seconds.');
  s.e2e.render('vllm:e2e_request_latency_seconds', l, out);
  head(out, 'vllm:request_queue_time_seconds', 'histogram', 'Histogram of time spent in WAITING phase for request.');
  s.queueTime.render('vllm:request_queue_time_seconds', l, out);
}

function renderSglang(o: ResolvedSimOptions, s: Scheduler, model: string, out: string[]): void {
  const l = `model_name="${model}"`;
  const c = s.cache;
  head(out, 'sglang:num_running_reqs', 'gauge', 'The number of running requests.');
  out.push(`sglang:num_running_reqs{${l}} ${fmt(s.running)}`);
  head(out, 'sglang:num_queue_reqs', 'gauge', 'The number of requests in the waiting queue.');
  out.push(`sglang:num_queue_reqs{${l}} ${fmt(s.waiting)}`);
  head(out, 'sglang:num_used_tokens', 'gauge', 'The number of used tokens.');
  out.push(`sglang:num_used_tokens{${l}} ${fmt(c.usedBlocks * o.blockSize)}`);
  head(out, 'sglang:token_usage', 'gauge', 'The token usage.');
  out.push(`sglang:token_usage{${l}} ${fmt(c.usage)}`);
  head(out, 'sglang:cache_hit_rate', 'gauge', 'The prefix cache hit rate.');
  out.push(`sglang:cache_hit_rate{${l}} ${fmt(s.prefixQueryTokens > 0 ? s.prefixHitTokens / s.prefixQueryTokens : 0)}`);
  head(out, 'sglang:cache_config_info', 'gauge', 'Information of the KV cache configuration.');
  out.push(`sglang:cache_config_info{model_name="${model}",num_pages="${o.kvCacheBlocks}",page_size="${o.blockSize}"} 1.0`);
  head(out, 'sglang:prompt_tokens_total', 'counter', 'Number of prefill tokens processed.');
  out.push(`sglang:prompt_tokens_total{${l}} ${fmt(s.promptTokensTotal)}`);
  head(out, 'sglang:generation_tokens_total', 'counter', 'Number of generation tokens processed.');
  out.push(`sglang:generation_tokens_total{${l}} ${fmt(s.generationTokensTotal)}`);
  head(out, 'sglang:num_requests_total', 'counter', 'Number of requests processed.');
  out.push(`sglang:num_requests_total{${l}} ${fmt(s.finishedLength + s.finishedStop)}`);
  head(out, 'sglang:time_to_first_token_seconds', 'histogram', 'Histogram of time to first token in seconds.');
  s.ttft.render('sglang:time_to_first_token_seconds', l, out);
  head(out, 'sglang:inter_token_latency_seconds', 'histogram', 'Histogram of inter-token latency in seconds.');
  s.itl.render('sglang:inter_token_latency_seconds', l, out);
  head(out, 'sglang:e2e_request_latency_seconds', 'histogram', 'Histogram of End-to-end request latency in seconds');
  s.e2e.render('sglang:e2e_request_latency_seconds', l, out);
}
