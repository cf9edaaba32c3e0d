// The warm standby's feed: the active's routing-state changes as compact
// msgpack deltas on a Redis stream, and the standby's follower that applies
// them to its own prefix index.
//
// On the active, DeltaBuffer observes the prefix store (src/scheduler/
// prefix-store.ts: a record on every pick, a removal when a failed dispatch
// forgets blocks, a clear) and copies the block hashes into preallocated
// typed arrays: no allocation and no Redis call per request. A timer
// (ha.deltaFlushMs) encodes what gathered, plus the endpoints' in-flight
// counts, into one message and appends it with the fenced XADD (lease.ts), so
// an old active that lost its lease cannot write. On the standby,
// DeltaFollower reads the stream (from its start when the router starts: the
// capped stream holds the recent working set) and applies each message to its
// index, mapping endpoint names (not ids: two routers may number them
// differently).
//
// Message (msgpack map): v: 1, n: endpoint names by the active's ids,
// o: ops as little-endian int32 triples (kind, endpoint id, hash count),
// h: the hashes as little-endian uint64 bytes in op order, i: in-flight count
// per endpoint id, d: ops dropped since the last message (buffer full).
import { pack, unpack } from 'msgpackr';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { EndpointSet } from '../endpoints/endpoint.js';
import type { PrefixObserver, PrefixStore } from '../scheduler/prefix-store.js';

export const OP_RECORD = 1;
export const OP_REMOVE = 2;
export const OP_CLEAR = 3;

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

export class DeltaBuffer implements PrefixObserver {
  readonly #endpoints: EndpointSet;
  /** Hashes as uint32 halves (copied without reading BigInts). */
  readonly #h32: Uint32Array;
  #hLen = 0; // in hashes
  readonly #ops: Int32Array;
  #opLen = 0; // in ops
  #dropped = 0;
  /** A uint32 view of the last source array (the match result's, reused by every request). */
  #srcBuf: ArrayBufferLike | null = null;
  #srcOff = -1;
  #src32: Uint32Array<ArrayBufferLike> = new Uint32Array(0);
  #lastInFlight = '';
  /** Called on the first op after a take (an active-active replica's prompt flush, src/ha/fleet.ts); null: none. */
  #wake: (() => void) | null = null;
  #woken = false;

  constructor(endpoints: EndpointSet, maxHashes = 1 << 18, maxOps = 1 << 15) {
    if (!LITTLE_ENDIAN) throw new Error('the delta stream assumes a little-endian host');
    this.#endpoints = endpoints;
    this.#h32 = new Uint32Array(maxHashes * 2);
    this.#ops = new Int32Array(maxOps * 3);
  }

  get pendingOps(): number {
    return this.#opLen;
  }

