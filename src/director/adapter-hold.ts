// The router-side hold for LoRA adapter requests (config adapterQueue,
// docs/models.md "When no slot is free"). An engine runs a bounded number of
// distinct adapters at once (vLLM's --max-loras, reported as max_lora in
// vllm:lora_requests_info); a request for another adapter waits in that
// engine's queue until one of them has no request left running. Sent there,
// it is bound to that engine: another replica that frees a slot first cannot
// take it, and it waits without bound. Held here instead, it goes to the first
// replica where it can run, in arrival order per adapter, or is answered 503
// with Retry-After once it has waited `maxWaitMs`.
//
// A request waits when every candidate engine (of its base model, routable,
// holding the adapter or able to load it) is known to have no free slot for
// it: fresh metrics that report max_lora, the adapter running nowhere among
// them, and max_lora distinct other adapters running there (slotFor: exact
// from the router's own requests while it is the engine's only client, else
// the engine's running list of the last scrape). Adapters in the engine's
// waiting list are not counted: they hold no slot (with a slot free they wait
// for batch room or KV blocks, which is load, not adapters); counting them, as
// the lora-affinity scorer's conservative free-slot estimate does, would turn
// requests away from an engine where their adapter is still in a slot and
// make them load it elsewhere (bench/RESULTS.md, "Adapter hold"). An engine
// that does not report adapter slots, or whose metrics are stale, is never a
// reason to hold. Batch room is not the hold's business: a request that can
// run where its adapter is in a slot goes there as any request does (flow
// control's saturation detector governs load). When some candidate has a slot,
// the pick is narrowed to those that do (`exclude`: the others).
//
// A held request is woken, oldest first (per adapter, then across adapters by
// arrival), when anything that frees a slot happens: a request of this router
// ends, an engine's scrape arrives (the engine's own lists, which also show
// other routers' requests ending), or the endpoint set changes. A new adapter
// request first lets the held ones go, so it never takes a slot ahead of them.
// Cold path only: base-model requests pay one map lookup (the scheduler's own).
import { performance } from 'node:perf_hooks';
import type { AbortLike, Rejected } from '../admission.js';
import type { Endpoint, EndpointSet } from '../endpoints/endpoint.js';
import { ADAPTER_QUEUE_DEFAULTS, type AdapterQueueConfig } from '../config/models.js';

/** What the hold needs of a request (the director's Flight). */
export interface Holdable extends AbortLike {
  readonly model: string;
  /** The hold lets it go: the pick runs now, narrowed by the hold's `exclude`. */
  holdReleased(): void;
  /** The hold refuses it (full, timed out, shutting down): the answer is this rejection. */
  holdRefused(r: Rejected): void;
}

interface Entry {
  f: Holdable | null;
  readonly adapter: string;
  readonly seq: number;
  /** performance.now() when it was held. */
  readonly at: number;
  readonly deadline: number;
  readonly bytes: number;
}

class AdapterQueue {
  readonly items: Entry[] = [];
  head = 0;
  /** Entries not cancelled. */
  live = 0;

  first(): Entry | undefined {
    const it = this.items;
    while (this.head < it.length && it[this.head]!.f === null) this.head++;
    return it[this.head];
  }

  shift(): void {
    this.head++;
    if (this.head > 64 && this.head * 2 > this.items.length) {
      this.items.splice(0, this.head);
      this.head = 0;
    }
  }
}

/** Outcomes of held requests since start (switchyard_adapter_queue_total{outcome}). */
export interface HoldCounts {
  held: number;
  dispatched: number;
  timeout: number;
  full: number;
  cancelled: number;
  /** Total wait of the released ones, ms. */
  waitedMs: number;
}

