// The embedded Responses store: a Map in least-recently-used order (a get
// moves its record to the back), bounded by count and bytes, records expiring
// ttlSeconds after creation (checked on get, swept in the background).
// Synchronous: a turn costs no promise here.
import type { ResponsesConfig } from '../config/responses.js';
import { recordBytes, type ResponseStore, type StoredResponse } from './store.js';

interface Entry {
  readonly r: StoredResponse;
  readonly bytes: number;
  /** Date.now() ms after which it is gone. */
  readonly expires: number;
}

export class MemoryStore implements ResponseStore {
  readonly type = 'memory' as const;
  readonly available = true;
  readonly #map = new Map<string, Entry>();
  readonly #ttlMs: number;
  readonly #maxResponses: number;
  readonly #maxBytes: number;
  #bytes = 0;
  /** Records dropped to stay within the bounds (not counting expiry). */
  evictions = 0;
  #sweep: NodeJS.Timeout;

  constructor(cfg: Pick<ResponsesConfig, 'ttlSeconds' | 'maxResponses' | 'maxBytes'>) {
    this.#ttlMs = cfg.ttlSeconds * 1000;
    this.#maxResponses = cfg.maxResponses;
    this.#maxBytes = cfg.maxBytes;
    this.#sweep = setInterval(() => this.sweep(Date.now()), Math.min(60_000, Math.max(1000, this.#ttlMs / 4)));
    this.#sweep.unref();
  }

  get bytes(): number {
    return this.#bytes;
  }

  size(): number {
    return this.#map.size;
  }

  get(id: string): StoredResponse | null {
    const e = this.#map.get(id);
    if (e === undefined) return null;
    this.#map.delete(id);
    if (e.expires <= Date.now()) {
      this.#bytes -= e.bytes;
      return null;
    }
    this.#map.set(id, e); // most recently used: to the back
    return e.r;
  }

  put(r: StoredResponse): void {
    const bytes = recordBytes(r);
    const old = this.#map.get(r.id);
    if (old !== undefined) {
      this.#map.delete(r.id);
      this.#bytes -= old.bytes;
    }
    // a record larger than the whole budget is not kept (its continuation is a clean 404)
    if (bytes > this.#maxBytes) return;
    this.#map.set(r.id, { r, bytes, expires: Date.now() + this.#ttlMs });
    this.#bytes += bytes;
    if (this.#map.size > this.#maxResponses || this.#bytes > this.#maxBytes) this.#evict();
  }

  #evict(): void {
    // Map iterates in insertion order: the front is the least recently used
    for (const [id, e] of this.#map) {
      if (this.#map.size <= this.#maxResponses && this.#bytes <= this.#maxBytes) return;
      this.#map.delete(id);
      this.#bytes -= e.bytes;
      this.evictions++;
    }
  }

  delete(id: string): boolean {
    const e = this.#map.get(id);
    if (e === undefined) return false;
    this.#map.delete(id);
    this.#bytes -= e.bytes;
    return e.expires > Date.now();
  }

  /** Drops expired records (background; O(records)). */
  sweep(now: number): void {
    for (const [id, e] of this.#map) {
      if (e.expires <= now) {
        this.#map.delete(id);
        this.#bytes -= e.bytes;
      }
    }
  }

  async close(): Promise<void> {
    clearInterval(this.#sweep);
    this.#map.clear();
    this.#bytes = 0;
  }
}
