// The Responses API's counters and histograms: plain numbers and
// allocation-free Histograms kept by the service and its turns, read by
// Prometheus at scrape time (registerResponsesMetrics). docs/responses.md
// lists the families.
import { Counter, Gauge } from 'prom-client';
import { Histogram } from '../metrics/histogram.js';
import { HistogramMetric, type Registry } from '../metrics/prom.js';
import type { ResponseStore } from './store.js';

export const STORE_GET = 0;
export const STORE_PUT = 1;
export const STORE_DELETE = 2;
const OPS = ['get', 'put', 'delete'] as const;

/** Store operation latency, seconds: 10 µs (memory) to 2 s (a Redis command timing out). */
const STORE_BUCKETS = [1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5];
/** Messages in a stored conversation (a plain agent turn adds two: its input and the answer). */
const CHAIN_BUCKETS = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/** Every item id is `msg_` + 48 hex digits: a comma-joined list of n ids is 53n − 1 characters. */
export function messagesIn(ids: string): number {
  return ids.length === 0 ? 0 : (ids.length + 1) / 53;
}

export class ResponsesStats {
  /** Turns answered with a Response that started a conversation (no previous_response_id). */
  created = 0;
  /** Turns answered with a Response that continued one (previous_response_id). */
  continued = 0;
  /** Turns that produced no Response: rejected or unroutable, the engine's error, a failure mid-stream, or a Response that could not be stored. */
  failed = 0;
  readonly ops = new Float64Array(3);
  readonly errors = new Float64Array(3);
  readonly latency = [new Histogram(STORE_BUCKETS), new Histogram(STORE_BUCKETS), new Histogram(STORE_BUCKETS)] as const;
  readonly chain = new Histogram(CHAIN_BUCKETS);

  /** One store operation of kind `op` that started at `t0` (performance.now()). */
  op(op: number, t0: number, failed: boolean): void {
    this.ops[op]!++;
    if (failed) this.errors[op]!++;
    this.latency[op]!.observe((performance.now() - t0) / 1000);
  }
}

export function registerResponsesMetrics(registry: Registry, stats: ResponsesStats, store: () => ResponseStore | null, storeType: string): void {
  const r = [registry];
  new Counter({
    name: 'switchyard_responses_total',
    help: 'POST /v1/responses turns by result: created (a Response starting a conversation), continued (a Response continuing one through previous_response_id), failed (no Response: the router rejected or could not route the chat completion, the engine failed, the stream broke, or the turn could not be stored). Bad input and unknown previous responses are not counted here (switchyard_requests_total has their status).',
    labelNames: ['result'],
    registers: r,
    collect() {
      this.reset();
      this.inc({ result: 'created' }, stats.created);
      this.inc({ result: 'continued' }, stats.continued);
      this.inc({ result: 'failed' }, stats.failed);
    },
  });
  new Counter({
    name: 'switchyard_responses_store_operations_total',
    help: 'Operations on the Responses store, by store type and operation (get, put, delete).',
    labelNames: ['store', 'op'],
    registers: r,
    collect() {
      this.reset();
      for (let i = 0; i < 3; i++) this.inc({ store: storeType, op: OPS[i]! }, stats.ops[i]!);
    },
  });
  new Counter({
    name: 'switchyard_responses_store_errors_total',
    help: 'Responses store operations that failed (the store unreachable, locked, overloaded or down: the API answered 503), by store type and operation.',
    labelNames: ['store', 'op'],
    registers: r,
    collect() {
      this.reset();
      for (let i = 0; i < 3; i++) this.inc({ store: storeType, op: OPS[i]! }, stats.errors[i]!);
    },
  });
  new HistogramMetric({
    name: 'switchyard_responses_store_seconds',
    help: 'Latency of Responses store operations as the router awaits them (memory: on the event loop; sqlite: the round trip to its worker thread, commit included; redis: the network round trip).',
    labelNames: ['store', 'op'],
    buckets: STORE_BUCKETS,
    registers: r,
    series: (emit) => {
      for (let i = 0; i < 3; i++) emit({ store: storeType, op: OPS[i]! }, stats.latency[i]!);
    },
  });
  new HistogramMetric({
    name: 'switchyard_responses_chain_messages',
    help: 'Length of each stored conversation when its turn was stored, in messages (earlier inputs and answers, this input, this answer; instructions excluded).',
    buckets: CHAIN_BUCKETS,
    registers: r,
    series: (emit) => emit({}, stats.chain),
  });
  new Gauge({
    name: 'switchyard_responses_stored',
    help: 'Responses held by the store (memory and sqlite; redis does not say).',
    labelNames: ['store'],
    registers: r,
    collect() {
      this.reset();
      const s = store();
      if (s !== null && s.size() >= 0) this.set({ store: storeType }, s.size());
    },
  });
  new Counter({
    name: 'switchyard_responses_evictions_total',
    help: 'Stored responses dropped to stay within responses.maxResponses / maxBytes (memory and sqlite; expiry not counted; redis evicts under its own maxmemory policy and does not say).',
    labelNames: ['store'],
    registers: r,
    collect() {
      this.reset();
      const s = store() as (ResponseStore & { evictions?: number }) | null;
      if (s !== null && typeof s.evictions === 'number') this.inc({ store: storeType }, s.evictions);
    },
  });
}
