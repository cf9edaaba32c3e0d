// The flow-control admission gate for one pool of endpoints.
//
// admit() either lets a request through at once (nothing queued and the pool
// has capacity), rejects it (probabilistic shedding above maxUtilisation,
// queue limits, no endpoints), or queues it in the native per-(flow, band)
// FIFO and returns a promise that settles when the dispatch loop grants it,
// the TTL expires, or the client leaves. The dispatch loop runs on
// release() / onCapacity() / the sweep timer: strict band priority; inside a
// band, continuations of active conversations ahead of cold requests (turn
// priority, with aging), and virtual-time fair queueing across flows with
// weights from minShare, each dispatch charged its cost (estimated tokens, or
// 1 per request) and corrected with the real usage at release. Sparse flows
// first: a flow that becomes active without being ahead of the band's virtual
// time (it has not used more than its share) is served ahead of the backlogged
// flows for one quantum of cost (fairness.newFlowQuantum × the band's mean
// request cost), still charged for it, so a light tenant's burst does not wait
// behind a flood and no flow gets more than its share over time. A flow whose
// queue holds more than its credit covers is backlogged, not sparse: it loses
// the credit (a flood's first requests do not make it a new flow).
//
// Shedding knows flows: when a band must shed (probabilistic admission says
// so, or a queue limit is reached), the victim is the flow of that band
// furthest over its fair share of the band's requests (queued + in flight,
// relative to its weight); its oldest queued request is shed to make room.
// A flow at or under its share is not shed while an over-share flow exists.
//
// Payloads stay in JS (a Map from record id to the waiting entry); the native
// queue holds [id, bytes, time] records. A client that disconnects leaves a
// tombstone: its id is dropped from the map and the record is skipped when it
// reaches the head.
import type { AbortLike } from '../admission.js';
import { FlowQueues, FLOW_RECORD_WORDS, flowRecordId } from '../../bindings/flow-queues.js';
import { BandOverload, excessProbability, MIN_DRAIN_EVENTS, ProbabilisticAdmission, WindowedRate, type Rng } from './admission.js';
import type { FlowControlConfig } from './config.js';
import { BandStats, FlowStats, REJECT_REASONS, type RejectReason } from './metrics.js';
import { estimateCost, learnOutput, outputEstimate, realCost } from './cost.js';
import { LabelCap } from '../metrics/label-cap.js';
import { IdTable } from '../id-table.js';
import { FLOW_TUPLE, type FleetView } from './fleet-flows.js';

export type { RejectReason } from './metrics.js';

/** The request facts flow control needs. */
export interface FlowRequest {
  /** Fairness id (see Classifier.flowId). */
  flowId: string;
  /** Band index, 0 = highest (see Classifier.band). */
  band: number;
  /** Request body bytes (for maxBytes limits and metrics). */
  bytes: number;
  /** Estimated prompt tokens (bands with `fairness: tokens`; see cost.ts). Absent: the request costs 1. */
  promptTokens?: number;
  /** The request's max_tokens, -1 or absent when it has none. */
  maxTokens?: number;
  /** Continues an active conversation: dispatched ahead of cold requests of its band (turn priority). */
  continuation?: boolean;
}

/** What release() learns about a request that ended (bands with `fairness: tokens`). */
export interface FlowUsage {
  /** As passed to admit(). */
  promptTokens: number;
  /** As passed to admit(). */
  maxTokens: number;
  /** Fraction of the prompt the engine computed (1 - the pick's prefix match), 1 when unknown. */
  uncached: number;
  /** Output tokens of the answer, -1 when unknown. */
  outputTokens: number;
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
  /**
   * The utilisation probabilistic admission sheds by, read right after
   * `utilisation()` (the same pool, without the terms that are a reason to
   * hold a request but not to refuse it: the prefill backlog). Absent: the
   * `utilisation()` value.
   */
  shedUtilisation?: () => number;
  /**
   * Free batch slots in the pool as of the last `utilisation()` call (the
   * same endpoints: each one's batch limit less what it runs or queues).
   * With it, a lower band's request also leaves free the slots the bands
   * above it used within `admission.reserveWindow` and have let go since
   * (their recent peak in flight less their in flight now). Absent: no reserve.
   */
  free?: () => number;
  /** Optional hard cap on requests granted and not yet released. */
  maxInFlight?: number;
  /** The bound on distinct flow label values (shared by the controllers of one gate); default: its own, of 1,000. */
  labels?: LabelCap;
  /** Clock in ms (default performance.now). */
  now?: () => number;
  /** Random source for probabilistic admission (default Math.random). */
  rng?: Rng;
  /** Run the TTL sweep on a timer (default true; tests with a virtual clock call sweep() themselves). */
  sweepTimer?: boolean;
  /** Label for metrics (e.g. the model name). */
  pool?: string;
}

/**
 * One flow in one band: its native queues (`index` for cold requests,
 * `index + warmOffset` for continuations) and its counters.
 */
class Slot {
  /** Requests queued (cold and continuations). */
  live = 0;
  /** Continuation requests queued. */
  warm = 0;
  bytes = 0;
  /** Requests granted and not yet released. */
  inFlight = 0;
  /** Virtual time: the service this flow received, over its weight. */
  pass = 0;
  /** Cost this flow may still be served ahead of the band's backlogged flows (sparse flows first). */
  credit = 0;
  /** Estimated cost of the requests queued. */
  queuedCost = 0;
  weight = 1;
  /** Weight in the last shedding decision. */
  shedWeight = 0;
  /** In its band's `active` list (live > 0). */
  active = false;
  /** Index in its band's `present` list (live + inFlight > 0), -1 when absent. */
  presentAt = -1;
  /** Learnt output tokens per request (-1: nothing learnt yet). */
  learnt = -1;
  /** Active-active: over its fleet share in the last share check (read only while its band's fleetFilter is on). */
  fleetOver = false;
  /** Requests dispatched lately: a count decaying with SERVICE_TAU_MS, as of `servedAt` (the fleet share check's tie-breaker). */
  served = 0;
  servedAt = 0;
  stats: FlowStats;
  /** Granted results: ticket = 2 × index (let through at once) or 2 × index + 1 (dispatched from the queue, charged). */
  readonly grantNow: Granted;
  readonly grantQueued: Granted;
  constructor(
    readonly index: number,
    public flowId: string,
    public band: number,
    public minShare: number,
    readonly dynamic: boolean,
  ) {
    this.stats = new FlowStats(flowId, band);
    this.grantNow = Object.freeze({ ok: true as const, ticket: 2 * index });
    this.grantQueued = Object.freeze({ ok: true as const, ticket: 2 * index + 1 });
  }
}

interface Waiting {
  readonly id: number;
  readonly slot: Slot;
  readonly bytes: number;
  /** Charged to the flow's virtual time when dispatched. */
  readonly cost: number;
  readonly warm: boolean;
  readonly enqueuedAt: number;
  readonly resolve: (r: AdmitResult) => void;
  readonly signal: AbortHook | null;
}

