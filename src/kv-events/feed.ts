// The KV-event feed: every engine's stream (subscriber.ts) into one precise
// prefix index. Received batches wait in their stream's bounded queue; a drain
// copies up to `maxBatchesPerDrain` raw payloads into one buffer and hands
// them, with the clears queued between them, to ONE native call
// (PrefixIndex.applyPayloads) that decodes the msgpack and applies the events;
// then it yields to the loop again if more are waiting. The first few drains
// of a loop turn run as a microtask right after the receive (between
// callbacks, never inside a request), so a batch does not wait behind the
// rest of the turn's request work; past that the drains of the turn go to
// setImmediate (bulk, and a flood cannot hold the loop). A stream's health
// decides whether the scheduler trusts this index for that engine. See
// docs/kv-events.md.
import { APPLY_STATUS, PAYLOAD_TOTALS as T, PAYLOAD_TOTALS_LENGTH, PrefixIndex } from '../../bindings/index.js';
import { Histogram } from '../metrics/histogram.js';
import type { DecodeCounts } from './decode.js';
import { KvEventStream, type QueuedBatch } from './subscriber.js';

const ITEM_WORDS = 8;
const ITEM_PAYLOAD = 1;
const ITEM_CLEAR = 2;

export interface KvFeedEndpoint {
  /** The endpoint's id in the index (the scheduler's endpoint id). */
  id: number;
  name: string;
  /** The engine's PUB address. */
  endpoint: string;
  replayEndpoint?: string | null;
  topic?: string;
  /** The base model's name (the chain seed of blocks without a LoRA adapter). */
  model: string;
  /** Data-parallel rank → index id of the holder (each rank holds its own blocks); absent ranks other than 0 are dropped. */
  ranks?: Readonly<Record<number, number>>;
}

/** The largest data-parallel rank a feed maps (ranks above are dropped). */
export const MAX_DP_RANK = 1023;

export interface KvFeedOptions {
  /** Tokens per engine KV block (vLLM --block-size). */
  blockTokens: number;
  maxQueuedBatches?: number;
  maxBatchesPerDrain?: number;
  replayTimeoutMs?: number;
  /** Engine block hashes remembered per endpoint (PrefixIndex.setEventMapLimit; default 1 048 576). */
  eventMapLimit?: number;
  /**
   * Drains per loop turn run as a microtask right after a receive (default 8; 0: every drain waits for
   * setImmediate, i.e. behind the rest of the turn's I/O callbacks). The turn's later drains go to setImmediate.
   */
  inlineDrainsPerTurn?: number;
}

/** Bounds of the event-to-index lag histogram, seconds. */
export const LAG_BUCKETS = [0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.006, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.05, 0.1, 0.25, 1];

interface Feed {
  ep: KvFeedEndpoint;
  stream: KvEventStream;
  holders: number[];
  /** This feed's rank table in #ranks: [offset, length]. */
  rankOff: number;
  rankLen: number;
  seedHi: number;
  seedLo: number;
}

