// Flow-control shares across active-active replicas (`ha.shareFlows`, on by
// default with `ha: { redis }`; docs/flow-control.md "Active-active replicas").
//
// Each replica's flow controllers order only the requests that reached that
// replica. Without more, a tenant whose requests all reach one replica gets
// what that replica's dispatches give it, and a premium request queued at one
// replica waits while another replica hands a freed slot to a standard one.
// So every replica puts its flows into its fleet message (src/ha/fleet.ts):
// per (pool, band, flow) the requests it has in flight and queued (and how
// many it dispatched lately, a decaying count), while the
// fleet holds requests anywhere in that pool (nothing is sent while nobody
// queues: shares only matter when capacity is short). FleetFlows adds up the
// other replicas' last reports, per pool and band; each FlowController reads
// its pool's through a FleetView and, when it could dispatch:
//
// - holds a band while another replica has requests queued in a higher band
//   (premium's reserve, fleet-wide);
// - inside a band, dispatches the fleet's next flow: among the flows with
//   requests queued anywhere, the one with the fewest requests in flight
//   fleet-wide for its weight (minShare water-filled, as the controller
//   weighs them), and between flows level on that, the one dispatched least
//   lately; it holds when that flow is another replica's, or when it is
//   ours but another replica holds an older request of it (inside a flow,
//   the fleet's oldest request goes first).
//
// A hold is bounded (`ha.flowHoldMs`): if the capacity is still there when it
// runs out, the replica dispatches anyway (work conservation over fairness),
// so a slow or silent peer costs at most that long. A hold asks the fleet
// share to send this replica's report at once (FleetView.nudge), so the
// others see the freed capacity within one append and one read.
//
// What a peer sends is checked here (types, sizes, counts): a replica that
// sends garbage is skipped tuple by tuple, never trusted with more than
// MAX_FLOW_TUPLES flows or counts over MAX_COUNT.

/** One flow's requests at the other replicas (the sum of their last reports). */
export interface PeerFlow {
  inFlight: number;
  queued: number;
  /** Requests dispatched lately (each replica's decaying count, summed): the share check's tie-breaker. */
  served: number;
}

/** A band of one pool at the other replicas: per flow, and the totals. */
export interface PeerBand {
  readonly flows: Map<string, PeerFlow>;
  inFlight: number;
  queued: number;
}

/** What a FlowController reads of the fleet (one per pool; FlowControlGate.attachFleet builds them). */
export interface FleetView {
  /** The other replicas' flows in band `band` of this pool; undefined when they report none. */
  band(band: number): PeerBand | undefined;
  /** Requests queued at the other replicas in bands 0..band (0 when none). */
  queuedAtOrAbove(band: number): number;
  /** The longest a controller holds capacity for another replica, ms. */
  readonly holdMs: number;
  /** Moves when a peer shows progress in this pool (a dispatch or completion, a flow that came or went; FleetFlows.version). */
  readonly version: number;
  /**
   * performance.now() (this replica's clock) at which the oldest request of
   * `flow` in band `band` queued at another replica was enqueued, as of its
   * report; Infinity when none queues it. Inside a flow, the oldest request
   * of the fleet goes first.
   */
  oldestElsewhere(band: number, flow: string): number;
  /** This replica's flows changed in a way the others should see now (a hold, a queue that started). */
  nudge(): void;
}

/** The most flows one replica's report may carry (larger reports are cut there, larger received ones skipped beyond it). */
export const MAX_FLOW_TUPLES = 1024;
/** Fields per flow in a report: pool, band name, flow id, in flight, queued, dispatched lately, age of its oldest queued request (ms). */
export const FLOW_TUPLE = 7;
/** Counts above this in a peer's report are taken as this. */
const MAX_COUNT = 1_000_000;
/** Pool, band and flow names longer than this are skipped. */
const MAX_NAME = 512;

/** What the local gate gives the fleet message (FlowControlGate.fleetReport). */
export interface FlowReporter {
  /** Appends this replica's tuples (FLOW_TUPLE fields each) to `out`, at most `max` tuples. */
  fleetReport(out: unknown[], max: number): void;
}

export class FleetFlows {
  readonly holdMs: number;
  /** Each peer's last report, as accepted (flat tuples). */
  readonly #peers = new Map<string, unknown[]>();
  /** Per peer: `pool \0 band \0 flow` → when its oldest queued request was enqueued (this replica's clock). */
  readonly #oldest = new Map<string, Map<string, number>>();
  /** pool → band name → the peers' sums. */
  readonly #pools = new Map<string, Map<string, PeerBand>>();
  #reporter: FlowReporter | null = null;
  #nudge: () => void = () => {};
  #changed: () => void = () => {};
  /** Tuples skipped as malformed (counted for the metrics). */
  malformed = 0;
  /** Moves every pool's version at once (clear). */
  #epoch = 0;
  /** pool → moves when a peer shows progress in that pool (#moved; FleetView.version); only pools with a view here. */
  readonly #versions = new Map<string, number>();