/** A growable FIFO of record ids (no allocation once grown): a band's cold requests in arrival order, for aging. */
class IdFifo {
  #buf = new Float64Array(64);
  #head = 0;
  size = 0;
  push(id: number): void {
    if (this.size === this.#buf.length) {
      const next = new Float64Array(this.#buf.length * 2);
      for (let i = 0; i < this.size; i++) next[i] = this.#buf[(this.#head + i) & (this.#buf.length - 1)]!;
      this.#buf = next;
      this.#head = 0;
    }
    this.#buf[(this.#head + this.size) & (this.#buf.length - 1)] = id;
    this.size++;
  }
  peek(): number {
    return this.#buf[this.#head]!;
  }
  shift(): void {
    this.#head = (this.#head + 1) & (this.#buf.length - 1);
    this.size--;
  }
  clear(): void {
    this.#head = 0;
    this.size = 0;
  }
}

/** Per-band scheduling state. */
class Band {
  /** Flows with queued requests. */
  readonly active: Slot[] = [];
  /** Flows with queued or in-flight requests (the flows shedding compares). */
  readonly present: Slot[] = [];
  vtime = 0;
  weightsDirty = true;
  /** Continuation requests queued in the band. */
  warm = 0;
  /** Mean estimated cost of the band's dispatches (moving average; 0 before the first): the unit of newFlowQuantum. */
  meanCost = 0;
  /** Cold requests in arrival order (with turn priority on), for aging; ids no longer waiting are skipped. */
  readonly cold = new IdFifo();
  /** Active-active: the next dispatch skips flows over their fleet share (set by the share check before each dispatch). */
  fleetFilter = false;
  constructor(readonly tokens: boolean) {}
}

/** Weight of the newest dispatch in a band's mean request cost. */
const MEAN_COST_RATE = 1 / 16;

/** How fast a flow's count of recent dispatches decays (ms for a factor e): the fleet share check's memory. */
const SERVICE_TAU_MS = 1000;

/** Another replica's request of the same flow goes first when it is older than ours by more than this (reports are a few ms late). */
const OLDER_BY_MS = 5;

/** #fleetShares' answers. */
const SHARE_FREE = 0;
const SHARE_FILTER = 1;
const SHARE_HOLD = 2;

/**
 * Weights by water-filling, into `out`: each of the `n` flows gets
 * max(its minShare, an equal split of what the larger minShares leave).
 */
function waterFill(mins: Float64Array, n: number, out: Float64Array): void {
  out.fill(0, 0, n);
  let rest = 1;
  let left = n;
  for (;;) {
    const equal = left > 0 ? rest / left : 0;
    let pick = -1;
    for (let i = 0; i < n; i++) if (out[i] === 0 && mins[i]! > equal && (pick < 0 || mins[i]! > mins[pick]!)) pick = i;
    if (pick < 0) break;
    out[pick] = mins[pick]!;
    rest -= mins[pick]!;
    left--;
  }
  const share = left > 0 ? Math.max(rest / left, 1e-3) : 1e-3;
  for (let i = 0; i < n; i++) if (out[i] === 0) out[i] = share;
}

export class FlowController {
  readonly config: FlowControlConfig;
  readonly pool: string;
  readonly bandStats: BandStats[];
  readonly #utilisation: () => number;
  readonly #customSaturated: (() => boolean) | null;
  readonly #step: (() => number) | null;
  readonly #shedUtilisation: (() => number) | null;
  readonly #freeSlots: (() => number) | null;
  /** admission.reserveWindow in ms (0: no reserve). */
  readonly #reserveMs: number;
  /** Per band: requests granted and not released; the most of them within the reserve window, and when it was last reached. */
  readonly #busy: Int32Array;
  readonly #peak: Int32Array;
  readonly #peakAt: Float64Array;
  readonly #maxInFlight: number;
  /** Utilisation below which bands other than the top one may be dispatched. */
  readonly #ceiling: number;
  readonly #now: () => number;
  readonly #admission: ProbabilisticAdmission | null;
  /** admission.mode probabilistic: hold what can drain within the TTL, shed sustained overload (admission.ts). */
  readonly #drainRule: boolean;
  readonly #rng: Rng;
  readonly #targetMs: number;
  readonly #intervalMs: number;
  /** The largest derived Retry-After, seconds (the TTL's, at most an hour). */
  readonly #maxRetry: number;
  /** Completions per second of busy time (something queued). */
  readonly #drain = new WindowedRate();
  /** Since when the queues are non-empty (-1: empty), and busy ms not yet fed to the meter. */
  #busySince = -1;
  #busyMs = 0;
  /** Completions while busy since the last tick. */
  #completedBusy = 0;
  /** Busy ms since the last tick that saw a completion (a pool that completes nothing for a TTL drains at 0). */
  #stalledMs = 0;
  #lastTick = 0;
  /** Per band: arrival and dispatch rates (wall time), the counters at the last tick, D_b (NaN: unknown), the oldest queued enqueue time, the overload state. */
  readonly #arrivals: WindowedRate[];
  readonly #dispatches: WindowedRate[];
  readonly #lastArrived: Float64Array;
  readonly #lastDispatched: Float64Array;
  readonly #bandDrain: Float64Array;
  readonly #oldestAt: Float64Array;
  readonly #overload: BandOverload[];
  /** Refusals with a derived Retry-After, by reason index × (maxRetry + 1) + seconds (made on first use). */
  readonly #refusedAt: (Refused | undefined)[] = [];
  readonly #fairShedding: boolean;
  readonly #turnPriority: boolean;
  readonly #maxColdWaitMs: number;
  readonly #defaultOutput: number;
  readonly #newFlowQuantum: number;
  readonly #queues: FlowQueues;
  /** Native queue index of a slot's continuation queue: slot.index + warmOffset. */
  readonly #warmOffset: number;
  readonly #slots: Slot[] = [];
  readonly #bySlotKey: Map<string, Slot>[];
  readonly #overflow: Slot[];
  readonly #free: number[] = [];
  readonly #bands: Band[];
  readonly #minShare = new Map<string, number>();
  /** Queued requests by record id (not a Map: src/id-table.ts says why). */
  readonly #waiting = new IdTable<Waiting>(256);
  readonly #flowStats: Map<string, FlowStats>[];
  readonly #labels: LabelCap;
  readonly #disabledGrant: Granted = Object.freeze({ ok: true as const, ticket: -1 });
  readonly #refused: Record<RejectReason | 'cancelled', Refused>;
  readonly #buf = new Uint32Array(FLOW_RECORD_WORDS);
  #compactBuf = new Uint32Array(0);
  #nextId = 1;
  #queued = 0;
  #queuedBytes = 0;
  #inFlight = 0;
  #pumpScheduled = false;
  #timer: ReturnType<typeof setInterval> | null = null;
  /** Active-active: the other replicas' flows of this pool (src/flow/fleet-flows.ts); null: this replica orders its requests alone. */
  #fleet: FleetView | null = null;
  /** Since when capacity is held for another replica's requests (-1: not holding), and the timer that ends the hold. */
  #holdSince = -1;
  /** Active-active: the highest band (lowest index) this queue episode announced to the other replicas (#queuedNudge); Infinity: none. */
  #nudgedBand = Infinity;
  #holdTimer: ReturnType<typeof setTimeout> | null = null;
  /** Re-runs the dispatch loop when the reserve that held a lower band lapses (with the sweep timer on). */
  #reserveTimer: ReturnType<typeof setTimeout> | null = null;
  /** When the reserve the last #reserve() call found lapses (the earliest contributing peak's end), ms. */
  #reserveUntil = 0;
  /** The fleet view's version when a hold last ran out: no hold again until a peer shows progress (FleetView.version). */
  #holdVoid = -1;
  /** Scratch of the fleet share check: per backlogged flow its minShare, fleet in-flight count, weight, and local slot (null: another replica's). */
  #fsMin = new Float64Array(16);
  #fsLoad = new Float64Array(16);
  #fsWeight = new Float64Array(16);
  #fsServed = new Float64Array(16);
  #fsSlot: (Slot | null)[] = [];
  #closed = false;
  readonly #pumpFn = (): void => this.pump();

