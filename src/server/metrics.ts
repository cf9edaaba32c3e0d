// The router's own Prometheus metrics. Counters are plain numbers in nested
// maps (no string keys built per request); the text is rendered on scrape.
import type { EndpointSet } from '../endpoints/endpoint.js';

/** Fixed-bucket histogram (upper bounds in seconds). */
export class Histogram {
  readonly bounds: Float64Array;
  readonly counts: Float64Array;
  sum = 0;
  count = 0;
  constructor(bounds: number[]) {
    this.bounds = Float64Array.from(bounds);
    this.counts = new Float64Array(bounds.length);
  }
  observe(v: number): void {
    const b = this.bounds;
    let i = 0;
    while (i < b.length && v > b[i]) i++;
    if (i < b.length) this.counts[i]++;
    this.sum += v;
    this.count++;
  }
  render(name: string, labels: string, out: string[]): void {
    let cum = 0;
    const sep = labels ? labels + ',' : '';
    for (let i = 0; i < this.bounds.length; i++) {
      cum += this.counts[i];
      out.push(`${name}_bucket{${sep}le="${this.bounds[i]}"} ${cum}`);
    }
    out.push(`${name}_bucket{${sep}le="+Inf"} ${this.count}`);
    out.push(`${name}_sum${labels ? `{${labels}}` : ''} ${this.sum}`);
    out.push(`${name}_count${labels ? `{${labels}}` : ''} ${this.count}`);
  }
}

const DECISION_BUCKETS = [5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.01];
const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

function esc(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

export class RouterMetrics {
  readonly #set: EndpointSet;
  /** model → endpoint id (+1; 0 = none) → status → count */
  readonly #requests = new Map<string, Map<number, Map<number, number>>>();
  readonly decision = new Histogram(DECISION_BUCKETS);
  readonly ttft: Histogram[];
  promptBlocks = 0;
  matchedBlocks = 0;
  retries = 0;
  /** Times a slow client made the relay pause reading from the engine. */
  pauses = 0;
  readonly rejected = new Map<string, number>();

  constructor(set: EndpointSet) {
    this.#set = set;
    this.ttft = set.all.map(() => new Histogram(TTFT_BUCKETS));
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
    if (!byStatus) byEp.set(endpointId + 1, (byStatus = new Map()));
    byStatus.set(status, (byStatus.get(status) ?? 0) + 1);
  }

  render(): string {
    const out: string[] = [];
    out.push('# HELP switchyard_requests_total Requests answered, by model, endpoint and HTTP status.');
    out.push('# TYPE switchyard_requests_total counter');
    for (const [model, byEp] of this.#requests) {
      for (const [epPlus1, byStatus] of byEp) {
        const ep = epPlus1 === 0 ? '' : this.#set.all[epPlus1 - 1].name;
        for (const [status, n] of byStatus) {
          out.push(`switchyard_requests_total{model="${esc(model)}",endpoint="${esc(ep)}",status="${status}"} ${n}`);
        }
      }
    }
    out.push('# HELP switchyard_routing_decision_seconds Time to pick an endpoint (filters, scorers, picker).');
    out.push('# TYPE switchyard_routing_decision_seconds histogram');
    this.decision.render('switchyard_routing_decision_seconds', '', out);
    out.push('# HELP switchyard_upstream_ttft_seconds Time from dispatch to the first response byte from the endpoint.');
    out.push('# TYPE switchyard_upstream_ttft_seconds histogram');
    for (const ep of this.#set.all) this.ttft[ep.id].render('switchyard_upstream_ttft_seconds', `endpoint="${esc(ep.name)}"`, out);
    out.push('# HELP switchyard_endpoint_in_flight Requests in flight from this router per endpoint.');
    out.push('# TYPE switchyard_endpoint_in_flight gauge');
    for (const ep of this.#set.all) out.push(`switchyard_endpoint_in_flight{endpoint="${esc(ep.name)}"} ${ep.inFlight}`);
    out.push('# HELP switchyard_endpoint_ready 1 when the endpoint is healthy and its circuit breaker closed.');
    out.push('# TYPE switchyard_endpoint_ready gauge');
    const now = performance.now();
    const checks = this.#set.dataLayer.healthIntervalMs > 0;
    for (const ep of this.#set.all) out.push(`switchyard_endpoint_ready{endpoint="${esc(ep.name)}"} ${ep.ready(now, checks) ? 1 : 0}`);
    out.push('# HELP switchyard_prefix_blocks_total Prompt blocks hashed for prefix matching.');
    out.push('# TYPE switchyard_prefix_blocks_total counter');
    out.push(`switchyard_prefix_blocks_total ${this.promptBlocks}`);
    out.push('# HELP switchyard_prefix_matched_blocks_total Prompt blocks the picked endpoint was believed to hold.');
    out.push('# TYPE switchyard_prefix_matched_blocks_total counter');
    out.push(`switchyard_prefix_matched_blocks_total ${this.matchedBlocks}`);
    out.push('# HELP switchyard_prefix_match_ratio Matched / hashed prompt blocks since start.');
    out.push('# TYPE switchyard_prefix_match_ratio gauge');
    out.push(`switchyard_prefix_match_ratio ${this.promptBlocks > 0 ? this.matchedBlocks / this.promptBlocks : 0}`);
    out.push('# HELP switchyard_upstream_retries_total Requests retried on another endpoint before the first byte.');
    out.push('# TYPE switchyard_upstream_retries_total counter');
    out.push(`switchyard_upstream_retries_total ${this.retries}`);
    out.push('# HELP switchyard_relay_pauses_total Times a slow client made the relay pause reading from the engine (backpressure).');
    out.push('# TYPE switchyard_relay_pauses_total counter');
    out.push(`switchyard_relay_pauses_total ${this.pauses}`);
    out.push('# HELP switchyard_rejected_total Requests rejected by the admission gate, by reason.');
    out.push('# TYPE switchyard_rejected_total counter');
    for (const [reason, n] of this.rejected) out.push(`switchyard_rejected_total{reason="${esc(reason)}"} ${n}`);
    return out.join('\n') + '\n';
  }
}
