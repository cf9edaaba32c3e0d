// The simulator's host-memory KV tier (--cpu-offload-blocks N, like an
// offloading connector): a block evicted from the GPU cache is copied here;
// a prompt that needs it again loads it back (kv-cache.ts counts it as a hit
// and the scheduler charges cpuReloadUsPerBlock per block instead of the
// recompute). LRU over a Map's insertion order; over capacity the oldest
// block leaves. With KV events on, a copy in is BlockStored with medium
// "CPU" and a drop is BlockRemoved with medium "CPU".
import type { KvEventSink } from './kv-events.js';

interface HostBlock {
  hash: number;
  parent: number | null;
  tokens: Uint32Array | null;
  loraId: number | null;
  loraName: string | null;
}

export class HostTier {
  readonly capacity: number;
  readonly #map = new Map<number, HostBlock>();
  #events: KvEventSink | null;
  readonly #dropped: number[] = [];
  /** Blocks copied in, loaded back (hits), dropped. */
  offloaded = 0;
  evictions = 0;

  constructor(capacity: number, events: KvEventSink | null) {
    this.capacity = capacity;
    this.#events = events;
  }

  setEvents(events: KvEventSink | null): void {
    this.#events = events;
  }

  get size(): number {
    return this.#map.size;
  }

  has(hash: number): boolean {
    return this.#map.has(hash);
  }

  /** Copies an evicted GPU block in (or refreshes the copy already here). */
  put(b: HostBlock): void {
    const had = this.#map.get(b.hash);
    if (had !== undefined) {
      this.#map.delete(b.hash);
      this.#map.set(b.hash, had);
      return;
    }
    while (this.#map.size >= this.capacity) {
      const oldest = this.#map.keys().next().value as number;
      this.#map.delete(oldest);
      this.evictions++;
      if (this.#events !== null) this.#dropped.push(oldest);
    }
    this.#map.set(b.hash, { hash: b.hash, parent: b.parent, tokens: b.tokens, loraId: b.loraId, loraName: b.loraName });
    this.offloaded++;
    if (this.#events !== null && b.tokens !== null) this.#events.stored([b.hash], b.parent, b.tokens, b.loraId, b.loraName, 'CPU');
  }

  /** Reports the blocks dropped since the last flush. */
  flush(): void {
    if (this.#dropped.length > 0 && this.#events !== null) {
      this.#events.removed(this.#dropped, 'CPU');
      this.#dropped.length = 0;
    }
  }

  clear(): void {
    if (this.#events !== null) for (const h of this.#map.keys()) this.#dropped.push(h);
    this.#map.clear();
  }
}
