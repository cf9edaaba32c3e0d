// Reads the load signals a router needs from an engine's /metrics text.
// Both vLLM and SGLang names are accepted whatever the configured engine is
// (a pool's `engine` field is a hint, not a filter), and vLLM's old
// gpu_cache_usage_perc as well as the current kv_cache_usage_perc.
import { parseLabels, scanPrometheus } from './prom-parse.js';

export interface EngineMetrics {
  waiting: number;
  running: number;
  /** KV-cache utilisation in [0, 1]; NaN when the engine does not report it. */
  kvUsage: number;
  /** KV-cache geometry from cache_config_info, 0 when unknown. */
  cacheBlocks: number;
  cacheBlockTokens: number;
}

const WAITING = new Set(['vllm:num_requests_waiting', 'sglang:num_queue_reqs']);
const RUNNING = new Set(['vllm:num_requests_running', 'sglang:num_running_reqs']);
const KV = new Set(['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc', 'sglang:token_usage']);
const CACHE_INFO = new Set(['vllm:cache_config_info', 'sglang:cache_config_info']);
const ALL = new Set([...WAITING, ...RUNNING, ...KV, ...CACHE_INFO]);
const want = (name: string): boolean => ALL.has(name);

/** Parses the metrics text into `out` (reused between scrapes). Returns true if any load signal was found; otherwise the load fields of `out` are left as they were. */
export function readEngineMetrics(text: string, out: EngineMetrics): boolean {
  let waiting = 0;
  let running = 0;
  let kvSum = 0;
  let kvCount = 0;
  let found = false;
  let blocks = 0;
  let blockTokens = 0;
  scanPrometheus(text, want, (name, labelText, value) => {
    if (WAITING.has(name)) {
      if (Number.isFinite(value) && value > 0) waiting += value; // a count: a negative one is an exporter bug
      found = true;
    } else if (RUNNING.has(name)) {
      if (Number.isFinite(value) && value > 0) running += value;
      found = true;
    } else if (KV.has(name)) {
      if (Number.isFinite(value)) {
        kvSum += value;
        kvCount++;
      }
      found = true;
    } else {
      const l = parseLabels(labelText);
      const b = Number(l.num_gpu_blocks ?? l.num_pages);
      const s = Number(l.block_size ?? l.page_size);
      if (Number.isFinite(b) && b > 0) blocks += b;
      if (Number.isFinite(s) && s > 0) blockTokens = s;
    }
  });
  // no load signal: keep the last figures (they go stale by the scrape time)
  // rather than zeros that would look like an idle engine while still fresh
  if (found) {
    out.waiting = waiting;
    out.running = running;
    out.kvUsage = kvCount > 0 ? Math.min(1, Math.max(0, kvSum / kvCount)) : NaN;
  }
  if (blocks > 0 && blockTokens > 0) {
    out.cacheBlocks = blocks;
    out.cacheBlockTokens = blockTokens;
  }
  return found;
}

/**
 * Converts an engine's KV-cache size to prefix-index blocks. The index hashes
 * prompt bytes, not tokens; a token is about 4 bytes of English text, so an
 * engine holding `blocks × blockTokens` tokens holds about 4× that many prompt
 * bytes, i.e. that / `indexBlockBytes` index blocks.
 */
export const BYTES_PER_TOKEN = 4;
export function indexBlocksFor(cacheBlocks: number, cacheBlockTokens: number, indexBlockBytes: number): number {
  return Math.max(1, Math.floor((cacheBlocks * cacheBlockTokens * BYTES_PER_TOKEN) / indexBlockBytes));
}
