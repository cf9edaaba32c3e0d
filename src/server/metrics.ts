// The router's own Prometheus metrics. The request path bumps plain numbers,
// typed arrays and nested maps keyed by numbers (no string keys built, no
// prom-client call per request); the prom-client metrics of `registry` copy
// them in their collect() callbacks when /metrics is scraped.
import { Counter, Gauge } from 'prom-client';
import type { Endpoint, EndpointSet } from '../endpoints/endpoint.js';
import { VERSION } from '../version.js';
import { Histogram } from '../metrics/histogram.js';
import { HistogramMetric, newRegistry, scrapeCounter, type Registry } from '../metrics/prom.js';
import { OUTCOME_NAMES, OUTCOME_REJECTED, UPSTREAM_KINDS } from '../metrics/outcomes.js';

const DECISION_BUCKETS = [5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.01];
const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
const DURATION_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];
const ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1];

/** The key (in place of endpoint id + 1) of the counts of removed endpoints, per model. */
const RETIRED = -1;

export class RouterMetrics {
  /** This router's registry: the switchyard_* families below, the process and Node.js defaults, and whatever the gate registers. */
  readonly registry: Registry;
  readonly #set: EndpointSet;
  /** model → endpoint id (+1; 0 = none; RETIRED = endpoints since removed) → status → count */
  readonly #requests = new Map<string, Map<number, Map<number, number>>>();
  readonly decision = new Histogram(DECISION_BUCKETS);
  readonly ttft: Histogram[];
  readonly itl: Histogram[];
  promptBlocks = 0;
  matchedBlocks = 0;
  /** Registers the model-rewrite counters of the director's rewriter (once, at assembly). */
  registerRewrites: (rw: import('../director/model-rewrites.js').ModelRewriter) => void = () => {};
  registerAdapterHold: (h: import('../director/adapter-hold.js').AdapterHold) => void = () => {};
  retries = 0;
  /** Times a slow client made the relay pause reading from the engine. */
  pauses = 0;
  readonly rejected = new Map<string, number>();
  /** Per model ('' = unknown): outcome index → count; rejections by reason; duration and router-side TTFT. */
  readonly #outcomes = new Map<string, { counts: Float64Array; rejected: Map<string, number>; duration: Histogram; ttft: Histogram }>();
  /** Per endpoint id: upstream failures by kind (UPSTREAM_KINDS). */
  readonly #upstreamErrors: Float64Array[] = [];
  /** Config reloads by result ('ok', 'invalid'). */
  readonly reloads = new Map<string, number>();
  /** Runtime endpoint changes (the live-endpoint manager's counters), when there is one. */
  live: { added: number; drained: number; removed: number; graceExpired: number } | null = null;

  constructor(set: EndpointSet) {
    this.#set = set;
    this.ttft = [];
    this.itl = [];
    for (const ep of set.all) {
      this.ttft[ep.id] = new Histogram(TTFT_BUCKETS);
      this.itl[ep.id] = new Histogram(ITL_BUCKETS);
    }
    // an endpoint added at runtime gets its histograms before its first request
    set.onAdded((ep) => {
      this.ttft[ep.id] = new Histogram(TTFT_BUCKETS);
      this.itl[ep.id] = new Histogram(ITL_BUCKETS);
    });
    // a removed endpoint's series go with it (an endpoint's name is never reused: ids are not)
    // (its counts move to the model's retired bucket: the per-model totals never go down)
    set.onRemoved((ep) => {
      for (const byEp of this.#requests.values()) {
        const gone = byEp.get(ep.id + 1);
        if (gone === undefined) continue;
        byEp.delete(ep.id + 1);
        let retired = byEp.get(RETIRED);
        if (retired === undefined) byEp.set(RETIRED, (retired = new Map()));
        for (const [status, n] of gone) retired.set(status, (retired.get(status) ?? 0) + n);
      }
    });
    this.registry = newRegistry();
    this.#register(this.registry);
    this.#registerGatewayNames(this.registry);
  }