export class KvEventFeed implements DecodeCounts {
  readonly index: PrefixIndex;
  readonly lag = new Histogram(LAG_BUCKETS);
  /** applyPayloads' totals (PAYLOAD_TOTALS): blocks stored, removed, orphans, …, batches. */
  readonly totals = new Float64Array(PAYLOAD_TOTALS_LENGTH);
  drains = 0;
  /** Precise scoring's speculative window, ms (set by the router from `prefix.speculativeMs`; 0 = off). */
  speculativeMs = 0;
  readonly #o: Required<KvFeedOptions>;
  readonly #feeds: Feed[] = [];
  readonly #byId: (Feed | undefined)[] = [];
  readonly #ready = new Set<Feed>();
  #scheduled = false;
  #closed = false;
  /** Microtask drains in this loop turn, and whether the setImmediate that resets the count is armed. */
  #inline = 0;
  #resetArmed = false;
  readonly #drainFn = () => this.drain();
  readonly #resetFn = () => {
    this.#inline = 0;
    this.#resetArmed = false;
  };
  /** Drains that ran as a microtask right after a receive (the rest ran from setImmediate). */
  inlineDrains = 0;
  /**
   * Called with each index id of an engine whose publisher went away or restarted at seq 0 (it may have
   * lost its cache). The router clears that endpoint's approximate entries too, since the approximate
   * mode scores the endpoint while its stream is down and its record is as stale as the events'.
   */
  onEngineReset: ((id: number) => void) | null = null;
  /** Called when an engine's stream connects or loses its publisher (the router's log); null: none. */
  onConnection: ((name: string, endpoint: string, connected: boolean) => void) | null = null;
  /** Engine resets seen (disconnects and restarts), over all streams. */
  engineResets = 0;
  // one drain's input to applyPayloads, reused
  #data = new Uint8Array(1 << 20);
  #items = new Uint32Array(ITEM_WORDS * 512);
  #status = new Uint8Array(512);
  #ranks = new Int32Array(0);
  #taken: (QueuedBatch | null)[] = [];
  #takenFeed: Feed[] = [];

  constructor(index: PrefixIndex, o: KvFeedOptions) {
    if (index.blockSize !== o.blockTokens * 4) throw new RangeError(`the precise index's blockSize must be blockTokens × 4 bytes (${o.blockTokens * 4}), got ${index.blockSize}`);
    this.index = index;
    this.#o = { maxQueuedBatches: 4096, maxBatchesPerDrain: 256, replayTimeoutMs: 1000, eventMapLimit: 1 << 20, inlineDrainsPerTurn: 8, ...o };
    index.setEventMapLimit(this.#o.eventMapLimit);
  }

  get unknownEvents(): number {
    return this.totals[T.unknownEvents]!;
  }
  get badEvents(): number {
    return this.totals[T.badEvents]!;
  }
  get badHashes(): number {
    return this.totals[T.badHashes]!;
  }
  get blockSizeMismatch(): number {
    return this.totals[T.blockSizeMismatch]!;
  }
  get droppedRanks(): number {
    return this.totals[T.droppedRanks]!;
  }

  /** Subscribes to one engine. */
  add(ep: KvFeedEndpoint): KvEventStream {
    const ranks = ep.ranks ?? {};
    for (const id of [ep.id, ...Object.values(ranks)]) {
      // checked here, so the drain's native call never meets an id out of range
      if (!Number.isInteger(id) || id < 0 || id >= this.index.maxEndpoints) throw new RangeError(`${ep.name}: index ids must be integers in [0, ${this.index.maxEndpoints}), got ${id}`);
    }
    let rankLen = 1;
    for (const k of Object.keys(ranks)) {
      const r = Number(k);
      if (!Number.isInteger(r) || r < 0 || r > MAX_DP_RANK) throw new RangeError(`${ep.name}: data-parallel ranks must be integers in [0, ${MAX_DP_RANK}], got ${k}`);
      rankLen = Math.max(rankLen, r + 1);
    }
    const seed = PrefixIndex.seedFor(ep.model);
    const feed: Feed = {
      ep,
      holders: [ep.id, ...Object.values(ranks).filter((id) => id !== ep.id)],
      stream: null as unknown as KvEventStream,
      rankOff: this.#ranks.length,
      rankLen,
      seedHi: Number(seed >> 32n),
      seedLo: Number(seed & 0xffffffffn),
    };
    // rank table: rank 0 without a holder of its own is the endpoint itself; other unmapped ranks are dropped
    const table = new Int32Array(this.#ranks.length + rankLen);
    table.set(this.#ranks);
    for (let r = 0; r < rankLen; r++) table[feed.rankOff + r] = ranks[r] ?? (r === 0 ? ep.id : -1);
    this.#ranks = table;
    feed.stream = new KvEventStream(
      {
        endpoint: ep.endpoint,
        replayEndpoint: ep.replayEndpoint ?? null,
        topic: ep.topic ?? '',
        maxQueued: this.#o.maxQueuedBatches,
        replayTimeoutMs: this.#o.replayTimeoutMs,
      },
      () => this.#wake(feed),
      () => {
        this.engineResets++;
        const cb = this.onEngineReset;
        if (cb !== null) for (const h of feed.holders) cb(h);
      },
    );
    feed.stream.onConnection = (connected) => this.onConnection?.(ep.name, ep.endpoint, connected);
    this.#feeds.push(feed);
    for (const h of feed.holders) this.#byId[h] = feed;
    if (!this.#closed) feed.stream.start();
    return feed.stream;
  }

  /** Whether the index's entries for endpoint `id` come from a healthy stream (else score it approximately). */
  healthy(id: number): boolean {
    const f = this.#byId[id];
    return f !== undefined && f.stream.healthy;
  }

  /** Whether endpoint `id` is fed by events at all. */
  has(id: number): boolean {
    return this.#byId[id] !== undefined;
  }

  /** Every index id fed by a stream (an endpoint, or the endpoint of one of its data-parallel ranks). */
  get holders(): readonly number[] {
    return this.#feeds.flatMap((f) => f.holders);
  }

  get streams(): readonly { name: string; stream: KvEventStream }[] {
    return this.#feeds.map((f) => ({ name: f.ep.name, stream: f.stream }));
  }

  close(): void {
    this.#closed = true;
    for (const f of this.#feeds) f.stream.close();
  }

  #wake(f: Feed): void {
    this.#ready.add(f);
    if (this.#scheduled) return;
    this.#scheduled = true;
    if (this.#inline < this.#o.inlineDrainsPerTurn) {
      // right after this receive's callback, before the turn's other callbacks (requests, responses)
      this.#inline++;
      this.inlineDrains++;
      queueMicrotask(this.#drainFn);
      if (!this.#resetArmed) {
        this.#resetArmed = true;
        setImmediate(this.#resetFn);
      }
    } else setImmediate(this.#drainFn);
  }

  /** Decodes and applies what the streams queued (bounded per call; reschedules itself for the rest). */
  drain(): void {
    this.#scheduled = false;
    if (this.#closed) return;
    let budget = this.#o.maxBatchesPerDrain;
    let n = 0;
    let bytes = 0;
    for (const f of this.#ready) {
      this.#ready.delete(f);
      const items = f.stream.take(budget);
      for (const item of items) {
        const b = item === 'clear' ? null : item;
        if (b !== null) {
          budget--;
          if (bytes + b.payload.length > this.#data.length) this.#growData(bytes + b.payload.length);
          this.#data.set(b.payload, bytes);
        }
        if ((n + 1) * ITEM_WORDS > this.#items.length) this.#growItems();
        const it = this.#items;
        const o = n * ITEM_WORDS;
        it[o] = b === null ? ITEM_CLEAR : ITEM_PAYLOAD;
        it[o + 1] = bytes;
        if (b !== null) bytes += b.payload.length;
        it[o + 2] = bytes;
        it[o + 3] = f.ep.id;
        it[o + 4] = f.rankOff;
        it[o + 5] = f.rankLen;
        it[o + 6] = f.seedHi;
        it[o + 7] = f.seedLo;
        this.#taken[n] = b;
        this.#takenFeed[n] = f;
        n++;
      }
      if (f.stream.queued > 0) this.#ready.add(f);
      else f.stream.drained();
      if (budget <= 0) break;
    }
    if (n > 0) {
      this.index.applyPayloads(this.#data, this.#items, n, this.#ranks, this.#status, this.totals);
      const now = performance.now();
      const status = this.#status;
      for (let i = 0; i < n; i++) {
        const b = this.#taken[i];
        const f = this.#takenFeed[i]!;
        this.#taken[i] = null;
        if (b === null) continue;
        if (status[i] === APPLY_STATUS.malformed) f.stream.decodeFailed(true);
        else {
          f.stream.decoded();
          this.lag.observe(Math.max(0, now - b.at) / 1000);
        }
      }
    }
    this.drains++;
    if (this.#ready.size > 0 && !this.#scheduled) {
      // more than one drain's budget waiting: yield to the loop first
      this.#scheduled = true;
      setImmediate(this.#drainFn);
    }
  }

  #growData(need: number): void {
    const next = new Uint8Array(Math.max(need, this.#data.length * 2));
    next.set(this.#data);
    this.#data = next;
  }

  #growItems(): void {
    const next = new Uint32Array(this.#items.length * 2);
    next.set(this.#items);
    this.#items = next;
    const st = new Uint8Array(next.length / ITEM_WORDS);
    this.#status = st;
  }
}
