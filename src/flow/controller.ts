// The flow-control admission gate for one pool of endpoints.
//
// admit() either lets a request through at once (nothing queued and the pool
// has capacity), rejects it (probabilistic shedding above maxUtilisation,
// queue limits, no endpoints), or queues it in the native per-(flow, band)
// FIFO and returns a promise that settles when the dispatch loop grants it,
// the TTL expires, or the client leaves. The dispatch loop runs on
// release() / onCapacity() / the sweep timer: strict band priority; inside a
// band, stride scheduling across flows with weights from minShare.
//
// Payloads stay in JS (a Map from record id to the waiting entry); the native
// queue holds [id, bytes, time] records. A client that disconnects leaves a
// tombstone: its id is dropped from the map and the record is skipped when it
// reaches the head.
import type { AbortLike } from '../admission.js';
import { FlowQueues, FLOW_RECORD_WORDS, flowRecordId } from '../../bindings/flow-queues.js';
import { ProbabilisticAdmission, type Rng } from './admission.js';
import type { FlowControlConfig } from './config.js';
import { BandStats, FlowStats, REJECT_REASONS, type RejectReason } from './metrics.js';

export type { RejectReason } from './metrics.js';

/** The request facts flow control needs. */
export interface FlowRequest {
  /** Fairness id (see Classifier.flowId). */
  flowId: string;
  /** Band index, 0 = highest (see Classifier.band). */
  band: number;
  /** Request body bytes (for maxBytes limits and metrics). */
  bytes: number;
}

/** The contract's abort signal: `onabort` is called once if the client leaves. */
export type AbortHook = AbortLike;

export interface Granted {
  readonly ok: true;
  /** Pass back to release() when the request ends. */
  readonly ticket: number;
}

export interface Refused {
  readonly ok: false;
  /** 429 (shed, over a limit, expired), 503 (no endpoint), 499 (the client left while queued). */
  readonly status: 429 | 503 | 499;
  readonly reason: RejectReason | 'cancelled';
  readonly retryAfterSeconds: number;
  readonly message: string;
}

export type AdmitResult = Granted | Refused;

export interface FlowControllerOptions {
  config: FlowControlConfig;
  /**
   * Pool utilisation: the least-loaded candidate endpoint's load (see
   * SaturationDetector.poolLoad). >= 1 means every candidate is saturated:
   * requests are held. Infinity means there is no endpoint.
   */
  utilisation: () => number;
  /** Overrides the `utilisation() >= 1` saturation test. */
  isSaturated?: () => boolean;
  /**
   * What one more request adds to the utilisation `utilisation()` last
   * returned (1 / the least-loaded endpoint's batch limit). With it, a request
   * below the top band starts only if the pool stays at or below
   * maxUtilisation once it runs, so a small batch keeps at least one slot for
   * the top band (4 slots at 0.85: 3 for lower bands, not 4). Without it:
   * only while the utilisation is below maxUtilisation.
   */
  step?: () => number;
  /** Optional hard cap on requests granted and not yet released. */
  maxInFlight?: number;
  /** Clock in ms (default performance.now). */
  now?: () => number;
  /** Random source for probabilistic admission (default Math.random). */
  rng?: Rng;
  /** Run the TTL sweep on a timer (default true; tests with a virtual clock call sweep() themselves). */
  sweepTimer?: boolean;
  /** Label for metrics (e.g. the model name). */
  pool?: string;
}

/** One native queue: the requests of one flow in one band. */
class Slot {
  live = 0;
  bytes = 0;
  pass = 0;
  weight = 1;
  active = false;
  stats: FlowStats;
  constructor(
    readonly index: number,
    public flowId: string,
    public band: number,
    public minShare: number,
    readonly dynamic: boolean,
  ) {
    this.stats = new FlowStats(flowId, band);
  }
}

interface Waiting {
  readonly id: number;
  readonly slot: Slot;
  readonly bytes: number;
  readonly enqueuedAt: number;
  readonly resolve: (r: AdmitResult) => void;
  readonly signal: AbortHook | null;
}

