// The embedded Responses store: per tenant, a Map in least-recently-used order
// (a get moves its record to the back), bounded by count and bytes PER TENANT
// (one tenant's turns evict only its own), records expiring ttlSeconds after
// creation (checked on get, swept in the background). The tenant is the
// first level of the key, so another tenant's id is simply absent.
// Synchronous: a turn costs no promise here.
//
// A record's conversation is a chain of parts: a continuation keeps only what
// its turn added (store.ts: addedConv) and points at its parent's part, so a
// branch costs what it adds. A part counts the parts below it (`kids`) and
// stays, charged to its tenant, while its record or any of them is held; it
// goes with the last of them. Every MAX_LINKS parts the conversation is kept
// whole again, so a read joins at most MAX_LINKS parts.
import type { ResponsesConfig } from '../config/responses.js';
import { entryBytes, linksParent, MAX_LINKS, partBytes, type ResponseStore, type StoredResponse } from './store.js';

/** One turn's part of a conversation. */
class Part {
  /** Parts below this one (continuations linked to it). */
  kids = 0;
  /** Its record is held. */
  live = true;
  constructor(
    /** What the turn added (the whole conversation when `up` is null). */
    readonly conv: string,
    readonly ids: string,
    /** The parent's part, or null (a first turn, a truncated conversation, a checkpoint). */
    public up: Part | null,
    /** Parts from this one to the chain's whole one (0: this one is whole). */
    readonly depth: number,
    readonly bytes: number,
    /** Its bytes and those of the parts above it: what the conversation through it holds. */
    readonly chainBytes: number,
  ) {}
}

interface Entry {
  readonly tenant: string;
  readonly id: string;
  readonly root: string;
  readonly parent: string;
  readonly createdAt: number;
  readonly response: string;
  readonly part: Part;
  /** The record's own bytes (its part is charged apart). */
  readonly bytes: number;
  /** Date.now() ms after which it is gone. */
  readonly expires: number;
}

/** One tenant's records. */
class Space {
  readonly map = new Map<string, Entry>();
  /** Its records' bytes and its parts' bytes. */
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

  /** Bytes held for one tenant (its records and their conversations' parts). */
  bytesOf(tenant: string): number {
    return this.#spaces.get(tenant)?.bytes ?? 0;
  }

  #charge(sp: Space, bytes: number): void {
    sp.bytes += bytes;
    this.#bytes += bytes;
  }

  #drop(sp: Space, id: string, e: Entry): void {
    sp.map.delete(id);
    this.#charge(sp, -e.bytes);
    this.#count--;
    // its part, and the parts above it no one else needs, go
    let p: Part | null = e.part;
    p.live = false;
    while (p !== null && !p.live && p.kids === 0) {
      this.#charge(sp, -p.bytes);
      const up: Part | null = p.up;
      p.up = null;
      if (up !== null) up.kids--;
      p = up;
    }
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
    let conv = e.part.conv;
    let ids = e.part.ids;
    if (e.part.up !== null) {
      // joined once, oldest first: one flat string each (a turn sends it whole), not a deep chain of concatenations
      const cs: string[] = [];
      const is: string[] = [];
      for (let p: Part | null = e.part; p !== null; p = p.up) {
        cs.push(p.conv);
        is.push(p.ids);
      }
      conv = cs.reverse().join(',');
      ids = is.reverse().join(',');
    }
    return { tenant, id, root: e.root, parent: e.parent, createdAt: e.createdAt, conv, ids, response: e.response };
  }

  put(r: StoredResponse): boolean {
    let sp = this.#spaces.get(r.tenant);
    const old = sp?.map.get(r.id);
    if (old !== undefined) this.#drop(sp!, r.id, old);
    // linked to the parent's part while its record is held and the chain is short enough; else whole
    const up = linksParent(r) ? sp?.map.get(r.parent)?.part : undefined;
    const linked = up !== undefined && up.depth + 1 < MAX_LINKS;
    const conv = linked ? r.addedConv! : r.conv;
    const ids = linked ? r.addedIds! : r.ids;
    const own = entryBytes(r);
    const pb = partBytes(conv.length, ids.length);
    const chain = linked ? up.chainBytes + pb : pb;
    // a record larger than a tenant's whole budget, with the conversation it needs, is not kept (the turn answers store: false)
    if (own + chain > this.#maxBytes) return false;
    if (sp === undefined) this.#spaces.set(r.tenant, (sp = new Space()));
    // a part is read on every later turn of its conversation: made one flat string now (V8 flattens a
    // concatenation in place on its first character read), so a read joins flat strings
    if (linked) {
      conv.charCodeAt(0);
      ids.charCodeAt(0);
    }
    const part = new Part(conv, ids, linked ? up : null, linked ? up.depth + 1 : 0, pb, chain);
    if (linked) up.kids++;
    const e: Entry = { tenant: r.tenant, id: r.id, root: r.root, parent: r.parent, createdAt: r.createdAt, response: r.response, part, bytes: own, expires: Date.now() + this.#ttlMs };
    sp.map.set(r.id, e);
    this.#charge(sp, own + pb);
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
