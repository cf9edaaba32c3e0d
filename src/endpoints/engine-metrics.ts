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
  /**
   * LoRA adapters (vllm:lora_requests_info, the newest series: its value is a
   * timestamp): GPU adapter slots (0: not reported), adapters with running and
   * with waiting requests. Kept as they were when a scrape has no such series.
   */
  loraMax: number;
  loraRunning: readonly string[];
  loraWaiting: readonly string[];
  /** lora_requests_info series ignored for a missing or malformed label (max_lora not a positive integer, no running_lora_adapters): counted, never read. */
  loraBadSeries: number;
}

/** Fresh metrics of an endpoint nothing was read from yet. */
export function emptyEngineMetrics(): EngineMetrics {
  return { waiting: 0, running: 0, kvUsage: NaN, cacheBlocks: 0, cacheBlockTokens: 0, loraMax: 0, loraRunning: NO_ADAPTERS, loraWaiting: NO_ADAPTERS, loraBadSeries: 0 };
}
const NO_ADAPTERS: readonly string[] = Object.freeze([]);

function adapterList(v: string): readonly string[] {
  if (v === '') return NO_ADAPTERS;
  return v.split(',').filter((a) => a !== '');
}

const WAITING = new Set(['vllm:num_requests_waiting', 'sglang:num_queue_reqs']);
const RUNNING = new Set(['vllm:num_requests_running', 'sglang:num_running_reqs']);
const KV = new Set(['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc', 'sglang:token_usage']);
const CACHE_INFO = new Set(['vllm:cache_config_info', 'sglang:cache_config_info']);
const LORA = 'vllm:lora_requests_info';
const ALL = new Set([...WAITING, ...RUNNING, ...KV, ...CACHE_INFO, LORA]);
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
  let loraAt = -Infinity;
  let loraLabels: Record<string, string> | null = null;
  scanPrometheus(text, want, (name, labelText, value) => {
    if (name === LORA) {
      const l = parseLabels(labelText);
      const max = Number(l.max_lora);
      if (!Number.isInteger(max) || max < 1 || l.running_lora_adapters === undefined || l.waiting_lora_adapters === undefined) {
        out.loraBadSeries++;
        return;
      }
      // one series per change of the adapter lists: the newest (its value is when it was set) is the state
      if (!(value >= loraAt)) return;
      loraAt = value;
      loraLabels = l;
      return;
    }
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
  if (loraLabels !== null) {
    const l: Record<string, string> = loraLabels;
    out.loraMax = Number(l.max_lora);
    out.loraRunning = adapterList(l.running_lora_adapters!);
    out.loraWaiting = adapterList(l.waiting_lora_adapters!);
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