/** Per-band scheduling state. */
class Band {
  readonly active: Slot[] = [];
  vtime = 0;
  weightsDirty = true;
}

const MAX_FLOW_STATS_FACTOR = 4;

/** The metrics series shared by flows beyond the label-cardinality limit. */
const OTHER_FLOWS = '(other)';

export class FlowController {
  readonly config: FlowControlConfig;
  readonly pool: string;
  readonly bandStats: BandStats[];
  readonly #utilisation: () => number;
  readonly #customSaturated: (() => boolean) | null;
  readonly #step: (() => number) | null;
  readonly #maxInFlight: number;
  /** Utilisation below which bands other than the top one may be dispatched. */
  readonly #ceiling: number;
  readonly #now: () => number;
  readonly #admission: ProbabilisticAdmission | null;
  readonly #queues: FlowQueues;
  readonly #slots: Slot[] = [];
  readonly #bySlotKey: Map<string, Slot>[];
  readonly #overflow: Slot[];
  readonly #free: number[] = [];
  readonly #bands: Band[];
  readonly #minShare = new Map<string, number>();
  readonly #waiting = new Map<number, Waiting>();
  readonly #flowStats: Map<string, FlowStats>[];
  readonly #granted: Granted[];
  readonly #refused: Record<RejectReason | 'cancelled', Refused>;
  readonly #buf = new Uint32Array(FLOW_RECORD_WORDS);
  #compactBuf = new Uint32Array(0);
  #nextId = 1;
  #queued = 0;
  #queuedBytes = 0;
  #inFlight = 0;
  #pumpScheduled = false;
  #timer: ReturnType<typeof setInterval> | null = null;
  #closed = false;
  readonly #pumpFn = (): void => this.pump();

  constructor(opts: FlowControllerOptions) {
    const cfg = opts.config;
    this.config = cfg;
    this.pool = opts.pool ?? 'default';
    this.#utilisation = opts.utilisation;
    this.#customSaturated = opts.isSaturated ?? null;
    this.#step = opts.step ?? null;
    this.#maxInFlight = opts.maxInFlight ?? Infinity;
    this.#ceiling = cfg.admission.maxUtilisation;
    this.#now = opts.now ?? (() => performance.now());
    this.#admission =
      cfg.admission.mode === 'probabilistic' ? new ProbabilisticAdmission(cfg.admission.maxUtilisation, opts.rng) : null;
    const nb = cfg.bands.length;
    this.bandStats = cfg.bands.map(() => new BandStats());
    this.#bands = cfg.bands.map(() => new Band());
    this.#bySlotKey = cfg.bands.map(() => new Map());
    this.#flowStats = cfg.bands.map(() => new Map());
    this.#granted = cfg.bands.map((_, i) => Object.freeze({ ok: true as const, ticket: i }));
    const retry = cfg.retryAfterSeconds;
    const refuse = (status: 429 | 503 | 499, reason: RejectReason | 'cancelled', message: string): Refused =>
      Object.freeze({ ok: false as const, status, reason, retryAfterSeconds: retry, message });
    this.#refused = {
      'rejected-saturated': refuse(429, 'rejected-saturated', 'The service is saturated; request shed by admission control. Retry later.'),
      'rejected-capacity': refuse(429, 'rejected-capacity', 'Too many requests are queued; retry later.'),
      'rejected-ttl-expired': refuse(429, 'rejected-ttl-expired', 'The request waited in the queue longer than its time limit; retry later.'),
      'rejected-no-endpoints': refuse(503, 'rejected-no-endpoints', 'No endpoint is available to serve this request.'),
      cancelled: refuse(499, 'cancelled', 'The client went away while the request was queued.'),
    };
    for (const f of cfg.flows) this.#minShare.set(f.id, f.minShare);