export class AdapterHold {
  #cfg: AdapterQueueConfig;
  readonly #set: EndpointSet;
  readonly #queues = new Map<string, AdapterQueue>();
  #held = 0;
  #bytes = 0;
  #seq = 0;
  #timer: NodeJS.Timeout | null = null;
  #timerAt = 0;
  #wakePending = false;
  #draining = false;
  #closed = false;
  /** Endpoints among the last check's candidates where the adapter has no slot: the pick leaves them out. */
  readonly #noSlot: Endpoint[] = [];
  readonly counts: HoldCounts = { held: 0, dispatched: 0, timeout: 0, full: 0, cancelled: 0, waitedMs: 0 };
  readonly #wakeNow = (): void => {
    this.#wakePending = false;
    this.drain();
  };

  constructor(set: EndpointSet, cfg: AdapterQueueConfig = ADAPTER_QUEUE_DEFAULTS) {
    this.#set = set;
    this.#cfg = cfg;
  }

  /** A reload's settings: bounds apply to new requests, a new maxWaitMs to requests held from now on. */
  configure(cfg: AdapterQueueConfig): void {
    this.#cfg = cfg;
    if (!cfg.enabled) this.drain(true);
  }

  get config(): AdapterQueueConfig {
    return this.#cfg;
  }

  /** Requests held now. */
  get held(): number {
    return this.#held;
  }

  /** Requests held now for `adapter`. */
  heldFor(adapter: string): number {
    return this.#queues.get(adapter)?.live ?? 0;
  }

  /** Adapters with requests held now, and how many each. */
  heldByAdapter(): [string, number][] {
    const out: [string, number][] = [];
    for (const [a, q] of this.#queues) if (q.live > 0) out.push([a, q.live]);
    return out;
  }

  /** `model` is an adapter (not a base model) and the hold is on. */
  applies(model: string): boolean {
    return this.#cfg.enabled && this.#set.baseOf(model) !== undefined && !this.#isBase(model);
  }

  #isBase(model: string): boolean {
    const eps = this.#set.forModel(model);
    return eps !== undefined && eps.length > 0 && eps[0]!.models.includes(model);
  }

  /**
   * Whether a request for `adapter` must wait: requests of it are held already
   * (FIFO), or no candidate has a slot for it. Lets the held requests that can
   * go now go first. When it need not wait, `exclude` lists the candidates
   * without a slot (the pick leaves them out).
   */
  mustWait(adapter: string, now: number): boolean {
    if (this.#held > 0) this.drain();
    if ((this.#queues.get(adapter)?.live ?? 0) > 0) return true;
    return !this.#hasSlot(adapter, now);
  }

  /** Candidates without a slot at the last check that answered "go" (valid until the next check). */
  get exclude(): readonly Endpoint[] | null {
    return this.#noSlot.length > 0 ? this.#noSlot : null;
  }

  /**
   * Holds `f` (after mustWait said so); `bytes` what it keeps in memory while
   * held. Refuses it at once (holdRefused) when a bound is reached.
   */
  hold(f: Holdable, adapter: string, bytes: number, now: number): void {
    const c = this.#cfg;
    let q = this.#queues.get(adapter);
    const mine = q?.live ?? 0;
    let why = '';
    if (mine >= c.maxPerAdapter) why = `${mine} requests for adapter \`${adapter}\` wait for a GPU adapter slot (adapterQueue.maxPerAdapter)`;
    else if (this.#held >= c.maxRequests) why = `${this.#held} adapter requests wait for a GPU adapter slot (adapterQueue.maxRequests)`;
    else if (this.#bytes + bytes > c.maxBytes) why = `the adapter requests waiting for a GPU adapter slot hold ${this.#bytes} bytes (adapterQueue.maxBytes ${c.maxBytes})`;
    if (why !== '') {
      this.counts.full++;
      f.holdRefused({ admitted: false, status: 503, reason: 'adapter-queue-full', retryAfterSeconds: c.retryAfterSeconds, message: `No replica has a free adapter slot for \`${adapter}\` and ${why}; retry later.` });
      return;
    }
    if (q === undefined) this.#queues.set(adapter, (q = new AdapterQueue()));
    const e: Entry = { f, adapter, seq: ++this.#seq, at: now, deadline: now + c.maxWaitMs, bytes };
    q.items.push(e);
    q.live++;
    this.#held++;
    this.#bytes += bytes;
    this.counts.held++;
    this.#set.adapterStats.queued(adapter);
    f.onabort = () => this.#cancel(e);
    this.#arm(e.deadline);
  }

  /** Something may have freed a slot: the held requests are looked at once the current event is over. */
  wake(): void {
    if (this.#held === 0 || this.#wakePending) return;
    this.#wakePending = true;
    setImmediate(this.#wakeNow);
  }

  /**
   * Lets go every held request that can go now, oldest first per adapter and
   * across adapters by arrival; `all`: every one (the hold was turned off).
   */
  drain(all = false): void {
    if (this.#draining || this.#held === 0) return;
    this.#draining = true;
    try {
      const qs = [...this.#queues];
      if (qs.length > 1) qs.sort((a, b) => (a[1].first()?.seq ?? Infinity) - (b[1].first()?.seq ?? Infinity));
      const now = performance.now();
      for (const [adapter, q] of qs) {
        for (let e = q.first(); e !== undefined; e = q.first()) {
          if (!all && !this.#hasSlot(adapter, now)) break;
          if (all) this.#noSlot.length = 0;
          q.shift();
          const f = this.#take(e);
          this.counts.dispatched++;
          this.counts.waitedMs += now - e.at;
          f.holdReleased();
        }
        if (q.live === 0) this.#queues.delete(adapter);
      }
    } finally {
      this.#draining = false;
      this.#noSlot.length = 0;
    }
  }

  /** Refuses every held request (the router closes). */
  close(): void {
    this.#closed = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    for (const q of this.#queues.values()) {
      for (let e = q.first(); e !== undefined; e = q.first()) {
        q.shift();
        this.#take(e).holdRefused({ admitted: false, status: 503, reason: 'adapter-queue-closed', message: 'The router is shutting down; the request waited for a GPU adapter slot.' });
      }
    }
    this.#queues.clear();
  }

  // ---- internals ----------------------------------------------------------------

  /** Takes `e` out of the accounting and returns its request. */
  #take(e: Entry): Holdable {
    const f = e.f!;
    e.f = null;
    f.onabort = null;
    const q = this.#queues.get(e.adapter);
    if (q !== undefined) q.live--;
    this.#held--;
    this.#bytes -= e.bytes;
    return f;
  }

  #cancel(e: Entry): void {
    if (e.f === null) return;
    this.#take(e);
    this.counts.cancelled++;
    const q = this.#queues.get(e.adapter);
    if (q !== undefined && q.live === 0) this.#queues.delete(e.adapter);
  }

  /**
   * Some candidate for `adapter` has a slot for it (or cannot be known not
   * to, or there is no candidate at all: the pick answers that). Fills
   * #noSlot with the candidates that have none.
   */
  #hasSlot(adapter: string, now: number): boolean {
    const no = this.#noSlot;
    no.length = 0;
    const eps = this.#set.forModel(adapter);
    const base = this.#set.baseOf(adapter);
    if (eps === undefined || base === undefined) return true;
    let candidates = 0;
    let slot = false;
    for (let i = 0; i < eps.length; i++) {
      const ep = eps[i]!;
      if (!ep.routable(now) || !ep.serves(base) || !(ep.adapters.has(adapter) || ep.canLoad(adapter, now))) continue;
      candidates++;
      if (slotFor(ep, adapter, now)) slot = true;
      else no.push(ep);
    }
    if (candidates === 0 || slot) return true;
    no.length = 0;
    return false;
  }

  #arm(deadline: number): void {
    if (this.#closed || (this.#timer !== null && this.#timerAt <= deadline)) return;
    if (this.#timer !== null) clearTimeout(this.#timer);
    // at most one firing per 10 ms however many deadlines there are
    const at = Math.max(deadline, performance.now() + 10);
    this.#timerAt = at;
    this.#timer = setTimeout(() => this.#expire(), at - performance.now());
    this.#timer.unref();
  }

  /** Answers the requests whose wait is over (503 with Retry-After); re-arms for the next deadline. */
  #expire(): void {
    this.#timer = null;
    const now = performance.now();
    const c = this.#cfg;
    let next = Infinity;
    for (const [adapter, q] of [...this.#queues]) {
      for (let i = q.head; i < q.items.length; i++) {
        const e = q.items[i]!;
        if (e.f === null) continue;
        if (e.deadline > now) {
          if (e.deadline < next) next = e.deadline;
          continue;
        }
        const f = this.#take(e);
        this.counts.timeout++;
        const waited = Math.round(now - e.at);
        f.holdRefused({
          admitted: false,
          status: 503,
          reason: 'adapter-queue-timeout',
          retryAfterSeconds: c.retryAfterSeconds,
          message: `No replica had a free adapter slot for \`${adapter}\` within ${waited} ms (adapterQueue.maxWaitMs); retry later.`,
        });
      }
      q.first();
      if (q.live === 0) this.#queues.delete(adapter);
    }
    if (next !== Infinity) this.#arm(next);
  }
}

/**
 * `ep` can run a request for `adapter` without waiting for an adapter slot:
 * the adapter runs there now, or fewer than max_lora distinct adapters run
 * there. When the last scrape showed no request there but this router's (no
 * other client, no replica), this router's requests in flight are exactly
 * what runs there, so that count is used, exact between scrapes (a slot frees
 * the moment the router's last request of an adapter ends). Otherwise the
 * engine's running list (a scrape old) is added, and an adapter among the
 * last max_lora this router sent there counts as still in a slot (with fewer
 * than max_lora others running). True when it cannot be known (metrics stale,
 * or no max_lora reported).
 */
export function slotFor(ep: Endpoint, adapter: string, now: number): boolean {
  const m = ep.metrics;
  if (m.loraMax <= 0 || !ep.fresh(now)) return true;
  const mine = ep.adapterInFlight;
  if (mine.has(adapter)) return true;
  if (ep.foreign === 0 && ep.peerInFlight === 0) return mine.size < m.loraMax;
  if (ep.recentAdapters.has(adapter) || m.loraRunning.includes(adapter)) return true;
  let used = mine.size;
  for (const a of m.loraRunning) if (!mine.has(a)) used++;
  return used < m.loraMax;
}