  constructor(opts: FlowControllerOptions) {
    const cfg = opts.config;
    this.config = cfg;
    this.pool = opts.pool ?? 'default';
    this.#utilisation = opts.utilisation;
    this.#customSaturated = opts.isSaturated ?? null;
    this.#step = opts.step ?? null;
    this.#shedUtilisation = opts.shedUtilisation ?? null;
    this.#freeSlots = opts.free ?? null;
    this.#reserveMs = cfg.admission.reserveWindowMs;
    this.#busy = new Int32Array(cfg.bands.length);
    this.#peak = new Int32Array(cfg.bands.length);
    this.#peakAt = new Float64Array(cfg.bands.length);
    this.#maxInFlight = opts.maxInFlight ?? Infinity;
    this.#ceiling = cfg.admission.maxUtilisation;
    this.#now = opts.now ?? (() => performance.now());
    this.#admission =
      cfg.admission.mode === 'utilisation' ? new ProbabilisticAdmission(cfg.admission.maxUtilisation, opts.rng) : null;
    this.#drainRule = cfg.admission.mode === 'probabilistic';
    this.#rng = opts.rng ?? Math.random;
    this.#targetMs = cfg.admission.targetMs;
    this.#intervalMs = cfg.admission.intervalMs;
    this.#maxRetry = Math.min(3600, Math.max(1, Math.ceil(cfg.ttlMs / 1000)));
    this.#lastTick = this.#now();
    this.#fairShedding = cfg.admission.shedding !== 'arrival';
    this.#turnPriority = cfg.turnPriority.enabled;
    this.#maxColdWaitMs = cfg.turnPriority.maxColdWaitMs;
    this.#defaultOutput = cfg.fairness.defaultOutputTokens;
    this.#newFlowQuantum = cfg.fairness.newFlowQuantum;
    const nb = cfg.bands.length;
    this.bandStats = cfg.bands.map(() => new BandStats());
    this.#arrivals = cfg.bands.map(() => new WindowedRate());
    this.#dispatches = cfg.bands.map(() => new WindowedRate());
    this.#lastArrived = new Float64Array(nb);
    this.#lastDispatched = new Float64Array(nb);
    this.#bandDrain = new Float64Array(nb).fill(NaN);
    this.#oldestAt = new Float64Array(nb).fill(Infinity);
    this.#overload = cfg.bands.map(() => new BandOverload());
    this.#bands = cfg.bands.map((b) => new Band((cfg.fairness.bands[b] ?? cfg.fairness.mode) === 'tokens'));
    this.#bySlotKey = cfg.bands.map(() => new Map());
    this.#flowStats = cfg.bands.map(() => new Map());
    this.#labels = opts.labels ?? new LabelCap();
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
    // with turn priority each slot has a second native queue, for continuations
    this.#warmOffset = total;
    this.#queues = FlowQueues.create({ flows: this.#turnPriority ? 2 * total : total, capacity: cfg.queueCapacity });
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

  /** True when `band` counts estimated tokens (fairness: tokens), false when it counts requests. */
  countsTokens(band: number): boolean {
    return this.#bands[band]?.tokens === true;
  }

  /** One flow's scheduling state in a band (for tests and debugging; allocates), or undefined when it has no queue slot. */
  flowState(
    flowId: string,
    band: number,
  ): { queued: number; continuations: number; inFlight: number; pass: number; credit: number; learntOutput: number } | undefined {
    const s = this.#bySlotKey[band]?.get(flowId);
    if (s === undefined) return undefined;
    return { queued: s.live, continuations: s.warm, inFlight: s.inFlight, pass: s.pass, credit: s.credit, learntOutput: s.learnt };
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
      return this.#disabledGrant;
    }
    if (this.#closed) return this.#reject(band, 'rejected-no-endpoints');
    this.bandStats[band]!.arrived++;
    const u = this.#utilisation();
    if (u === Infinity) return this.#reject(band, 'rejected-no-endpoints');
    if (signal !== null && signal.aborted) return this.#refused.cancelled;
    const slot = this.#slotFor(req.flowId, band);
    if (this.#admission !== null && !this.#admission.admit(band, this.#shedUtilisation !== null ? this.#shedUtilisation() : u)) {
      // the band must shed: the flow furthest over its fair share gives up a queued request, or this one is shed
      const victim = this.#fairShedding ? this.#victim(slot) : slot;
      if (victim === slot) return this.#shedArrival(slot, 'rejected-saturated');
      if (victim !== null) this.#shedQueued(victim, 'rejected-saturated');
    }
    // NaN, negative or fractional sizes count as their integer part, at least 0
    const bytes = req.bytes >= 0 ? Math.min(Math.floor(req.bytes), 0xffffffff) : 0;

    if (
      !this.#waitingAtOrAbove(band) &&
      this.#inFlight < this.#maxInFlight &&
      this.#canDispatch(band, u) &&
      // another replica holds requests of this band or a higher one: this one queues, and the dispatch loop weighs the fleet's shares
      (this.#fleet === null || this.#fleet.queuedAtOrAbove(band) === 0)
    ) {
      this.#grantStats(slot, 0);
      this.#inFlight++;
      slot.inFlight++;
      this.#busyUp(band);
      if (slot.presentAt < 0) this.#addPresent(slot);
      if (this.#fleet !== null) this.#serve(slot);
      return slot.grantNow;
    }

    if (this.#drainRule && band > 0) {
      // sustained overload: the band sheds arrivals with its probability (set by the sweep tick)
      const p = this.#overload[band]!.p;
      let shed = p > 0 && (p >= 1 || this.#rng() < p);
      // can the request be served within its TTL at the rate the pool drains this band? (Little's law)
      if (!shed) {
        const d = this.#bandDrain[band]!;
        shed = d === d && this.#ahead(band) + 1 > (d * this.config.ttlMs) / 1000;
      }
      if (shed) {
        const victim = this.#fairShedding ? this.#victim(slot) : slot;
        if (victim === slot) return this.#shedArrival(slot, 'rejected-saturated');
        if (victim !== null) this.#shedQueued(victim, 'rejected-saturated');
      }
    }

    // queue limits: make room by shedding the oldest queued request of the flow furthest over its share
    while (this.#overLimit(band, bytes)) {
      const victim = this.#fairShedding ? this.#victim(slot) : slot;
      if (victim === null || victim === slot) return this.#shedArrival(slot, 'rejected-capacity');
      this.#shedQueued(victim, 'rejected-capacity');
    }
    const warm = this.#turnPriority && req.continuation === true;
    const ring = warm ? slot.index + this.#warmOffset : slot.index;
    const now = this.#now();
    const id = this.#nextId++;
    if (!this.#queues.enqueue(ring, id, bytes, now >>> 0) && !(this.#compact(slot, warm) && this.#queues.enqueue(ring, id, bytes, now >>> 0))) {
      return this.#shedArrival(slot, 'rejected-capacity');
    }
    const b = this.#bands[band]!;
    const cost = b.tokens && req.promptTokens !== undefined ? estimateCost(req.promptTokens, req.maxTokens ?? -1, slot.learnt, this.#defaultOutput) : 1;
    if (this.#turnPriority && !warm) b.cold.push(id);
    return new Promise<AdmitResult>((resolve) => {
      const w: Waiting = { id, slot, bytes, cost, warm, enqueuedAt: now, resolve, signal };
      this.#waiting.set(w);
      this.#addQueued(w);
      if (signal !== null) signal.onabort = () => this.#cancel(w);
      this.#schedulePump();
    });
  }

  /**
   * Call once for every granted request when it ends. With `usage` (bands
   * with `fairness: tokens`), the flow is charged the request's real cost in
   * place of the estimate it was charged at dispatch, and its output estimate
   * learns from the answer.
   */
  release(ticket: number, usage: FlowUsage | null = null): void {
    if (this.#inFlight > 0) this.#inFlight--;
    // a completion while requests wait: the pool's capacity at work (its drain rate)
    if (this.#queued > 0) this.#completedBusy++;
    const slot = ticket >= 0 ? this.#slots[ticket >> 1] : undefined;
    if (slot !== undefined && slot.inFlight > 0) {
      slot.inFlight--;
      if (this.#busy[slot.band]! > 0) this.#busy[slot.band]!--;
      if (slot.live + slot.inFlight === 0) this.#removePresent(slot);
      if (usage !== null && this.#bands[slot.band]!.tokens) this.#settle(slot, (ticket & 1) === 1, usage);
    }
    if (this.#queued > 0) this.#schedulePump();
  }

  /** The band index of a granted request's ticket (-1: none, e.g. flow control disabled). */
  bandOf(ticket: number): number {
    const slot = ticket >= 0 ? this.#slots[ticket >> 1] : undefined;
    return slot === undefined ? -1 : slot.band;
  }

  /** Call when capacity may have appeared (fresh metrics, an endpoint came back). */
  onCapacity(): void {
    if (this.#queued > 0) this.#schedulePump();
  }

  /** Rejects queued requests older than the TTL, drops tombstones at queue heads, and pumps. */
  sweep(now: number = this.#now()): number {
    let expired = 0;
    this.#oldestAt.fill(Infinity);
    if (this.#queued > 0) {
      for (const band of this.#bands) {
        for (let i = 0; i < band.active.length; i++) {
          const slot = band.active[i]!;
          // heads are the oldest records of their queue
          expired += this.#sweepRing(slot, false, now);
          if (slot.active && this.#turnPriority) expired += this.#sweepRing(slot, true, now);
          // it left band.active (swapped with the last entry): revisit index i
          if (!slot.active) i--;
        }
      }
    }
    if (this.#drainRule) this.#tick(now);
    if (this.#queued > 0) this.#schedulePump();
    return expired;
  }

  /** The band's drain rate D_b in requests/s as of the last sweep tick (NaN: not measured yet). */
  drainRate(band: number): number {
    return this.#bandDrain[band] ?? NaN;
  }

  /** The band's shed probability for sustained overload as of the last sweep tick. */
  shedProbability(band: number): number {
    return this.#overload[band]?.p ?? 0;
  }

  /** Stops the sweep timer and rejects everything still queued (503). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
    if (this.#holdTimer !== null) clearTimeout(this.#holdTimer);
    this.#holdTimer = null;
    if (this.#reserveTimer !== null) clearTimeout(this.#reserveTimer);
    this.#reserveTimer = null;
    for (const w of this.#waiting.values()) {
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
      if (band < 0 || !this.#canDispatch(band, this.#utilisation())) {
        this.#holdSince = -1; // no capacity: nothing is held (another replica took it)
        break;
      }
      if (this.#fleet !== null && this.#fleetHolds(band)) return;
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
    this.#holdSince = -1; // left without a hold (nothing queued, or the in-flight cap): none carries over
    if (this.#queued > 0) this.#queuedNudge();
  }

  /**
   * Requests stay queued here after a dispatch loop (no capacity): the other
   * replicas' shares should count them now, not at the next heartbeat. Once
   * a queue episode (until the queue is empty again), and again when a higher
   * band than the one announced starts to wait (the others hold their lower
   * bands for it): a request queued and dispatched in the same loop, as every
   * arrival is while another replica queues, sends nothing.
   */
  #queuedNudge(): void {
    if (this.#fleet === null) return;
    const top = this.#topBand();
    if (top < 0 || top >= this.#nudgedBand) return;
    this.#nudgedBand = top;
    this.#fleet.nudge();
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
    if (!(this.#step !== null ? u + this.#step() <= this.#ceiling : u < this.#ceiling)) return false;
    if (this.#freeSlots === null || this.#reserveMs === 0) return true;
    const r = this.#reserve(band);
    if (r === 0 || this.#freeSlots() - 1 >= r) return true;
    this.#armReserveTimer();
    return false;
  }

  /**
   * The reserve held a lower band's request: once it lapses the request may
   * go, and nothing else may happen before then on an idle pool (no release,
   * no arrival), so the dispatch loop runs again at that time rather than at
   * the next sweep. One timer at a time; off with the sweep timer (tests
   * drive the clock and the loop themselves).
   */
  #armReserveTimer(): void {
    if (this.#reserveTimer !== null || this.#timer === null || this.#closed) return;
    const wait = Math.max(1, Math.ceil(this.#reserveUntil - this.#now()) + 1);
    this.#reserveTimer = setTimeout(() => {
      this.#reserveTimer = null;
      if (this.#queued > 0) this.pump();
    }, wait);
    this.#reserveTimer.unref();
  }

  /** A request of `band` was granted: its band's in-flight count and recent peak. */
  #busyUp(band: number): void {
    if (this.#reserveMs === 0) return;
    const n = ++this.#busy[band]!;
    if (n >= this.#peak[band]!) {
      this.#peak[band] = n;
      this.#peakAt[band] = this.#now();
    }
  }

  /**
   * The slots the bands above `band` used within the reserve window and have
   * released since: what they are likely to ask for again before a lower
   * band's request would give its slot back. A band's peak is its largest
   * in-flight count, kept while it was reached within the window, then its
   * count now.
   */
  #reserve(band: number): number {
    let r = 0;
    let now = -1;
    let until = Infinity;
    for (let b = 0; b < band; b++) {
      const busy = this.#busy[b]!;
      let peak = this.#peak[b]!;
      if (peak <= busy) continue;
      if (now < 0) now = this.#now();
      const end = this.#peakAt[b]! + this.#reserveMs;
      if (now > end) {
        this.#peak[b] = peak = busy;
        this.#peakAt[b] = now;
        continue;
      }
      r += peak - busy;
      if (end < until) until = end;
    }
    this.#reserveUntil = until;
    return r;
  }

  #overLimit(band: number, bytes: number): boolean {
    const cfg = this.config;
    const bl = cfg.limits.bands[cfg.bands[band]!];
    const bs = this.bandStats[band]!;
    return (
      this.#queued + 1 > cfg.limits.maxRequests ||
      this.#queuedBytes + bytes > cfg.limits.maxBytes ||
      (bl !== undefined && (bs.queued + 1 > bl.maxRequests || bs.queuedBytes + bytes > bl.maxBytes))
    );
  }

  /**
   * Whom to shed when a request of `arrival`'s flow arrives at a band that
   * must shed. Each flow of the band has a load (queued + in flight, plus one
   * for the arrival) and a fair share of the band's total load (its weight,
   * water-filled from minShare as the dispatch loop does). Returns the flow
   * furthest over its share (largest load / weight) among those with
   * something to shed (a queued request, or the arrival); null when an
   * over-share flow exists but has nothing queued and the arrival is at or
   * under its share (nobody is shed); the arrival when no flow is over its
   * share (as flow-blind shedding would).
   */
  #victim(arrival: Slot): Slot | null {
    const band = this.#bands[arrival.band]!;
    const present = band.present;
    const arrivalPresent = arrival.presentAt >= 0;
    let total = 1;
    for (let i = 0; i < present.length; i++) total += present[i]!.live + present[i]!.inFlight;
    this.#shedWeights(present, arrivalPresent ? null : arrival);
    let best: Slot | null = null;
    let bestNorm = -1;
    let anyOver = false;
    const n = present.length + (arrivalPresent ? 0 : 1);
    for (let i = 0; i < n; i++) {
      const s = i < present.length ? present[i]! : arrival;
      const load = s.live + s.inFlight + (s === arrival ? 1 : 0);
      if (load <= s.shedWeight * total * (1 + 1e-9)) continue;
      anyOver = true;
      if (s.live === 0 && s !== arrival) continue;
      const norm = load / s.shedWeight;
      if (norm > bestNorm || (norm === bestNorm && s === arrival)) {
        best = s;
        bestNorm = norm;
      }
    }
    if (best !== null) return best;
    return anyOver ? null : arrival;
  }

  /** Water-filled weights over `present` (and `extra`) into shedWeight: max(minShare, an equal split of what larger minShares leave). */
  #shedWeights(present: Slot[], extra: Slot | null): void {
    const n = present.length + (extra !== null ? 1 : 0);
    for (let i = 0; i < n; i++) (i < present.length ? present[i]! : extra!).shedWeight = 0;
    let rest = 1;
    let left = n;
    // fix the flows whose minShare beats an equal split, largest first, until none does
    for (;;) {
      const equal = left > 0 ? rest / left : 0;
      let pick: Slot | null = null;
      for (let i = 0; i < n; i++) {
        const s = i < present.length ? present[i]! : extra!;
        if (s.shedWeight === 0 && s.minShare > equal && (pick === null || s.minShare > pick.minShare)) pick = s;
      }
      if (pick === null) break;
      pick.shedWeight = pick.minShare;
      rest -= pick.minShare;
      left--;
    }
    const share = left > 0 ? Math.max(rest / left, 1e-3) : 1e-3;
    for (let i = 0; i < n; i++) {
      const s = i < present.length ? present[i]! : extra!;
      if (s.shedWeight === 0) s.shedWeight = share;
    }
  }

  /** Sheds the oldest queued request of `victim` (a cold one first). */
  #shedQueued(victim: Slot, reason: RejectReason): void {
    const w = (victim.live - victim.warm > 0 ? this.#popLive(victim, false) : undefined) ?? (victim.warm > 0 ? this.#popLive(victim, true) : undefined);
    if (w === undefined) return;
    if (w.signal !== null) w.signal.onabort = null;
    victim.stats.shed++;
    this.bandStats[victim.band]!.rejected[REJECT_REASONS.indexOf(reason)]!++;
    w.resolve(this.#refusal(victim.band, reason));
  }

  #shedArrival(slot: Slot, reason: RejectReason): Refused {
    slot.stats.shed++;
    return this.#reject(slot.band, reason);
  }

  /** Charges the difference between the real cost of an ended request and its estimate; learns the flow's output. */
  #settle(slot: Slot, charged: boolean, u: FlowUsage): void {
    const estOut = outputEstimate(u.maxTokens, slot.learnt, this.#defaultOutput);
    if (charged) {
      const est = estimateCost(u.promptTokens, u.maxTokens, slot.learnt, this.#defaultOutput);
      const real = realCost(u.promptTokens, u.uncached, u.outputTokens, estOut);
      slot.pass += (real - est) / slot.weight;
    }
    if (u.outputTokens >= 0) slot.learnt = learnOutput(slot.learnt, u.outputTokens);
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
    return this.#refusal(band, reason);
  }

  /**
   * The refusal for `reason` in `band`. With admission mode probabilistic and
   * the band's drain rate measured, its Retry-After is the time the backlog
   * ahead of a request of the band takes to drain, ceil(ahead / D_b) seconds
   * (1 at least, the TTL's at most; the TTL's when D_b is 0); otherwise the
   * configured retryAfterSeconds. One frozen value per (reason, seconds).
   */
  #refusal(band: number, reason: RejectReason): Refused {
    if (!this.#drainRule || reason === 'rejected-no-endpoints') return this.#refused[reason];
    const d = this.#bandDrain[band] ?? NaN;
    if (!(d === d)) return this.#refused[reason];
    const max = this.#maxRetry;
    let secs = d > 0 ? Math.ceil(this.#ahead(band) / d) : max;
    if (!(secs >= 1)) secs = 1;
    else if (secs > max) secs = max;
    const k = REJECT_REASONS.indexOf(reason) * (max + 1) + secs;
    let r = this.#refusedAt[k];
    if (r === undefined) {
      r = Object.freeze({ ...this.#refused[reason], retryAfterSeconds: secs });
      this.#refusedAt[k] = r;
    }
    return r;
  }

  /** Requests queued in `band` and every band above it (all served before a new request of `band`). */
  #ahead(band: number): number {
    let n = 0;
    for (let b = 0; b <= band; b++) n += this.bandStats[b]!.queued;
    return n;
  }

  /**
   * The admission tick (mode probabilistic, from sweep): feeds the meters
   * with what happened since the last tick, then sets each band's drain rate
   * D_b and, below the top band, its overload state and shed probability.
   */
  #tick(now: number): void {
    const dt = now - this.#lastTick;
    if (!(dt > 0)) return;
    this.#lastTick = now;
    let busy = this.#busyMs;
    if (this.#busySince >= 0) {
      busy += now - this.#busySince;
      this.#busySince = now;
    }
    this.#busyMs = 0;
    const done = this.#completedBusy;
    this.#completedBusy = 0;
    this.#drain.add(done, busy);
    this.#stalledMs = done > 0 ? 0 : this.#stalledMs + busy;
    // unknown (NaN) until a few completions were seen; 0 once a TTL of busy time passed without one
    let avail = this.#stalledMs >= this.config.ttlMs ? 0 : this.#drain.total >= MIN_DRAIN_EVENTS ? this.#drain.rate : NaN;
    const target = this.#targetMs;
    const interval = this.#intervalMs;
    for (let b = 0; b < this.bandStats.length; b++) {
      const bs = this.bandStats[b]!;
      this.#arrivals[b]!.add(bs.arrived - this.#lastArrived[b]!, dt);
      this.#lastArrived[b] = bs.arrived;
      this.#dispatches[b]!.add(bs.dispatched - this.#lastDispatched[b]!, dt);
      this.#lastDispatched[b] = bs.dispatched;
      this.#bandDrain[b] = avail;
      bs.drainRate = avail;
      if (b > 0) {
        const oldest = this.#oldestAt[b]!;
        const age = oldest < Infinity ? now - oldest : 0;
        const pStar = avail === avail ? excessProbability(avail, this.#arrivals[b]!.rate, bs.queued, target, interval) : 0;
        bs.shedProbability = this.#overload[b]!.observe(now, age, bs.queued === 0, pStar, target, interval);
      }
      // strict priority: what this band is served is not there for the bands below
      if (avail === avail) {
        avail -= this.#dispatches[b]!.rate;
        if (avail < 0) avail = 0;
      }
    }
  }

  #statsFor(flowId: string, band: number): FlowStats {
    const m = this.#flowStats[band]!;
    let s = m.get(flowId);
    if (s === undefined) {
      // bound label cardinality (metrics.maxLabelValues distinct flows over every
      // band and pool of the gate): beyond it, new flows share the (overflow) series
      flowId = this.#labels.value(flowId);
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
      // recycle an idle dynamic slot (nothing queued, nothing in flight: no ticket refers to it)
      for (const cand of this.#slots) {
        if (cand.dynamic && cand.flowId !== '' && cand.live === 0 && cand.inFlight === 0) {
          // only tombstones can be left in an idle slot's rings: drop them
          while (this.#queues.dequeueBatch(cand.index, this.#buf, 1) === 1);
          if (this.#turnPriority) while (this.#queues.dequeueBatch(cand.index + this.#warmOffset, this.#buf, 1) === 1);
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
    slot.credit = 0;
    slot.learnt = -1;
    slot.stats = this.#statsFor(flowId, band);
    map.set(flowId, slot);
    return slot;
  }

  #addPresent(slot: Slot): void {
    const p = this.#bands[slot.band]!.present;
    slot.presentAt = p.length;
    p.push(slot);
  }

  #removePresent(slot: Slot): void {
    const p = this.#bands[slot.band]!.present;
    const i = slot.presentAt;
    if (i < 0) return;
    const last = p.pop()!;
    if (last !== slot) {
      p[i] = last;
      last.presentAt = i;
    }
    slot.presentAt = -1;
  }

  #addQueued(w: Waiting): void {
    const slot = w.slot;
    const bytes = w.bytes;
    slot.live++;
    slot.bytes += bytes;
    slot.queuedCost += w.cost;
    slot.stats.queued++;
    slot.stats.queuedBytes += bytes;
    const bs = this.bandStats[slot.band]!;
    bs.queued++;
    bs.queuedBytes += bytes;
    if (this.#queued++ === 0 && this.#busySince < 0) this.#busySince = this.#now();
    this.#queuedBytes += bytes;
    const band = this.#bands[slot.band]!;
    if (w.warm) {
      slot.warm++;
      band.warm++;
    }
    if (slot.presentAt < 0) this.#addPresent(slot);
    if (!slot.active) {
      slot.active = true;
      // a flow not ahead of the band (it has not used more than its share) is
      // a new flow: one quantum of cost ahead of the backlogged flows; a flow
      // ahead of it keeps what is left of its last quantum (its burst reached
      // the queue in pieces, emptying it in between)
      if (slot.pass <= band.vtime && this.#newFlowQuantum > 0) {
        slot.credit = this.#newFlowQuantum * (band.meanCost > 0 ? band.meanCost : w.cost);
      }
      // and no credit in virtual time for the time it was away
      if (slot.pass < band.vtime) slot.pass = band.vtime;
      band.active.push(slot);
      band.weightsDirty = true;
    }
    // a queue longer than the credit is a backlog: the flow is not sparse
    if (slot.credit > 0 && slot.queuedCost > slot.credit) slot.credit = 0;
  }

  #removeQueued(w: Waiting): void {
    const slot = w.slot;
    slot.live--;
    slot.bytes -= w.bytes;
    slot.queuedCost = slot.live > 0 ? slot.queuedCost - w.cost : 0;
    slot.stats.queued--;
    slot.stats.queuedBytes -= w.bytes;
    const bs = this.bandStats[slot.band]!;
    bs.queued--;
    bs.queuedBytes -= w.bytes;
    if (--this.#queued === 0) {
      this.#nudgedBand = Infinity;
      // emptied by a cancel, an expiry or a shed while a hold ran: the next hold starts afresh
      this.#holdSince = -1;
      if (this.#busySince >= 0) {
        this.#busyMs += this.#now() - this.#busySince;
        this.#busySince = -1;
      }
    }
    this.#queuedBytes -= w.bytes;
    if (w.warm) {
      slot.warm--;
      this.#bands[slot.band]!.warm--;
    }
    if (slot.live === 0) {
      this.#deactivate(slot);
      if (slot.inFlight === 0) this.#removePresent(slot);
    }
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

  /** Expires the requests at the head of one of a slot's queues that waited past the TTL; drops tombstones there. */
  #sweepRing(slot: Slot, warm: boolean, now: number): number {
    const ring = warm ? slot.index + this.#warmOffset : slot.index;
    const buf = this.#buf;
    const ttl = this.config.ttlMs;
    let expired = 0;
    while (slot.active && this.#queues.peek(ring, buf)) {
      const w = this.#waiting.get(flowRecordId(buf, 0));
      if (w !== undefined && now - w.enqueuedAt < ttl) {
        if (w.enqueuedAt < this.#oldestAt[slot.band]!) this.#oldestAt[slot.band] = w.enqueuedAt;
        break;
      }
      this.#queues.dequeueBatch(ring, buf, 1);
      if (w !== undefined) {
        this.#waiting.delete(w.id);
        this.#removeQueued(w);
        this.#expire(w);
        expired++;
      }
    }
    return expired;
  }

  /** Rejects a request that waited past the TTL (already out of the queue and the counters). */
  #expire(w: Waiting): void {
    if (w.signal !== null) w.signal.onabort = null;
    this.bandStats[w.slot.band]!.rejected[REJECT_REASONS.indexOf('rejected-ttl-expired')]!++;
    w.resolve(this.#refusal(w.slot.band, 'rejected-ttl-expired'));
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

  /** The band's oldest cold request still waiting, or undefined. */
  #oldestCold(band: Band): Waiting | undefined {
    const fifo = band.cold;
    while (fifo.size > 0) {
      const w = this.#waiting.get(fifo.peek());
      if (w !== undefined) return w;
      fifo.shift();
    }
    return undefined;
  }

  /**
   * Picks the next waiting request of a band. Continuations first (turn
   * priority) unless the band's oldest cold request has been passed over for
   * maxColdWait, in which case that request's flow goes next; among the flows
   * of the chosen kind, new flows (credit left) ahead of backlogged ones, then
   * the one with the smallest virtual time (pass). The flow is charged the
   * request's cost over its weight (and a new flow's credit the cost).
   */
  #nextIn(b: number): Waiting | undefined {
    const band = this.#bands[b]!;
    while (band.active.length > 0) {
      if (band.weightsDirty) this.#reweigh(band);
      let warm = band.warm > 0;
      let best: Slot | null = null;
      if (warm && band.warm < this.bandStats[b]!.queued) {
        const old = this.#oldestCold(band);
        if (old !== undefined && this.#now() - old.enqueuedAt >= this.#maxColdWaitMs) {
          warm = false;
          best = old.slot;
        }
      }
      if (best === null) best = this.#pickFlow(band, warm);
      if (best === null && band.fleetFilter) {
        // the fleet share left no flow of this kind: the other kind, else no filter (it never stops a dispatch)
        best = this.#pickFlow(band, !warm);
        if (best !== null) warm = !warm;
        else {
          band.fleetFilter = false;
          best = this.#pickFlow(band, warm);
        }
      }
      if (best === null) {
        // the band's continuation count disagrees with its flows': cannot happen; repair rather than spin
        let sum = 0;
        for (let i = 0; i < band.active.length; i++) sum += band.active[i]!.warm;
        if (sum === band.warm) return undefined;
        band.warm = sum;
        continue;
      }
      const w = this.#popLive(best, warm);
      if (w === undefined) continue; // the slot was inconsistent and got repaired
      if (best.credit > 0) {
        // a new flow's dispatch may be out of virtual-time order: it moves the
        // band's virtual time only up to the backlogged flows' (with none, it
        // is in order and moves it as any dispatch does)
        best.credit -= w.cost;
        let v = best.pass;
        for (let i = 0; i < band.active.length; i++) {
          const s = band.active[i]!;
          if (s.credit <= 0 && s.pass < v) v = s.pass;
        }
        if (v > band.vtime) band.vtime = v;
      } else band.vtime = best.pass;
      best.pass += w.cost / best.weight;
      band.meanCost = band.meanCost > 0 ? band.meanCost + (w.cost - band.meanCost) * MEAN_COST_RATE : w.cost;
      return w;
    }
    return undefined;
  }

  /**
   * The flow of `band` with a queued request of the kind (continuation or
   * cold) that goes next: new flows (credit left) ahead of backlogged ones,
   * then the smallest virtual time; flows over their fleet share skipped while
   * the band's fleetFilter is on. Null when none.
   */
  #pickFlow(band: Band, warm: boolean): Slot | null {
    let best: Slot | null = null;
    const filter = band.fleetFilter;
    for (let i = 0; i < band.active.length; i++) {
      const s = band.active[i]!;
      if (warm ? s.warm === 0 : s.live === s.warm) continue;
      if (filter && s.fleetOver) continue;
      if (best === null) best = s;
      else if (s.credit > 0 !== best.credit > 0) {
        if (s.credit > 0) best = s;
      } else if (s.pass < best.pass || (s.pass === best.pass && s.index < best.index)) best = s;
    }
    return best;
  }

  // ---- active-active: the fleet's shares (src/flow/fleet-flows.ts) ----------

  /**
   * Another replica's view of this pool (FlowControlGate.attachFleet), or
   * null to order requests alone again.
   */
  attachFleet(view: FleetView | null): void {
    this.#fleet = view;
    this.#holdSince = -1;
    for (const b of this.#bands) b.fleetFilter = false;
    if (this.#queued > 0) this.#schedulePump();
  }

  /**
   * This replica's flows for the others' share checks: per (band, flow) with
   * something queued or in flight, `[pool, band name, flow, in flight,
   * queued]` appended to `out` (at most `max` tuples in all). Only while the
   * pool holds requests here or at another replica: shares matter only then.
   */
  fleetReport(out: unknown[], max: number, bandNames: readonly string[]): void {
    if (this.#queued === 0 && (this.#fleet === null || this.#fleet.queuedAtOrAbove(this.#bands.length - 1) === 0)) return;
    const now = this.#now();
    for (let b = 0; b < this.#bands.length; b++) {
      const present = this.#bands[b]!.present;
      for (let i = 0; i < present.length; i++) {
        if (out.length >= max * FLOW_TUPLE) return;
        const s = present[i]!;
        const oldest = s.live > 0 ? this.#oldestQueued(s) : now;
        out.push(this.pool, bandNames[b], s.flowId, s.inFlight, s.live, Math.round(100 * this.#servedNow(s, now)) / 100, Math.max(0, Math.round(now - oldest)));
      }
    }
  }

  /**
   * Before a dispatch of `b` (the pool has capacity): does this replica
   * leave it to another replica's requests? It holds while another replica
   * has requests queued in a higher band, or while every flow queued here is
   * over its fleet share of the band and another replica's flow is under its
   * own (#fleetShares; with some flow here under it, the band's fleetFilter
   * makes the dispatch loop take one of those). A hold lasts at most
   * `holdMs`: then one dispatch goes anyway, and no hold starts again until
   * a peer shows progress (FleetView.version: a silent or stuck peer costs one hold).
   */
  #fleetHolds(b: number): boolean {
    const band = this.#bands[b]!;
    band.fleetFilter = false;
    const fleet = this.#fleet!;
    if (fleet.version === this.#holdVoid) return false;
    let hold = b > 0 && fleet.queuedAtOrAbove(b - 1) > 0;
    if (!hold) {
      const r = this.#fleetShares(b);
      band.fleetFilter = r === SHARE_FILTER;
      hold = r === SHARE_HOLD;
    }
    if (!hold) {
      this.#holdSince = -1;
      return false;
    }
    const now = this.#now();
    const bs = this.bandStats[b]!;
    if (this.#holdSince < 0) {
      this.#holdSince = now;
      bs.fleetHolds++;
      // the capacity this replica leaves: the others see it at once, not at the next heartbeat
      fleet.nudge();
    }
    const left = fleet.holdMs - (now - this.#holdSince);
    if (left <= 0) {
      bs.fleetHoldsExpired++;
      this.#holdSince = -1;
      this.#holdVoid = fleet.version;
      band.fleetFilter = false;
      return false;
    }
    if (this.#holdTimer === null) {
      this.#holdTimer = setTimeout(() => {
        this.#holdTimer = null;
        if (this.#queued > 0) this.#schedulePump();
      }, Math.ceil(left));
      this.#holdTimer.unref();
    }
    return true;
  }

  /** One more request dispatched for `slot` (its decaying count of recent dispatches). */
  #serve(slot: Slot): void {
    const now = this.#now();
    slot.served = this.#servedNow(slot, now) + 1;
    slot.servedAt = now;
  }

  /** When the oldest request queued in `slot` was enqueued (either kind; now when none). */
  #oldestQueued(slot: Slot): number {
    const at = this.#headAt(slot.index, this.#now());
    return this.#turnPriority ? this.#headAt(slot.index + this.#warmOffset, at) : at;
  }

  /** The enqueue time of a ring's head request if it is older than `at` (a tombstone at the head counts as nothing until a dispatch drops it). */
  #headAt(ring: number, at: number): number {
    if (!this.#queues.peek(ring, this.#buf)) return at;
    const w = this.#waiting.get(flowRecordId(this.#buf, 0));
    return w !== undefined && w.enqueuedAt < at ? w.enqueuedAt : at;
  }

  #servedNow(slot: Slot, now: number): number {
    return slot.served === 0 ? 0 : slot.served * Math.exp(-(now - slot.servedAt) / SERVICE_TAU_MS);
  }

  /**
   * The fleet's next flow in band `b`: among the flows with requests queued
   * anywhere (here or at another replica), the one with the fewest requests in
   * flight fleet-wide for its weight (minShare water-filled, as the dispatch
   * loop weighs them); between flows level on that, the one dispatched least
   * lately (a decaying count: so an odd slot goes round the flows instead of
   * staying with whichever replica freed it). Sets each local active flow's
   * fleetOver (true: not that flow); SHARE_FILTER when the next flow is one
   * of ours and some of ours are not, SHARE_HOLD when it is another
   * replica's, SHARE_FREE when the other replicas report nothing that bears
   * on this band.
   */
  #fleetShares(b: number): number {
    const peer = this.#fleet!.band(b);
    if (peer === undefined) return SHARE_FREE;
    const band = this.#bands[b]!;
    const local = this.#bySlotKey[b]!;
    const need = band.active.length + peer.flows.size;
    if (this.#fsMin.length < need) {
      const n = Math.max(need, 2 * this.#fsMin.length);
      this.#fsMin = new Float64Array(n);
      this.#fsLoad = new Float64Array(n);
      this.#fsWeight = new Float64Array(n);
      this.#fsServed = new Float64Array(n);
    }
    const mins = this.#fsMin;
    const loads = this.#fsLoad;
    const served = this.#fsServed;
    const slots = this.#fsSlot;
    const now = this.#now();
    let n = 0;
    let peerLoad = false;
    for (let i = 0; i < band.active.length; i++) {
      const s = band.active[i]!;
      const p = peer.flows.get(s.flowId);
      if (p !== undefined) peerLoad = true;
      mins[n] = s.minShare;
      loads[n] = s.inFlight + (p?.inFlight ?? 0);
      served[n] = this.#servedNow(s, now) + (p?.served ?? 0);
      slots[n] = s;
      n++;
    }
    const locals = n;
    for (const [id, f] of peer.flows) {
      if (f.queued <= 0) continue;
      const s = local.get(id);
      if (s !== undefined && s.active) continue; // counted above
      mins[n] = this.#minShare.get(id) ?? 0;
      loads[n] = f.inFlight + (s?.inFlight ?? 0);
      served[n] = f.served + (s !== undefined ? this.#servedNow(s, now) : 0);
      slots[n] = null;
      n++;
    }
    // nobody else queues in this band and none of our flows runs elsewhere: nothing to weigh
    if (n === locals && !peerLoad) {
      slots.length = 0;
      return SHARE_FREE;
    }
    const w = this.#fsWeight;
    waterFill(mins, n, w);
    let least = Infinity;
    for (let k = 0; k < n; k++) least = Math.min(least, loads[k]! / w[k]!);
    // among the flows level at the least in flight: the least served lately, ours or another replica's
    const level = least * (1 + 1e-9) + 1e-12;
    let remoteServed = Infinity;
    for (let k = locals; k < n; k++) if (loads[k]! / w[k]! <= level) remoteServed = Math.min(remoteServed, served[k]! / w[k]!);
    let ours = 0;
    const fleet = this.#fleet!;
    for (let k = 0; k < locals; k++) {
      const s = slots[k]!;
      // the next flow, and of its requests ours are the oldest (another replica's older by more than the exchange's lag goes first)
      const next = loads[k]! / w[k]! <= level && served[k]! / w[k]! <= remoteServed && !(peer.flows.get(s.flowId)?.queued! > 0 && fleet.oldestElsewhere(b, s.flowId) < this.#oldestQueued(s) - OLDER_BY_MS);
      s.fleetOver = !next;
      if (next) ours++;
    }
    slots.length = 0;
    if (ours === 0) return SHARE_HOLD;
    return ours < locals ? SHARE_FILTER : SHARE_FREE;
  }

  /** Pops records from one of a slot's queues until a live one (skipping tombstones). */
  #popLive(slot: Slot, warm: boolean): Waiting | undefined {
    const buf = this.#buf;
    const ring = warm ? slot.index + this.#warmOffset : slot.index;
    while (this.#queues.dequeueBatch(ring, buf, 1) === 1) {
      const w = this.#waiting.get(flowRecordId(buf, 0));
      if (w !== undefined) {
        this.#waiting.delete(w.id);
        this.#removeQueued(w);
        return w;
      }
    }
    // counted but the ring is empty: cannot happen while this controller is
    // the only producer; repair the counters rather than spin.
    if (warm) {
      this.#bands[slot.band]!.warm -= slot.warm;
      slot.live -= slot.warm;
      slot.warm = 0;
    } else slot.live = slot.warm;
    if (slot.live <= 0) slot.queuedCost = 0;
    if (slot.live <= 0 && slot.active) this.#deactivate(slot);
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
    const slot = w.slot;
    this.#grantStats(slot, (this.#now() - w.enqueuedAt) / 1000);
    this.#inFlight++;
    slot.inFlight++;
    this.#busyUp(slot.band);
    if (slot.presentAt < 0) this.#addPresent(slot);
    if (this.#fleet !== null) this.#serve(slot);
    if (w.warm) this.bandStats[slot.band]!.continuations++;
    w.resolve(slot.grantQueued);
  }

  #grantStats(slot: Slot, waitSeconds: number): void {
    slot.stats.dispatched++;
    const bs = this.bandStats[slot.band]!;
    bs.dispatched++;
    bs.observeWait(waitSeconds);
  }

  /** Drops tombstones from one of a slot's full queues by re-queueing its live records in order. */
  #compact(slot: Slot, warm: boolean): boolean {
    const ring = warm ? slot.index + this.#warmOffset : slot.index;
    const live = warm ? slot.warm : slot.live - slot.warm;
    const n = this.#queues.size(ring);
    if (n <= live) return false;
    if (this.#compactBuf.length < n * FLOW_RECORD_WORDS) this.#compactBuf = new Uint32Array(n * FLOW_RECORD_WORDS);
    const buf = this.#compactBuf;
    const got = this.#queues.dequeueBatch(ring, buf, n);
    let keep = 0;
    for (let i = 0; i < got; i++) {
      if (this.#waiting.has(flowRecordId(buf, i))) {
        if (keep !== i) buf.copyWithin(keep * FLOW_RECORD_WORDS, i * FLOW_RECORD_WORDS, (i + 1) * FLOW_RECORD_WORDS);
        keep++;
      }
    }
    this.#queues.enqueueBatch(ring, buf, keep);
    return keep < got;
  }
}