  constructor(holdMs: number) {
    this.holdMs = holdMs;
  }

  /** The gate whose flows this replica reports, and what to call when the peers' flows changed (its onCapacity). */
  attach(reporter: FlowReporter, changed: () => void): void {
    this.#reporter = reporter;
    this.#changed = changed;
  }

  /** What asks the fleet share for a prompt message (FleetShare). */
  onNudge(fn: () => void): void {
    this.#nudge = fn;
  }

  nudge(): void {
    this.#nudge();
  }

  /** This replica's report (flat tuples), or undefined when it has none. */
  report(): unknown[] | undefined {
    if (this.#reporter === null) return undefined;
    const out: unknown[] = [];
    this.#reporter.fleetReport(out, MAX_FLOW_TUPLES);
    return out.length > 0 ? out : undefined;
  }

  /** Peers with a report in the sums. */
  get peers(): number {
    return this.#peers.size;
  }

  /** A peer's new report (its message's `f` field, anything at all: checked here) replaces its last one. */
  setPeer(replica: string, raw: unknown): void {
    const old = this.#peers.get(replica);
    const next = this.#accept(raw);
    if (old === undefined && next.length === 0) return;
    if (old !== undefined) this.#add(old, -1);
    if (next.length === 0) {
      this.#peers.delete(replica);
      this.#oldest.delete(replica);
    } else {
      this.#peers.set(replica, next);
      this.#add(next, 1);
      // ages become enqueue times on this replica's clock (the report's lag makes them look younger: a conservative error)
      const now = performance.now();
      let m = this.#oldest.get(replica);
      if (m === undefined) this.#oldest.set(replica, (m = new Map()));
      else m.clear();
      for (let o = 0; o < next.length; o += FLOW_TUPLE) {
        if ((next[o + 4] as number) > 0) m.set(tupleKey(next, o), now - (next[o + 6] as number));
      }
    }
    this.#moved(old, next);
    // a peer that starts holding requests needs this replica's flows for its shares: send them now
    if (queuedIn(next) > 0 && (old === undefined || queuedIn(old) === 0)) this.#nudge();
    this.#changed();
  }

  /** A peer left or went silent: its flows go out of the sums. */
  dropPeer(replica: string): void {
    const old = this.#peers.get(replica);
    if (old === undefined) return;
    this.#peers.delete(replica);
    this.#oldest.delete(replica);
    this.#add(old, -1);
    this.#moved(old, []);
    this.#changed();
  }

  /** Every peer's flows out (this replica lost the fleet, or stops). */
  clear(): void {
    if (this.#peers.size === 0) return;
    this.#peers.clear();
    this.#oldest.clear();
    this.#pools.clear();
    this.#epoch++;
    this.#changed();
  }

  /**
   * Moves when a peer shows progress in `pool` (#moved): a flow came or went,
   * a flow's requests in flight changed (a dispatch or a completion), its
   * dispatches lately went up, or its oldest queued request got younger (the
   * one before left the queue). Ages grow and dispatch counts decay on every
   * report, and a queue grows and shrinks with arrivals, expiries and
   * cancels at a peer that dispatches nothing: none of that is progress, so
   * a stuck peer that keeps reporting does not start another hold with each
   * message (FlowController's one hold).
   */
  version(pool: string): number {
    return this.#epoch + (this.#versions.get(pool) ?? 0);
  }

  /** Moves the version of each pool (with a view here) in which a peer's new report shows progress against its last one. */
  #moved(old: unknown[] | undefined, next: unknown[]): void {
    if (this.#versions.size === 0) return;
    // this peer's last tuples of the tracked pools, by pool \0 band \0 flow
    const before = new Map<string, number>();
    if (old !== undefined) {
      for (let o = 0; o < old.length; o += FLOW_TUPLE) if (this.#versions.has(old[o] as string)) before.set(tupleKey(old, o), o);
    }
    const moved = new Set<string>();
    for (let o = 0; o < next.length; o += FLOW_TUPLE) {
      const pool = next[o] as string;
      if (!this.#versions.has(pool)) continue;
      const k = tupleKey(next, o);
      const b = before.get(k);
      if (b === undefined) {
        moved.add(pool); // a flow that was not there
        continue;
      }
      before.delete(k);
      if (moved.has(pool)) continue;
      const was = old!;
      // in flight: a dispatch or a completion; dispatched lately only rises with a dispatch; a younger oldest: the old one left
      if (next[o + 3] !== was[b + 3] || (next[o + 5] as number) > (was[b + 5] as number) || (next[o + 6] as number) < (was[b + 6] as number)) moved.add(pool);
    }
    // flows gone from the report
    for (const o of before.values()) moved.add(old![o] as string);
    for (const pool of moved) this.#versions.set(pool, this.#versions.get(pool)! + 1);
  }

  /** The peers' sums for one band of one pool. */
  band(pool: string, band: string): PeerBand | undefined {
    return this.#pools.get(pool)?.get(band);
  }

  /** A pool's view for its controller: band indexes mapped to the config's band names. */
  view(pool: string, bands: readonly string[]): FleetView {
    const flows = this;
    if (!this.#versions.has(pool)) this.#versions.set(pool, 0);
    return {
      holdMs: this.holdMs,
      get version() {
        return flows.version(pool);
      },
      band: (b) => flows.#pools.get(pool)?.get(bands[b]!),
      oldestElsewhere(b, flow) {
        const key = `${pool}\0${bands[b]!}\0${flow}`;
        let at = Infinity;
        for (const m of flows.#oldest.values()) {
          const v = m.get(key);
          if (v !== undefined && v < at) at = v;
        }
        return at;
      },
      queuedAtOrAbove(b) {
        const p = flows.#pools.get(pool);
        if (p === undefined) return 0;
        let n = 0;
        for (let i = 0; i <= b && i < bands.length; i++) n += p.get(bands[i]!)?.queued ?? 0;
        return n;
      },
      nudge: () => flows.#nudge(),
    };
  }

  /** The well-formed tuples of a report, at most MAX_FLOW_TUPLES. */
  #accept(raw: unknown): unknown[] {
    if (!Array.isArray(raw) || raw.length === 0) return [];
    const out: unknown[] = [];
    const n = Math.min(Math.floor(raw.length / FLOW_TUPLE), MAX_FLOW_TUPLES);
    if (raw.length % FLOW_TUPLE !== 0 || raw.length / FLOW_TUPLE > MAX_FLOW_TUPLES) this.malformed++;
    for (let k = 0; k < n; k++) {
      const o = k * FLOW_TUPLE;
      const pool = raw[o];
      const band = raw[o + 1];
      const flow = raw[o + 2];
      const i = count(raw[o + 3]);
      const q = count(raw[o + 4]);
      const d = raw[o + 5];
      const age = raw[o + 6];
      if (!name(pool) || !name(band) || !name(flow) || i < 0 || q < 0 || typeof d !== 'number' || !(d >= 0 && d <= MAX_COUNT) || typeof age !== 'number' || !(age >= 0 && age <= 86_400_000)) {
        this.malformed++;
        continue;
      }
      if (i === 0 && q === 0) continue;
      out.push(pool, band, flow, i, q, d, age);
    }
    return out;
  }

  #add(tuples: unknown[], sign: 1 | -1): void {
    for (let o = 0; o < tuples.length; o += FLOW_TUPLE) {
      const pool = tuples[o] as string;
      const bandName = tuples[o + 1] as string;
      const flow = tuples[o + 2] as string;
      const i = (tuples[o + 3] as number) * sign;
      const q = (tuples[o + 4] as number) * sign;
      const d = (tuples[o + 5] as number) * sign;
      let bands = this.#pools.get(pool);
      if (bands === undefined) {
        if (sign < 0) continue;
        bands = new Map();
        this.#pools.set(pool, bands);
      }
      let b = bands.get(bandName);
      if (b === undefined) {
        if (sign < 0) continue;
        b = { flows: new Map(), inFlight: 0, queued: 0 };
        bands.set(bandName, b);
      }
      let f = b.flows.get(flow);
      if (f === undefined) {
        if (sign < 0) continue;
        f = { inFlight: 0, queued: 0, served: 0 };
        b.flows.set(flow, f);
      }
      f.inFlight += i;
      f.queued += q;
      f.served = Math.max(0, f.served + d);
      b.inFlight += i;
      b.queued += q;
      if (f.inFlight <= 0 && f.queued <= 0) b.flows.delete(flow);
      if (b.flows.size === 0) bands.delete(bandName);
      if (bands.size === 0) this.#pools.delete(pool);
    }
  }
}

function tupleKey(t: unknown[], o: number): string {
  return `${t[o] as string}\0${t[o + 1] as string}\0${t[o + 2] as string}`;
}

/** Requests queued in a report's tuples. */
function queuedIn(tuples: unknown[]): number {
  let q = 0;
  for (let o = 0; o < tuples.length; o += FLOW_TUPLE) q += tuples[o + 4] as number;
  return q;
}

function name(v: unknown): v is string {
  return typeof v === 'string' && v.length > 0 && v.length <= MAX_NAME;
}

/** A count from a peer: a whole number ≥ 0 (capped), or -1 when it is not one. */
function count(v: unknown): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) return -1;
  return Math.min(Math.floor(v), MAX_COUNT);
}
