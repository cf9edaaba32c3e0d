// Counters per LoRA adapter (the router's /metrics reads them at scrape
// time): requests routed, misses (sent to an endpoint that did not have the
// adapter active: the engine loads it into a GPU slot, or the router loads it
// first), loads the router asked for and their failures, requests held in the
// router while no replica had a slot for it. Bounded label set
// (metrics.maxLabelValues).
import { LabelCap } from '../metrics/label-cap.js';

export interface AdapterCount {
  requests: number;
  misses: number;
  loads: number;
  loadFailures: number;
  /** Requests that waited in the router for a GPU adapter slot (adapterQueue). */
  held: number;
}

export class AdapterStats {
  readonly #cap: LabelCap;
  readonly byAdapter = new Map<string, AdapterCount>();

  constructor(maxLabelValues?: number) {
    this.#cap = new LabelCap(maxLabelValues);
  }

  #of(adapter: string): AdapterCount {
    let c = this.byAdapter.get(adapter);
    if (c === undefined) {
      const label = this.#cap.value(adapter);
      c = this.byAdapter.get(label);
      if (c === undefined) this.byAdapter.set(label, (c = { requests: 0, misses: 0, loads: 0, loadFailures: 0, held: 0 }));
      if (label !== adapter) this.byAdapter.set(adapter, c);
    }
    return c;
  }

  /** A request for `adapter` was routed; `active`: to an endpoint that had it active. */
  picked(adapter: string, active: boolean): void {
    const c = this.#of(adapter);
    c.requests++;
    if (!active) c.misses++;
  }

  loaded(adapter: string, ok: boolean): void {
    const c = this.#of(adapter);
    if (ok) c.loads++;
    else c.loadFailures++;
  }

  /** A request for `adapter` waits in the router for a slot. */
  queued(adapter: string): void {
    this.#of(adapter).held++;
  }

  /** Totals over every adapter. */
  totals(): AdapterCount {
    const t = { requests: 0, misses: 0, loads: 0, loadFailures: 0, held: 0 };
    for (const c of new Set(this.byAdapter.values())) {
      t.requests += c.requests;
      t.misses += c.misses;
      t.loads += c.loads;
      t.loadFailures += c.loadFailures;
      t.held += c.held;
    }
    return t;
  }
}