    // Slots: one per declared flow at its declared band, dynamic ones, and one overflow per band.
    const total = cfg.maxFlows + nb;
    this.#queues = FlowQueues.create({ flows: total, capacity: cfg.queueCapacity });
    const bandIndex = new Map(cfg.bands.map((b, i) => [b, i]));
    let next = 0;
    for (const f of cfg.flows) {
      const band = bandIndex.get(f.priority) ?? 0;
      const s = new Slot(next++, f.id, band, f.minShare, false);
      s.stats = this.#statsFor(f.id, band);
      this.#slots.push(s);
      this.#bySlotKey[band]!.set(f.id, s);
    }
    for (; next < cfg.maxFlows; next++) {
      this.#slots.push(new Slot(next, '', 0, 0, true));
      this.#free.push(next);
    }
    this.#free.reverse();
    this.#overflow = cfg.bands.map((_, band) => {
      const s = new Slot(next++, '(overflow)', band, 0, false);
      s.stats = this.#statsFor('(overflow)', band);
      this.#slots.push(s);
      return s;
    });
    if (cfg.enabled && opts.sweepTimer !== false) {
      this.#timer = setInterval(() => this.sweep(), cfg.sweepIntervalMs);
      this.#timer.unref();
    }
  }

  /** Requests waiting in the queues. */
  get queued(): number {
    return this.#queued;
  }

  get queuedBytes(): number {
    return this.#queuedBytes;
  }

  /** Requests granted and not yet released. */
  get inFlight(): number {
    return this.#inFlight;
  }

  /** Per-(flow, band) counters, for metrics. */
  *flowStats(): IterableIterator<FlowStats> {
    for (const m of this.#flowStats) yield* m.values();
  }

  /**
   * Admits, rejects or queues a request. Resolves synchronously (a plain
   * result, no promise) when no waiting is needed.
   */
  admit(req: FlowRequest, signal: AbortHook | null = null): AdmitResult | Promise<AdmitResult> {
    const band = req.band;
    if (!(band >= 0 && band < this.bandStats.length && band % 1 === 0)) {
      throw new RangeError(`FlowController.admit: band must be an integer in [0, ${this.bandStats.length - 1}], got ${band}`);
    }
    if (!this.config.enabled) {
      this.#inFlight++;
      return this.#granted[band]!;
    }
    if (this.#closed) return this.#reject(band, 'rejected-no-endpoints');
    const u = this.#utilisation();
    if (u === Infinity) return this.#reject(band, 'rejected-no-endpoints');
    if (this.#admission !== null && !this.#admission.admit(band, u)) return this.#reject(band, 'rejected-saturated');
    if (signal !== null && signal.aborted) return this.#refused.cancelled;
    const slot = this.#slotFor(req.flowId, band);
    // NaN, negative or fractional sizes count as their integer part, at least 0
    const bytes = req.bytes >= 0 ? Math.min(Math.floor(req.bytes), 0xffffffff) : 0;

    if (!this.#waitingAtOrAbove(band) && this.#inFlight < this.#maxInFlight && this.#canDispatch(band, u)) {
      this.#grantStats(slot, 0);
      this.#inFlight++;
      return this.#granted[band]!;
    }

    // queue limits
    const cfg = this.config;
    const bl = cfg.limits.bands[cfg.bands[band]!];
    const bs = this.bandStats[band]!;
    if (
      this.#queued + 1 > cfg.limits.maxRequests ||
      this.#queuedBytes + bytes > cfg.limits.maxBytes ||
      (bl !== undefined && (bs.queued + 1 > bl.maxRequests || bs.queuedBytes + bytes > bl.maxBytes))
    ) {
      return this.#reject(band, 'rejected-capacity');
    }
    const now = this.#now();
    const id = this.#nextId++;
    if (!this.#queues.enqueue(slot.index, id, bytes, now >>> 0) && !(this.#compact(slot) && this.#queues.enqueue(slot.index, id, bytes, now >>> 0))) {
      return this.#reject(band, 'rejected-capacity');
    }
    return new Promise<AdmitResult>((resolve) => {
      const w: Waiting = { id, slot, bytes, enqueuedAt: now, resolve, signal };
      this.#waiting.set(id, w);
      this.#addQueued(slot, bytes);
      if (signal !== null) signal.onabort = () => this.#cancel(w);
      this.#schedulePump();
    });
  }

  /** Call once for every granted request when it ends. */
  release(ticket: number): void {
    if (this.#inFlight > 0) this.#inFlight--;
    if (this.#queued > 0) this.#schedulePump();
  }

  /** Call when capacity may have appeared (fresh metrics, an endpoint came back). */
  onCapacity(): void {
    if (this.#queued > 0) this.#schedulePump();
  }

  /** Rejects queued requests older than the TTL, drops tombstones at queue heads, and pumps. */
  sweep(now: number = this.#now()): number {
    let expired = 0;
    if (this.#queued === 0) return 0;
    const ttl = this.config.ttlMs;
    const buf = this.#buf;
    for (const band of this.#bands) {
      for (let i = 0; i < band.active.length; i++) {
        const slot = band.active[i]!;
        // heads are the oldest records of their queue
        while (this.#queues.peek(slot.index, buf)) {
          const w = this.#waiting.get(flowRecordId(buf, 0));
          if (w !== undefined && now - w.enqueuedAt < ttl) break;
          this.#queues.dequeueBatch(slot.index, buf, 1);
          if (w !== undefined) {
            this.#waiting.delete(w.id);
            this.#removeQueued(w);
            this.#expire(w);
            expired++;
            if (!slot.active) {
              // it left band.active (swapped with the last entry): revisit index i; only tombstones remain in its ring
              i--;
              break;
            }
          }
        }
      }
    }
    if (this.#queued > 0) this.#schedulePump();
    return expired;
  }

  /** Stops the sweep timer and rejects everything still queued (503). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
    for (const w of [...this.#waiting.values()]) {
      this.#waiting.delete(w.id);
      this.#removeQueued(w);
      w.resolve(this.#refused['rejected-no-endpoints']);
    }
    this.#queues.close();
  }

  /** Runs the dispatch loop now (normally scheduled as a microtask). */
  pump(): void {
    this.#pumpScheduled = false;
    if (this.#closed) return;
    while (this.#queued > 0 && this.#inFlight < this.#maxInFlight) {
      const band = this.#topBand();
      if (band < 0 || !this.#canDispatch(band, this.#utilisation())) break;
      const w = this.#nextIn(band);
      if (w === undefined) continue;
      if (this.#now() - w.enqueuedAt >= this.config.ttlMs) {
        // expired between sweeps: never dispatch a request its client has been told to give up on
        this.#expire(w);
        continue;
      }
      this.#grant(w);
      // One grant per turn of the event loop: the server's dispatch of this
      // request (which raises the endpoint's in-flight count, and so the
      // utilisation) runs in the promise reactions before the next check.
      if (this.#queued > 0) this.#schedulePump(true);
      return;
    }
  }

  // ---- internals -------------------------------------------------------------

  /**
   * May a request of `band` start at utilisation `u`? The top band may use the
   * pool up to saturation; lower bands only while it stays at or below
   * maxUtilisation with them (below it, without a `step`), so the last stretch
   * of capacity stays free for the top band's arrivals.
   */
  #canDispatch(band: number, u: number): boolean {
    if (this.#customSaturated !== null ? this.#customSaturated() : !(u < 1)) return false;
    if (band === 0) return true;
    return this.#step !== null ? u + this.#step() <= this.#ceiling : u < this.#ceiling;
  }

  #schedulePump(afterReactions = false): void {
    if (this.#pumpScheduled) return;
    this.#pumpScheduled = true;
    if (afterReactions) setImmediate(this.#pumpFn);
    else queueMicrotask(this.#pumpFn);
  }

  #reject(band: number, reason: RejectReason): Refused {
    const bs = this.bandStats[band] ?? this.bandStats[0]!;
    bs.rejected[REJECT_REASONS.indexOf(reason)]!++;
    return this.#refused[reason];
  }

  #statsFor(flowId: string, band: number): FlowStats {
    const m = this.#flowStats[band]!;
    let s = m.get(flowId);
    if (s === undefined) {
      // bound label cardinality: beyond the limit, new flows share one series
      // (created past the limit itself: looking it up again would recurse)
      if (m.size >= this.config.maxFlows * MAX_FLOW_STATS_FACTOR) flowId = OTHER_FLOWS;
      s = m.get(flowId);
      if (s === undefined) {
        s = new FlowStats(flowId, band);
        m.set(flowId, s);
      }
    }
    return s;
  }

  #slotFor(flowId: string, band: number): Slot {
    const map = this.#bySlotKey[band]!;
    const s = map.get(flowId);
    if (s !== undefined) return s;
    let index = this.#free.pop();
    if (index === undefined) {
      // recycle an idle dynamic slot
      for (const cand of this.#slots) {
        if (cand.dynamic && cand.flowId !== '' && cand.live === 0) {
          // only tombstones can be left in an idle slot's ring: drop them
          while (this.#queues.dequeueBatch(cand.index, this.#buf, 1) === 1);
          this.#bySlotKey[cand.band]!.delete(cand.flowId);
          index = cand.index;
          break;
        }
      }
    }
    if (index === undefined) return this.#overflow[band]!;
    const slot = this.#slots[index]!;
    slot.flowId = flowId;
    slot.band = band;
    slot.minShare = this.#minShare.get(flowId) ?? 0;
    slot.pass = 0;
    slot.stats = this.#statsFor(flowId, band);
    map.set(flowId, slot);
    return slot;
  }

  #addQueued(slot: Slot, bytes: number): void {
    slot.live++;
    slot.bytes += bytes;
    slot.stats.queued++;
    slot.stats.queuedBytes += bytes;
    const bs = this.bandStats[slot.band]!;
    bs.queued++;
    bs.queuedBytes += bytes;
    this.#queued++;
    this.#queuedBytes += bytes;
    if (!slot.active) {
      const band = this.#bands[slot.band]!;
      slot.active = true;
      // a flow returning from idle gets no credit for the time it was away
      if (slot.pass < band.vtime) slot.pass = band.vtime;
      band.active.push(slot);
      band.weightsDirty = true;
    }
  }

  #removeQueued(w: Waiting): void {
    const slot = w.slot;
    slot.live--;
    slot.bytes -= w.bytes;
    slot.stats.queued--;
    slot.stats.queuedBytes -= w.bytes;
    const bs = this.bandStats[slot.band]!;
    bs.queued--;
    bs.queuedBytes -= w.bytes;
    this.#queued--;
    this.#queuedBytes -= w.bytes;
    if (slot.live === 0) this.#deactivate(slot);
  }

  #deactivate(slot: Slot): void {
    const band = this.#bands[slot.band]!;
    slot.active = false;
    const i = band.active.indexOf(slot);
    if (i >= 0) {
      band.active[i] = band.active[band.active.length - 1]!;
      band.active.pop();
    }
    band.weightsDirty = true;
  }

  /** Rejects a request that waited past the TTL (already out of the queue and the counters). */
  #expire(w: Waiting): void {
    if (w.signal !== null) w.signal.onabort = null;
    this.bandStats[w.slot.band]!.rejected[REJECT_REASONS.indexOf('rejected-ttl-expired')]!++;
    w.resolve(this.#refused['rejected-ttl-expired']);
  }

  #cancel(w: Waiting): void {
    if (this.#waiting.get(w.id) !== w) return;
    this.#waiting.delete(w.id); // the native record becomes a tombstone
    this.#removeQueued(w);
    w.resolve(this.#refused.cancelled);
  }

  /** True when a request of `band` or a higher band is waiting (then a new one may not overtake it). */
  #waitingAtOrAbove(band: number): boolean {
    if (this.#queued === 0) return false;
    for (let b = 0; b <= band; b++) if (this.bandStats[b]!.queued > 0) return true;
    return false;
  }

  /** Index of the highest band with waiting requests, or -1. */
  #topBand(): number {
    for (let b = 0; b < this.#bands.length; b++) if (this.#bands[b]!.active.length > 0) return b;
    return -1;
  }

  /** Picks the next waiting request of a band: the flow with the smallest pass. */
  #nextIn(b: number): Waiting | undefined {
    const band = this.#bands[b]!;
    while (band.active.length > 0) {
      if (band.weightsDirty) this.#reweigh(band);
      let best = band.active[0]!;
      for (let i = 1; i < band.active.length; i++) {
        const s = band.active[i]!;
        if (s.pass < best.pass || (s.pass === best.pass && s.index < best.index)) best = s;
      }
      const w = this.#popLive(best);
      if (w === undefined) continue; // the slot was inconsistent and got deactivated
      band.vtime = best.pass;
      best.pass += 1 / best.weight;
      return w;
    }
    return undefined;
  }

  /** Pops records from a slot until a live one (skipping tombstones). */
  #popLive(slot: Slot): Waiting | undefined {
    const buf = this.#buf;
    while (this.#queues.dequeueBatch(slot.index, buf, 1) === 1) {
      const w = this.#waiting.get(flowRecordId(buf, 0));
      if (w !== undefined) {
        this.#waiting.delete(w.id);
        this.#removeQueued(w);
        return w;
      }
    }
    // live > 0 but the ring is empty: cannot happen while this controller is
    // the only producer; repair the counters rather than spin.
    if (slot.active) this.#deactivate(slot);
    return undefined;
  }

  /** Weights from minShare by water-filling: a flow gets max(its minShare, an equal split of what is left). */
  #reweigh(band: Band): void {
    band.weightsDirty = false;
    const act = [...band.active].sort((a, b) => b.minShare - a.minShare);
    let rest = 1;
    let n = act.length;
    let i = 0;
    for (; i < act.length; i++) {
      const s = act[i]!;
      if (s.minShare > rest / n) {
        s.weight = s.minShare;
        rest -= s.minShare;
        n--;
      } else break;
    }
    const share = n > 0 ? Math.max(rest / n, 1e-3) : 1e-3;
    for (; i < act.length; i++) act[i]!.weight = share;
  }

  #grant(w: Waiting): void {
    if (w.signal !== null) w.signal.onabort = null;
    this.#grantStats(w.slot, (this.#now() - w.enqueuedAt) / 1000);
    this.#inFlight++;
    w.resolve(this.#granted[w.slot.band]!);
  }

  #grantStats(slot: Slot, waitSeconds: number): void {
    slot.stats.dispatched++;
    const bs = this.bandStats[slot.band]!;
    bs.dispatched++;
    bs.observeWait(waitSeconds);
  }

  /** Drops tombstones from a full ring by re-queueing its live records in order. */
  #compact(slot: Slot): boolean {
    const n = this.#queues.size(slot.index);
    if (n <= slot.live) return false;
    if (this.#compactBuf.length < n * FLOW_RECORD_WORDS) this.#compactBuf = new Uint32Array(n * FLOW_RECORD_WORDS);
    const buf = this.#compactBuf;
    const got = this.#queues.dequeueBatch(slot.index, buf, n);
    let keep = 0;
    for (let i = 0; i < got; i++) {
      if (this.#waiting.has(flowRecordId(buf, i))) {
        if (keep !== i) buf.copyWithin(keep * FLOW_RECORD_WORDS, i * FLOW_RECORD_WORDS, (i + 1) * FLOW_RECORD_WORDS);
        keep++;
      }
    }
    this.#queues.enqueueBatch(slot.index, buf, keep);
    return keep < got;
  }
}
