// Flow-control metrics, kept in flat counters (no per-request allocation) and
// read by prom-client collectors at scrape time (registerFlowMetrics).
import { Counter, Gauge } from 'prom-client';
import { Histogram } from '../metrics/histogram.js';
import { HistogramMetric, type Registry } from '../metrics/prom.js';

/** Queue-wait histogram bucket bounds, seconds. */
export const WAIT_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60] as const;

export const REJECT_REASONS = ['rejected-saturated', 'rejected-capacity', 'rejected-ttl-expired', 'rejected-no-endpoints'] as const;
export type RejectReason = (typeof REJECT_REASONS)[number];

/** Counters of one (flow, band) pair. */
export class FlowStats {
  queued = 0;
  queuedBytes = 0;
  dispatched = 0;
  /** Requests of this flow shed (rejected-saturated or rejected-capacity), at arrival or from its queue. */
  shed = 0;
  constructor(
    readonly flowId: string,
    readonly band: number,
  ) {}
}

export class BandStats {
  /** Requests that reached admission in this band (flow control on). */
  arrived = 0;
  /** The band's drain rate D_b, requests/s (mode probabilistic; NaN until measured). */
  drainRate = NaN;
  /** The band's shed probability for arrivals under sustained overload (mode probabilistic). */
  shedProbability = 0;
  queued = 0;
  queuedBytes = 0;
  dispatched = 0;
  /** Continuation requests dispatched from the queue ahead of cold ones (turn priority). */
  continuations = 0;
  /** Active-active: times this band held capacity for another replica's requests, and holds that ran out (dispatched anyway). */
  fleetHolds = 0;
  fleetHoldsExpired = 0;
  readonly rejected = new Float64Array(REJECT_REASONS.length);
  /** Seconds waited in the queue before dispatch. */
  readonly wait = new Histogram(WAIT_BUCKETS);

  observeWait(seconds: number): void {
    this.wait.observe(seconds);
  }
}

/** The flow-control state of one pool, as the collectors read it. */
export interface FlowMetricsSource {
  readonly pool: string;
  readonly bands: readonly string[];
  readonly bandStats: readonly BandStats[];
  readonly flowStats: Iterable<FlowStats>;
}

/**
 * Registers the switchyard_flow_* families in `registry`; `sources` is called
 * at each scrape and yields the state of every flow controller (one per pool).
 */
export function registerFlowMetrics(registry: Registry, sources: () => Iterable<FlowMetricsSource>): void {
  const registers = [registry];
  type FlowLabels = 'pool' | 'band' | 'flow';
  type BandLabels = 'pool' | 'band';
  const perFlow = (set: (pool: string, band: string, flow: string, f: FlowStats) => void) => {
    for (const s of sources()) for (const f of s.flowStats) set(s.pool, s.bands[f.band]!, f.flowId, f);
  };
  const perBand = (set: (pool: string, band: string, b: BandStats) => void) => {
    for (const s of sources()) s.bandStats.forEach((b, i) => set(s.pool, s.bands[i]!, b));
  };
  const flowGauge = (name: string, help: string, read: (f: FlowStats) => number) =>
    new Gauge<FlowLabels>({
      name,
      help,
      labelNames: ['pool', 'band', 'flow'],
      registers,
      collect() {
        this.reset();
        perFlow((pool, band, flow, f) => this.set({ pool, band, flow }, read(f)));
      },
    });
  const bandGauge = (name: string, help: string, read: (b: BandStats) => number) =>
    new Gauge<BandLabels>({
      name,
      help,
      labelNames: ['pool', 'band'],
      registers,
      collect() {
        this.reset();
        perBand((pool, band, b) => this.set({ pool, band }, read(b)));
      },
    });

  flowGauge('switchyard_flow_queue_length', 'Requests waiting in the flow-control queues, by band and flow.', (f) => f.queued);
  flowGauge('switchyard_flow_queue_bytes', 'Request body bytes waiting in the flow-control queues, by band and flow.', (f) => f.queuedBytes);
  bandGauge('switchyard_flow_band_queue_length', 'Requests waiting in the flow-control queues, by band.', (b) => b.queued);
  bandGauge('switchyard_flow_band_queue_bytes', 'Request body bytes waiting in the flow-control queues, by band.', (b) => b.queuedBytes);
  bandGauge(
    'switchyard_flow_drain_rate',
    'Requests per second the pool drains for the band (admission mode probabilistic: completions per second of busy time less the higher bands\' dispatch rates); -1 until measured.',
    (b) => (b.drainRate === b.drainRate ? b.drainRate : -1),
  );
  bandGauge(
    'switchyard_flow_shed_probability',
    'Probability an arrival of the band is shed for sustained overload (admission mode probabilistic; 0 unless its queue sojourn stayed above admission.target for admission.interval).',
    (b) => b.shedProbability,
  );
  new Counter<FlowLabels>({
    name: 'switchyard_flow_dispatched_total',
    help: 'Requests let through flow control, by band and flow.',
    labelNames: ['pool', 'band', 'flow'],
    registers,
    collect() {
      this.reset();
      perFlow((pool, band, flow, f) => this.inc({ pool, band, flow }, f.dispatched));
    },
  });
  new Counter<FlowLabels>({
    name: 'switchyard_flow_shed_total',
    help: 'Requests shed by flow control (rejected-saturated or rejected-capacity), by band and flow: the flow that was shed, whether at arrival or from its queue.',
    labelNames: ['pool', 'band', 'flow'],
    registers,
    collect() {
      this.reset();
      perFlow((pool, band, flow, f) => {
        if (f.shed > 0) this.inc({ pool, band, flow }, f.shed);
      });
    },
  });
  new Counter<BandLabels>({
    name: 'switchyard_flow_continuations_total',
    help: 'Continuation requests dispatched from the flow-control queues (turn priority), by band.',
    labelNames: ['pool', 'band'],
    registers,
    collect() {
      this.reset();
      perBand((pool, band, b) => this.inc({ pool, band }, b.continuations));
    },
  });
  new Counter<BandLabels | 'outcome'>({
    name: 'switchyard_flow_fleet_holds_total',
    help: 'Active-active (ha.shareFlows): times the band left free capacity to another replica\'s requests (a higher band queued there, or its flows under their fleet share while this replica\'s were over), by outcome: taken (the state moved within ha.flowHoldMs) or expired (dispatched here anyway).',
    labelNames: ['pool', 'band', 'outcome'],
    registers,
    collect() {
      this.reset();
      perBand((pool, band, b) => {
        if (b.fleetHolds === 0) return;
        this.inc({ pool, band, outcome: 'taken' }, b.fleetHolds - b.fleetHoldsExpired);
        this.inc({ pool, band, outcome: 'expired' }, b.fleetHoldsExpired);
      });
    },
  });
  new Counter<BandLabels | 'reason'>({
    name: 'switchyard_flow_rejected_total',
    help: 'Requests rejected by flow control, by band and reason.',
    labelNames: ['pool', 'band', 'reason'],
    registers,
    collect() {
      this.reset();
      perBand((pool, band, b) => REJECT_REASONS.forEach((reason, k) => this.inc({ pool, band, reason }, b.rejected[k]!)));
    },
  });
  new HistogramMetric<BandLabels>({
    name: 'switchyard_flow_queue_wait_seconds',
    help: 'Time requests waited in flow control before dispatch, by band.',
    labelNames: ['pool', 'band'],
    buckets: WAIT_BUCKETS,
    registers,
    series: (emit) => perBand((pool, band, b) => emit({ pool, band }, b.wait)),
  });
}