  #op(kind: number, endpointId: number, hashes: BigUint64Array | null, count: number): void {
    const h = this.#h32;
    if (this.#opLen * 3 >= this.#ops.length || (this.#hLen + count) * 2 > h.length) {
      this.#dropped++;
      return;
    }
    if (count > 0 && hashes !== null) {
      if (hashes.buffer !== this.#srcBuf || hashes.byteOffset !== this.#srcOff || this.#src32.length < count * 2) {
        // a new source array (the match result grew, or a forget's scratch array): one view, cold
        this.#srcBuf = hashes.buffer;
        this.#srcOff = hashes.byteOffset;
        this.#src32 = new Uint32Array(hashes.buffer, hashes.byteOffset, hashes.length * 2);
      }
      const src = this.#src32;
      const base = this.#hLen * 2;
      for (let i = 0; i < count * 2; i++) h[base + i] = src[i];
      this.#hLen += count;
    }
    const o = this.#opLen * 3;
    this.#ops[o] = kind;
    this.#ops[o + 1] = endpointId;
    this.#ops[o + 2] = count;
    this.#opLen++;
    if (!this.#woken && this.#wake !== null) {
      this.#woken = true;
      this.#wake();
    }
  }

  /** Sets the callback run on the first op gathered after each take (null: none). */
  onFirstOp(wake: (() => void) | null): void {
    this.#wake = wake;
    this.#woken = false;
  }

  recorded(endpointId: number, hashes: BigUint64Array, count: number): void {
    this.#op(OP_RECORD, endpointId, hashes, count);
  }

  removed(endpointId: number, hashes: BigUint64Array, count: number): void {
    this.#op(OP_REMOVE, endpointId, hashes, count);
  }

  cleared(endpointId: number): void {
    this.#op(OP_CLEAR, endpointId, null, 0);
  }

  /** Forgets what gathered (the router stepped down: it may no longer publish). */
  reset(): void {
    this.#opLen = this.#hLen = this.#dropped = 0;
    this.#woken = false;
  }

  /** Encodes what gathered since the last call (null: nothing changed) and starts over. Off the request path (a timer). */
  take(): Buffer | null {
    const all = this.#endpoints.all;
    const inFlight = all.map((ep) => ep.inFlight);
    const key = inFlight.join(',');
    if (this.#opLen === 0 && this.#dropped === 0 && key === this.#lastInFlight) return null;
    this.#lastInFlight = key;
    const msg = {
      v: 1,
      n: all.map((ep) => ep.name),
      o: Buffer.from(this.#ops.buffer, 0, this.#opLen * 12),
      h: Buffer.from(this.#h32.buffer, 0, this.#hLen * 8),
      i: inFlight,
      d: this.#dropped,
    };
    const out = pack(msg);
    this.reset();
    return out;
  }

  /**
   * An active-active replica's message (src/ha/fleet.ts): always one (it is
   * also the replica's heartbeat), with its own load per endpoint beside the
   * ops: i in flight, u of those sent since the last scrape (the engine's
   * figures cannot show them yet), p prefill-backlog tokens, q the requests
   * p counts; r the replica's id, t its wall clock (ms), x 1 on its last
   * message (it is leaving: its share goes at once).
   */
  takeShare(replica: string, leaving = false, flows?: unknown[]): Buffer {
    const all = this.#endpoints.all;
    const n = all.length;
    const names: string[] = new Array(n);
    const i: number[] = new Array(n);
    const u: number[] = new Array(n);
    const p: number[] = new Array(n);
    const q: number[] = new Array(n);
    for (let k = 0; k < n; k++) {
      const ep = all[k];
      names[k] = ep.name;
      i[k] = ep.inFlight;
      u[k] = Math.min(ep.sinceScrape, ep.inFlight);
      p[k] = Math.round(ep.prefillPending);
      q[k] = ep.prefillRequests;
    }
    const msg: DeltaMessage = {
      v: 1,
      r: replica,
      t: Date.now(),
      x: leaving ? 1 : 0,
      n: names,
      o: Buffer.from(this.#ops.buffer, 0, this.#opLen * 12),
      h: Buffer.from(this.#h32.buffer, 0, this.#hLen * 8),
      i,
      u,
      p,
      q,
      d: this.#dropped,
    };
    if (flows !== undefined) msg.f = flows;
    const out = pack(msg);
    this.reset();
    return out;
  }
}

export interface ApplyTarget {
  endpoints: EndpointSet;
  store: PrefixStore | null;
}

/** A decoded message (v1): the standby pair's and the active-active replicas' (takeShare). */
export interface DeltaMessage {
  v: 1;
  n: string[];
  o: Uint8Array;
  h: Uint8Array;
  i?: number[];
  d?: number;
  /** Active-active only: replica id, wall clock, leaving, unseen / prefill tokens / prefill requests per endpoint. */
  r?: string;
  t?: number;
  x?: number;
  u?: number[];
  p?: number[];
  q?: number[];
  /** Active-active with ha.shareFlows: the replica's flows, flat [pool, band, flow, in flight, queued] tuples (src/flow/fleet-flows.ts checks them). */
  f?: unknown;
}

/** Decodes one message; throws on anything that is not a switchyard delta (v1). */
export function decodeDelta(raw: Buffer): DeltaMessage {
  const m = unpack(raw) as Partial<DeltaMessage> | null;
  if (m === null || typeof m !== 'object' || m.v !== 1 || !Array.isArray(m.n) || !(m.o instanceof Uint8Array) || !(m.h instanceof Uint8Array)) {
    throw new Error('not a switchyard delta (v1)');
  }
  if (m.o.length % 12 !== 0 || m.h.length % 8 !== 0) throw new Error('delta ops or hashes of a length that is not whole records');
  return m as DeltaMessage;
}

/**
 * Applies a decoded message's ops to a router's index in one native call
 * (PrefixStore.applyOps; endpoints mapped by name, those this router does not
 * have skipped); returns the ops applied. Throws on counts out of range.
 */
export function applyDeltaOps(m: DeltaMessage, t: ApplyTarget): number {
  const store = t.store;
  if (store === null || m.o.length === 0) return 0;
  const names = m.n;
  // copies: the decoded bytes need not be aligned for typed-array views
  const ops = new Int32Array(new Uint8Array(m.o).buffer);
  const hashes = new BigUint64Array(new Uint8Array(m.h).buffer);
  const nOps = ops.length / 3;
  let total = 0;
  for (let k = 0; k < nOps; k++) {
    const c = ops[3 * k + 2];
    if (c < 0) throw new Error('delta hash count out of range');
    total += c;
    const src = ops[3 * k + 1];
    const name = src >= 0 && src < names.length ? names[src] : undefined;
    ops[3 * k + 1] = name !== undefined ? (t.endpoints.byName(name)?.id ?? -1) : -1;
  }
  if (total > hashes.length) throw new Error('delta hash count out of range');
  if (store.applyOps !== undefined) return store.applyOps(ops, nOps, hashes, total);
  let at = 0;
  let applied = 0;
  for (let k = 0; k < nOps; k++) {
    const kind = ops[3 * k];
    const id = ops[3 * k + 1];
    const count = ops[3 * k + 2];
    const hs = hashes.subarray(at, at + count);
    at += count;
    if (id < 0) continue;
    if (kind === OP_RECORD) store.applyRecord?.(id, hs, count);
    else if (kind === OP_REMOVE) store.applyRemove?.(id, hs, count);
    else if (kind === OP_CLEAR) store.clear(id);
    applied++;
  }
  return applied;
}

/** Applies one message to a router's index; returns the ops applied and fills the peer's in-flight counts by endpoint name. Throws on a malformed message. */
export function applyDelta(raw: Buffer, t: ApplyTarget, peerInFlight: Map<string, number>): number {
  const m = decodeDelta(raw);
  const names = m.n;
  if (Array.isArray(m.i)) m.i.forEach((c, k) => names[k] !== undefined && peerInFlight.set(names[k], Number(c) || 0));
  return applyDeltaOps(m, t);
}

/** The standby's reader of the delta stream (a dedicated connection: XREAD BLOCK holds it). */
export class DeltaFollower {
  readonly #r: Redis;
  readonly #stream: string;
  readonly #target: ApplyTarget;
  readonly #log: Logger;
  #running = false;
  #loop: Promise<void> = Promise.resolve();
  lastId = '0';
  /** Messages and ops applied, messages refused as malformed. */
  messages = 0;
  ops = 0;
  malformed = 0;
  readonly peerInFlight = new Map<string, number>();

  constructor(r: Redis, stream: string, target: ApplyTarget, log: Logger) {
    this.#r = r;
    this.#stream = stream;
    this.#target = target;
    this.#log = log;
  }

  get running(): boolean {
    return this.#running;
  }

  start(): void {
    if (this.#running) return;
    this.#running = true;
    this.#loop = this.#run();
  }

  /** Stops following (after the read in progress) and applies what is already in the stream. */
  async stop(): Promise<void> {
    this.#running = false;
    await this.#loop;
    try {
      while ((await this.#read(0)) > 0);
    } catch (err) {
      this.#log.debug({ err }, 'high availability: catching up with the delta stream failed');
    }
  }

  async #run(): Promise<void> {
    while (this.#running) {
      try {
        await this.#read(250);
      } catch (err) {
        this.#log.debug({ err }, 'high availability: reading the delta stream failed');
        await new Promise((r) => setTimeout(r, 250));
      }
    }
  }

  /** One XREAD (blocking up to `block` ms when > 0); returns the entries read. */
  async #read(block: number): Promise<number> {
    const args: (string | number)[] = ['COUNT', 256];
    if (block > 0) args.push('BLOCK', block);
    args.push('STREAMS', this.#stream, this.lastId);
    const res = (await this.#r.callBuffer('XREAD', ...args)) as [Buffer, [Buffer, Buffer[]][]][] | null;
    if (res === null) return 0;
    let n = 0;
    for (const [, entries] of res) {
      for (const [id, fields] of entries) {
        this.lastId = id.toString();
        n++;
        let data: Buffer | null = null;
        for (let k = 0; k + 1 < fields.length; k += 2) if (fields[k].toString() === 'd') data = fields[k + 1];
        try {
          if (data === null) throw new Error('no d field');
          this.ops += applyDelta(data, this.#target, this.peerInFlight);
          this.messages++;
        } catch (err) {
          this.malformed++;
          this.#log.warn({ err, id: this.lastId }, 'high availability: skipped a malformed delta');
        }
      }
    }
    return n;
  }

  /** Follows from the stream's current end (a router that just stepped down has everything before it). */
  async fromEnd(): Promise<void> {
    try {
      const last = (await this.#r.call('XREVRANGE', this.#stream, '+', '-', 'COUNT', '1')) as [string, unknown][];
      this.lastId = last.length > 0 ? last[0][0] : '0';
    } catch {
      this.lastId = '$';
    }
  }
}
