// Flow-control metrics, kept in flat counters (no per-request allocation) and
// rendered as Prometheus text lines on demand.

/** Queue-wait histogram bucket bounds, seconds. */
export const WAIT_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60] as const;

export const REJECT_REASONS = ['rejected-saturated', 'rejected-capacity', 'rejected-ttl-expired', 'rejected-no-endpoints'] as const;
export type RejectReason = (typeof REJECT_REASONS)[number];

/** Counters of one (flow, band) pair. */
export class FlowStats {
  queued = 0;
  queuedBytes = 0;
  dispatched = 0;
  constructor(
    readonly flowId: string,
    readonly band: number,
  ) {}
}

export class BandStats {
  queued = 0;
  queuedBytes = 0;
  dispatched = 0;
  readonly rejected = new Float64Array(REJECT_REASONS.length);
  readonly waitBuckets = new Float64Array(WAIT_BUCKETS.length + 1);
  waitSum = 0;
  waitCount = 0;

  observeWait(seconds: number): void {
    let i = 0;
    while (i < WAIT_BUCKETS.length && seconds > WAIT_BUCKETS[i]!) i++;
    this.waitBuckets[i]!++;
    this.waitSum += seconds;
    this.waitCount++;
  }
}

function esc(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

/** Renders the metrics of one or more flow controllers (one per pool key) as Prometheus text lines. */
export function renderFlowMetrics(
  sources: Iterable<{ pool: string; bands: readonly string[]; bandStats: readonly BandStats[]; flowStats: Iterable<FlowStats> }>,
): string[] {
  const list = [...sources].map((s) => ({ ...s, flowStats: [...s.flowStats] }));
  const out: string[] = [];
  const family = (name: string, type: string, help: string, body: (push: (s: string) => void) => void) => {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    body((s) => out.push(s));
  };
  const lbl = (pool: string, band: string, flow?: string) =>
    `pool="${esc(pool)}",band="${esc(band)}"` + (flow === undefined ? '' : `,flow="${esc(flow)}"`);

  family('switchyard_flow_queue_length', 'gauge', 'Requests waiting in the flow-control queues, by band and flow.', (push) => {
    for (const s of list) for (const f of s.flowStats) push(`switchyard_flow_queue_length{${lbl(s.pool, s.bands[f.band]!, f.flowId)}} ${f.queued}`);
  });
  family('switchyard_flow_queue_bytes', 'gauge', 'Request body bytes waiting in the flow-control queues, by band and flow.', (push) => {
    for (const s of list) for (const f of s.flowStats) push(`switchyard_flow_queue_bytes{${lbl(s.pool, s.bands[f.band]!, f.flowId)}} ${f.queuedBytes}`);
  });
  family('switchyard_flow_band_queue_length', 'gauge', 'Requests waiting in the flow-control queues, by band.', (push) => {
    for (const s of list) s.bandStats.forEach((b, i) => push(`switchyard_flow_band_queue_length{${lbl(s.pool, s.bands[i]!)}} ${b.queued}`));
  });
  family('switchyard_flow_band_queue_bytes', 'gauge', 'Request body bytes waiting in the flow-control queues, by band.', (push) => {
    for (const s of list) s.bandStats.forEach((b, i) => push(`switchyard_flow_band_queue_bytes{${lbl(s.pool, s.bands[i]!)}} ${b.queuedBytes}`));
  });
  family('switchyard_flow_dispatched_total', 'counter', 'Requests let through flow control, by band and flow.', (push) => {
    for (const s of list) for (const f of s.flowStats) push(`switchyard_flow_dispatched_total{${lbl(s.pool, s.bands[f.band]!, f.flowId)}} ${f.dispatched}`);
  });
  family('switchyard_flow_rejected_total', 'counter', 'Requests rejected by flow control, by band and reason.', (push) => {
    for (const s of list)
      s.bandStats.forEach((b, i) =>
        REJECT_REASONS.forEach((r, k) => push(`switchyard_flow_rejected_total{${lbl(s.pool, s.bands[i]!)},reason="${r}"} ${b.rejected[k]}`)),
      );
  });
  family('switchyard_flow_queue_wait_seconds', 'histogram', 'Time requests waited in flow control before dispatch, by band.', (push) => {
    for (const s of list)
      s.bandStats.forEach((b, i) => {
        const l = lbl(s.pool, s.bands[i]!);
        let cum = 0;
        WAIT_BUCKETS.forEach((le, k) => {
          cum += b.waitBuckets[k]!;
          push(`switchyard_flow_queue_wait_seconds_bucket{${l},le="${le}"} ${cum}`);
        });
        cum += b.waitBuckets[WAIT_BUCKETS.length]!;
        push(`switchyard_flow_queue_wait_seconds_bucket{${l},le="+Inf"} ${cum}`);
        push(`switchyard_flow_queue_wait_seconds_sum{${l}} ${b.waitSum}`);
        push(`switchyard_flow_queue_wait_seconds_count{${l}} ${b.waitCount}`);
      });
  });
  return out;
}