  /** `model` is '' when unknown; `endpointId` -1 when no endpoint was used. */
  countRequest(model: string, endpointId: number, status: number): void {
    let byEp = this.#requests.get(model);
    if (!byEp) {
      // bound the label set: unknown models all count under one label
      if (model !== '' && this.#set.forModel(model) === undefined) return this.countRequest('', endpointId, status);
      this.#requests.set(model, (byEp = new Map()));
    }
    let byStatus = byEp.get(endpointId + 1);
    if (!byStatus) {
      // a request that ends after its endpoint left (its grace expired) does not bring the series back
      if (endpointId >= 0 && this.#set.byId(endpointId) === undefined) return this.countRequest(model, -1, status);
      byEp.set(endpointId + 1, (byStatus = new Map()));
    }
    byStatus.set(status, (byStatus.get(status) ?? 0) + 1);
  }

  /**
   * One finished request: its outcome (outcomes.ts), the gate's reason when
   * rejected, its duration and, when its answer's first bytes went out, the
   * time to them (seconds; < 0: none; a duration < 0: not measured). Per model; unknown models under ''.
   */
  countOutcome(model: string, outcome: number, reason: string, seconds: number, ttftSeconds: number): void {
    let o = this.#outcomes.get(model);
    if (o === undefined) {
      if (model !== '' && this.#set.forModel(model) === undefined) return this.countOutcome('', outcome, reason, seconds, ttftSeconds);
      o = { counts: new Float64Array(OUTCOME_NAMES.length), rejected: new Map(), duration: new Histogram(DURATION_BUCKETS), ttft: new Histogram(TTFT_BUCKETS) };
      this.#outcomes.set(model, o);
    }
    o.counts[outcome]++;
    if (outcome === OUTCOME_REJECTED) o.rejected.set(reason, (o.rejected.get(reason) ?? 0) + 1);
    if (seconds >= 0) o.duration.observe(seconds); // < 0: not measured (an answer the native front end gave itself)
    if (ttftSeconds >= 0) o.ttft.observe(ttftSeconds);
  }

  /** An upstream leg of a request to endpoint `id` failed (`kind`: an UPSTREAM_KINDS index). */
  countUpstreamError(id: number, kind: number): void {
    (this.#upstreamErrors[id] ??= new Float64Array(UPSTREAM_KINDS.length))[kind]++;
  }

  /**
   * The same measurements under the names llm-d's gateway (the Gateway API
   * Inference Extension's endpoint picker) exports, so dashboards built for it
   * work against Switchyard; docs/observability.md has the mapping. Computed
   * at scrape time from the state above: nothing on the request path.
   */
  #registerGatewayNames(registry: Registry): void {
    const set = this.#set;
    const m = this;
    const requests = this.#requests;
    const r = [registry];
    new Counter({
      name: 'inference_objective_request_total',
      help: 'Requests per model (llm-d gateway name; switchyard_requests_total summed over endpoint and status).',
      labelNames: ['model_name', 'target_model_name'],
      registers: r,
      collect() {
        this.reset();
        for (const [model, byEp] of requests) {
          if (model === '') continue;
          let n = 0;
          for (const byStatus of byEp.values()) for (const c of byStatus.values()) n += c;
          this.inc({ model_name: model, target_model_name: model }, n);
        }
      },
    });
    new Counter({
      name: 'inference_objective_request_error_total',
      help: 'Requests per model answered with an error status (llm-d gateway name; switchyard_requests_total with status >= 400).',
      labelNames: ['model_name', 'target_model_name', 'error_code'],
      registers: r,
      collect() {
        this.reset();
        for (const [model, byEp] of requests) {
          if (model === '') continue;
          const byCode = new Map<number, number>();
          for (const byStatus of byEp.values()) for (const [status, c] of byStatus) if (status >= 400) byCode.set(status, (byCode.get(status) ?? 0) + c);
          for (const [status, c] of byCode) this.inc({ model_name: model, target_model_name: model, error_code: String(status) }, c);
        }
      },
    });
    new Gauge({
      name: 'inference_objective_running_requests',
      help: 'Requests in flight on the endpoints serving each model (llm-d gateway name).',
      labelNames: ['model_name'],
      registers: r,
      collect() {
        this.reset();
        for (const model of set.models()) {
          let n = 0;
          for (const ep of set.forModel(model) ?? []) n += ep.inFlight;
          this.set({ model_name: model }, n);
        }
      },
    });
    const perPool = (name: string, help: string, read: (eps: readonly Endpoint[], now: number) => number) =>
      new Gauge({
        name,
        help,
        labelNames: ['name'],
        registers: r,
        collect() {
          this.reset();
          const now = performance.now();
          for (const pool of set.pools) {
            const eps = set.all.filter((ep) => ep.pool === pool.name);
            const v = read(eps, now);
            if (Number.isFinite(v)) this.set({ name: pool.name }, v);
          }
        },
      });
    const avg = (xs: number[]) => (xs.length === 0 ? NaN : xs.reduce((a, x) => a + x, 0) / xs.length);
    perPool('inference_pool_average_kv_cache_utilization', 'Mean KV-cache use (0-1) of the pool\'s endpoints with fresh metrics (llm-d gateway name).', (eps) =>
      avg(eps.map((ep) => ep.metrics.kvUsage).filter((v) => Number.isFinite(v))),
    );
    perPool('inference_pool_average_queue_size', 'Mean engine waiting-queue length of the pool\'s endpoints (llm-d gateway name).', (eps) => avg(eps.map((ep) => ep.metrics.waiting)));
    perPool('inference_pool_ready_pods', 'Ready endpoints in the pool (llm-d gateway name).', (eps, now) => {
      const checks = set.dataLayer.healthIntervalMs > 0;
      return eps.filter((ep) => ep.ready(now, checks)).length;
    });
    new HistogramMetric({
      name: 'inference_extension_scheduler_e2e_duration_seconds',
      help: 'Time to pick an endpoint (llm-d gateway name; the same histogram as switchyard_routing_decision_seconds).',
      buckets: DECISION_BUCKETS,
      registers: r,
      series: (emit) => emit({}, m.decision),
    });
  }

  /** The tracing export counters (when tracing is on). */
  registerTracing(stats: { exported: number; dropped: number; failed: number; readonly queued: number }): void {
    const r = [this.registry];
    const counter = (name: string, help: string, read: () => number) => scrapeCounter(r, name, help, read);
    counter('switchyard_tracing_spans_exported_total', 'Spans the OTLP collector acknowledged.', () => stats.exported);
    counter('switchyard_tracing_spans_dropped_total', 'Spans dropped because the export queue was full (collector slow or down).', () => stats.dropped);
    counter('switchyard_tracing_spans_failed_total', 'Spans lost in exports that failed (collector down, timeout, refused).', () => stats.failed);
    new Gauge({
      name: 'switchyard_tracing_spans_queued',
      help: 'Finished spans waiting for export.',
      registers: r,
      collect() {
        this.set(stats.queued);
      },
    });
  }

  /** The Prometheus text of the whole registry (what GET /metrics answers). */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  #register(registry: Registry): void {
    const set = this.#set;
    const m = this;
    const requests = this.#requests;
    // one label object per endpoint id, made once (prom-client keeps a reference, never mutates it)
    const epLabelsById: { endpoint: string }[] = [];
    const epLabels = (id: number) => (epLabelsById[id] ??= { endpoint: set.nameOf(id) });
    const r = [registry];
    new Counter({
      name: 'switchyard_requests_total',
      help: 'Requests answered, by model, endpoint and HTTP status.',
      labelNames: ['model', 'endpoint', 'status'],
      registers: r,
      collect() {
        this.reset();
        for (const [model, byEp] of requests) {
          for (const [epPlus1, byStatus] of byEp) {
            if (epPlus1 === RETIRED) continue; // removed endpoints: counted in the per-model totals only
            const endpoint = epPlus1 === 0 ? '' : set.nameOf(epPlus1 - 1);
            for (const [status, n] of byStatus) this.inc({ model, endpoint, status: String(status) }, n);
          }
        }
      },
    });
    const outcomes = this.#outcomes;
    new Counter({
      name: 'switchyard_request_outcomes_total',
      help: 'Inference requests by how they ended: ok, client_error, rejected (reason: the gate\'s), upstream_error (before the first byte), mid_stream_failure, timeout, cancelled (the client left), unavailable (the router\'s own 5xx), shutdown (cut by a drain).',
      labelNames: ['model', 'outcome', 'reason'],
      registers: r,
      collect() {
        this.reset();
        for (const [model, o] of outcomes) {
          for (let i = 0; i < OUTCOME_NAMES.length; i++) {
            if (i === OUTCOME_REJECTED) for (const [reason, n] of o.rejected) this.inc({ model, outcome: OUTCOME_NAMES[i], reason }, n);
            else if (o.counts[i]! > 0) this.inc({ model, outcome: OUTCOME_NAMES[i], reason: '' }, o.counts[i]!);
          }
        }
      },
    });
    new HistogramMetric({
      name: 'switchyard_request_duration_seconds',
      help: 'End-to-end time of an inference request at the router: headers in to its last byte out (any outcome).',
      labelNames: ['model'],
      buckets: DURATION_BUCKETS,
      registers: r,
      series: (emit) => {
        for (const [model, o] of outcomes) emit({ model }, o.duration);
      },
    });
    new HistogramMetric({
      name: 'switchyard_request_ttft_seconds',
      help: "Time from a request's headers to its answer's first bytes out of the router (time to first token, as the client sees it).",
      labelNames: ['model'],
      buckets: TTFT_BUCKETS,
      registers: r,
      series: (emit) => {
        for (const [model, o] of outcomes) emit({ model }, o.ttft);
      },
    });
    const upstreamErrors = this.#upstreamErrors;
    new Counter({
      name: 'switchyard_upstream_errors_total',
      help: "Failed upstream legs by endpoint and kind: http_5xx, connect, dns, timeout, reset (before the first byte), mid_stream (after it). Retried legs count too.",
      labelNames: ['endpoint', 'kind'],
      registers: r,
      collect() {
        this.reset();
        for (let id = 0; id < upstreamErrors.length; id++) {
          const k = upstreamErrors[id];
          if (k === undefined) continue;
          for (let i = 0; i < UPSTREAM_KINDS.length; i++) if (k[i]! > 0) this.inc({ endpoint: set.nameOf(id), kind: UPSTREAM_KINDS[i] }, k[i]!);
        }
      },
    });
    new HistogramMetric({
      name: 'switchyard_routing_decision_seconds',
      help: 'Time to pick an endpoint (filters, scorers, picker).',
      buckets: DECISION_BUCKETS,
      registers: r,
      series: (emit) => emit({}, m.decision),
    });
    new HistogramMetric({
      name: 'switchyard_upstream_ttft_seconds',
      help: 'Time from dispatch to the first response byte from the endpoint.',
      labelNames: ['endpoint'],
      buckets: TTFT_BUCKETS,
      registers: r,
      series: (emit) => {
        for (const ep of set.all) emit(epLabels(ep.id), m.ttft[ep.id]!);
      },
    });
    new HistogramMetric({
      name: 'switchyard_upstream_itl_seconds',
      help: 'Time between body chunks of a streamed (SSE) answer from the endpoint: the inter-token latency as the router sees it.',
      labelNames: ['endpoint'],
      buckets: ITL_BUCKETS,
      registers: r,
      series: (emit) => {
        for (const ep of set.all) emit(epLabels(ep.id), m.itl[ep.id]!);
      },
    });
    new Gauge({
      name: 'switchyard_build_info',
      help: 'Always 1; the running version in labels.',
      labelNames: ['version', 'node'],
      registers: r,
      collect() {
        this.set({ version: VERSION, node: process.version }, 1);
      },
    });
    new Gauge({
      name: 'switchyard_endpoint_in_flight',
      help: 'Requests in flight from this router per endpoint.',
      labelNames: ['endpoint'],
      registers: r,
      collect() {
        this.reset(); // a removed endpoint's series goes
        for (const ep of set.all) this.set(epLabels(ep.id), ep.inFlight);
      },
    });
    new Gauge({
      name: 'switchyard_endpoint_prefill_backlog_tokens',
      help: "Uncached prompt tokens this router dispatched per endpoint that have not had a first byte back (flow control's prefill-backlog signal).",
      labelNames: ['endpoint'],
      registers: r,
      collect() {
        this.reset();
        for (const ep of set.all) this.set(epLabels(ep.id), ep.prefillPending);
      },
    });
    new Gauge({
      name: 'switchyard_endpoint_speed_ms_per_ktok',
      help: "The endpoint's learned prefill cost at its typical prompt, ms per thousand uncached tokens (src/endpoints/speed.ts; before shrinkage and bounds).",
      labelNames: ['endpoint'],
      registers: r,
      collect() {
        this.reset();
        for (const ep of set.all) this.set(epLabels(ep.id), ep.speed.msPerKTok());
      },
    });
    new Gauge({
      name: 'switchyard_endpoint_batch_limit',
      help: "How many requests flow control counts the endpoint's engine as running at once (src/endpoints/batch-limit.ts): the configured or learned limit, else the probe (switchyard_endpoint_batch_limit_learned 0).",
      labelNames: ['endpoint'],
      registers: r,
      collect() {
        this.reset();
        for (const ep of set.all) this.set(epLabels(ep.id), ep.batchLimit);
      },
    });
    new Gauge({
      name: 'switchyard_endpoint_batch_limit_learned',
      help: '1 when switchyard_endpoint_batch_limit is configured or learned from the engine\'s running and waiting counts, 0 while it is still the probe.',
      labelNames: ['endpoint'],
      registers: r,
      collect() {
        this.reset();
        for (const ep of set.all) this.set(epLabels(ep.id), ep.batch.learned > 0 ? 1 : 0);
      },
    });
    new Gauge({
      name: 'switchyard_endpoint_ready',
      help: '1 when the endpoint is healthy and its circuit breaker closed.',
      labelNames: ['endpoint'],
      registers: r,
      collect() {
        const now = performance.now();
        const checks = set.dataLayer.healthIntervalMs > 0;
        this.reset();
        for (const ep of set.all) this.set(epLabels(ep.id), ep.ready(now, checks) ? 1 : 0);
      },
    });
    new Gauge({
      name: 'switchyard_endpoint_model_missing',
      help: "1 per endpoint and model of its pool that its engine's GET /v1/models does not list (not routed there, not ready for it).",
      labelNames: ['endpoint', 'model'],
      registers: r,
      collect() {
        this.reset();
        for (const ep of set.all) for (const model of ep.missingModels ?? []) this.set({ endpoint: ep.name, model }, 1);
      },
    });
    new Gauge({
      name: 'switchyard_endpoint_draining',
      help: '1 while the endpoint drains (takes no new request; removed once its requests end or its grace period does).',
      labelNames: ['endpoint'],
      registers: r,
      collect() {
        this.reset();
        for (const ep of set.all) this.set(epLabels(ep.id), ep.state === 'draining' ? 1 : 0);
      },
    });
    new Gauge({
      name: 'switchyard_endpoint_info',
      help: "1 per live endpoint, with its pool, role, revision ('' when none) and state.",
      labelNames: ['endpoint', 'pool', 'role', 'revision', 'state'],
      registers: r,
      collect() {
        this.reset();
        for (const ep of set.all) this.set({ endpoint: ep.name, pool: ep.pool, role: ep.role, revision: ep.revision ?? '', state: ep.state }, 1);
      },
    });
    this.registerRewrites = (rw) =>
      new Counter({
        name: 'switchyard_model_rewrites_total',
        help: 'Requests a model rewrite rule (modelRewrites) sent to each of its targets; rule = the requested model, (default) for requests without one.',
        labelNames: ['rule', 'target'],
        registers: r,
        collect() {
          this.reset();
          for (const c of rw.counts()) this.inc({ rule: c.rule, target: c.target }, c.requests);
        },
      });
    const adapterCounter = (name: string, help: string, read: (c: import('../endpoints/adapter-stats.js').AdapterCount) => number) =>
      new Counter({
        name,
        help,
        labelNames: ['adapter'],
        registers: r,
        collect() {
          this.reset();
          const seen = new Set<object>();
          for (const [adapter, c] of set.adapterStats.byAdapter) {
            if (seen.has(c)) continue; // an adapter past the label cap shares the (overflow) counts
            seen.add(c);
            this.inc({ adapter }, read(c));
          }
        },
      });
    adapterCounter('switchyard_adapter_requests_total', 'Requests routed per LoRA adapter.', (c) => c.requests);
    adapterCounter('switchyard_adapter_misses_total', 'Requests for a LoRA adapter routed to an endpoint that did not have it active (the engine loads it into a GPU slot, or the router loads it first).', (c) => c.misses);
    adapterCounter('switchyard_adapter_loads_total', 'LoRA adapter loads the router asked an engine for (POST /v1/load_lora_adapter) that succeeded.', (c) => c.loads);
    adapterCounter('switchyard_adapter_load_failures_total', 'LoRA adapter loads an engine refused or did not answer in time.', (c) => c.loadFailures);
    adapterCounter('switchyard_adapter_held_total', 'Requests for a LoRA adapter held in the router while no candidate engine had a GPU adapter slot for it (adapterQueue).', (c) => c.held);
    this.registerAdapterHold = (h) => {
      new Gauge({
        name: 'switchyard_adapter_queue_requests',
        help: 'Requests for LoRA adapters held in the router now, waiting for a GPU adapter slot (adapterQueue).',
        registers: r,
        collect() {
          this.set(h.held);
        },
      });
      new Counter({
        name: 'switchyard_adapter_queue_total',
        help: 'Requests that left the adapter hold: dispatched (a slot freed), timeout (503 after adapterQueue.maxWaitMs), full (503 at once: a bound reached), cancelled (the client left).',
        labelNames: ['outcome'],
        registers: r,
        collect() {
          this.reset();
          const c = h.counts;
          this.inc({ outcome: 'dispatched' }, c.dispatched);
          this.inc({ outcome: 'timeout' }, c.timeout);
          this.inc({ outcome: 'full' }, c.full);
          this.inc({ outcome: 'cancelled' }, c.cancelled);
        },
      });
      new Counter({
        name: 'switchyard_adapter_queue_wait_seconds_total',
        help: 'Time the requests the adapter hold let go waited in it, summed (divide by its dispatched outcome for the mean).',
        registers: r,
        collect() {
          this.reset();
          this.inc(h.counts.waitedMs / 1000);
        },
      });
    };
    new Gauge({
      name: 'switchyard_engine_lora_bad_series',
      help: "vllm:lora_requests_info series ignored per endpoint: a missing or malformed label (max_lora, running_lora_adapters, waiting_lora_adapters).",
      labelNames: ['endpoint'],
      registers: r,
      collect() {
        this.reset();
        for (const ep of set.all) if (ep.metrics.loraBadSeries > 0) this.set({ endpoint: ep.name }, ep.metrics.loraBadSeries);
      },
    });
    new Counter({
      name: 'switchyard_config_reloads_total',
      help: "Config reloads (SIGHUP or the admin API) by result: ok, or invalid (refused; the old config keeps serving).",
      labelNames: ['result'],
      registers: r,
      collect() {
        this.reset();
        for (const [result, n] of m.reloads) this.inc({ result }, n);
      },
    });
    new Counter({
      name: 'switchyard_endpoint_changes_total',
      help: 'Runtime endpoint changes: added, drained (drains begun), removed, grace_expired (removed with requests still in flight).',
      labelNames: ['change'],
      registers: r,
      collect() {
        this.reset();
        const l = m.live;
        if (l === null) return;
        this.inc({ change: 'added' }, l.added);
        this.inc({ change: 'drained' }, l.drained);
        this.inc({ change: 'removed' }, l.removed);
        this.inc({ change: 'grace_expired' }, l.graceExpired);
      },
    });
    const counter = (name: string, help: string, read: () => number) => scrapeCounter(r, name, help, read);
    counter('switchyard_prefix_blocks_total', 'Prompt blocks hashed for prefix matching.', () => m.promptBlocks);
    counter('switchyard_prefix_matched_blocks_total', 'Prompt blocks the picked endpoint was believed to hold.', () => m.matchedBlocks);
    new Gauge({
      name: 'switchyard_prefix_match_ratio',
      help: 'Matched / hashed prompt blocks since start.',
      registers: r,
      collect() {
        this.set(m.promptBlocks > 0 ? m.matchedBlocks / m.promptBlocks : 0);
      },
    });
    counter('switchyard_upstream_retries_total', 'Requests retried on another endpoint before the first byte.', () => m.retries);
    counter(
      'switchyard_relay_pauses_total',
      'Times a slow client made the relay pause reading from the engine (backpressure).',
      () => m.pauses,
    );
    new Counter({
      name: 'switchyard_rejected_total',
      help: 'Requests rejected by the admission gate, by reason.',
      labelNames: ['reason'],
      registers: r,
      collect() {
        this.reset();
        for (const [reason, n] of m.rejected) this.inc({ reason }, n);
      },
    });
  }
}
