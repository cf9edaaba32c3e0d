// The embedded Responses store: per tenant, a Map in least-recently-used order
// (a get moves its record to the back), bounded by count and bytes PER TENANT
// (one tenant's turns evict only its own), records expiring ttlSeconds after
// creation (checked on get, swept in the background). The tenant is the
// first level of the key, so another tenant's id is simply absent.
// Synchronous: a turn costs no promise here.
import type { ResponsesConfig } from '../config/responses.js';
import { recordBytes, type ResponseStore, type StoredResponse } from './store.js';

interface Entry {
  readonly r: StoredResponse;
  readonly bytes: number;
  /** Date.now() ms after which it is gone. */
  readonly expires: number;
}

/** One tenant's records. */
class Space {
  readonly map = new Map<string, Entry>();
  bytes = 0;
}

export class MemoryStore implements ResponseStore {
  readonly type = 'memory' as const;
  readonly available = true;
  readonly #spaces = new Map<string, Space>();
  readonly #ttlMs: number;
  readonly #maxResponses: number;
  readonly #maxBytes: number;
  #bytes = 0;
  #count = 0;
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

  /** Bytes held, all tenants. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Responses held, all tenants. */
  size(): number {
    return this.#count;
  }

  /** Responses held for one tenant. */
  sizeOf(tenant: string): number {
    return this.#spaces.get(tenant)?.map.size ?? 0;
  }

  #drop(sp: Space, id: string, e: Entry): void {
    sp.map.delete(id);
    sp.bytes -= e.bytes;
    this.#bytes -= e.bytes;
    this.#count--;
  }

  get(tenant: string, id: string): StoredResponse | null {
    const sp = this.#spaces.get(tenant);
    const e = sp?.map.get(id);
    if (e === undefined) return null;
    if (e.expires <= Date.now()) {
      this.#drop(sp!, id, e);
      return null;
    }
    sp!.map.delete(id);
    sp!.map.set(id, e); // most recently used: to the back
    return e.r;
  }

  put(r: StoredResponse): boolean {
    const bytes = recordBytes(r);
    let sp = this.#spaces.get(r.tenant);
    const old = sp?.map.get(r.id);
    if (old !== undefined) this.#drop(sp!, r.id, old);
    // a record larger than a tenant's whole budget is not kept (the turn answers store: false)
    if (bytes > this.#maxBytes) return false;
    if (sp === undefined) this.#spaces.set(r.tenant, (sp = new Space()));
    sp.map.set(r.id, { r, bytes, expires: Date.now() + this.#ttlMs });
    sp.bytes += bytes;
    this.#bytes += bytes;
    this.#count++;
    if (sp.map.size > this.#maxResponses || sp.bytes > this.#maxBytes) this.#evict(sp);
    return true;
  }

  #evict(sp: Space): void {
    // Map iterates in insertion order: the front is the least recently used
    for (const [id, e] of sp.map) {
      if (sp.map.size <= this.#maxResponses && sp.bytes <= this.#maxBytes) return;
      this.#drop(sp, id, e);
      this.evictions++;
    }
  }

  delete(tenant: string, id: string): boolean {
    const sp = this.#spaces.get(tenant);
    const e = sp?.map.get(id);
    if (e === undefined) return false;
    this.#drop(sp!, id, e);
    return e.expires > Date.now();
  }

  /** Drops expired records (background; O(records)). */
  sweep(now: number): void {
    for (const [tenant, sp] of this.#spaces) {
      for (const [id, e] of sp.map) if (e.expires <= now) this.#drop(sp, id, e);
      if (sp.map.size === 0) this.#spaces.delete(tenant);
    }
  }

  async close(): Promise<void> {
    clearInterval(this.#sweep);
    this.#spaces.clear();
    this.#bytes = 0;
    this.#count = 0;
  }
}
