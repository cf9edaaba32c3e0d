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
  /** This stream's largest accepted ZMQ frame (default: the feed's maxMessageBytes). */
  maxMessageBytes?: number;
  /** This stream's queue bound in payload bytes (default: the feed's maxQueuedBytes). */
  maxQueuedBytes?: number;
  /** Where its address is configured, as a field path (pools[i].endpoints[j].kvEvents.endpoint), for messages. */
  where?: string;
}

/** Default bound of one KV-event frame, bytes (a publisher that sends a bigger one is disconnected). */
export const DEFAULT_MAX_MESSAGE_BYTES = 64 << 20;
/** Default bound of one stream's queue, payload bytes. */
export const DEFAULT_MAX_QUEUED_BYTES = 64 << 20;

/** The largest data-parallel rank a feed maps (ranks above are dropped). */
export const MAX_DP_RANK = 1023;

export interface KvFeedOptions {
  /** Tokens per engine KV block (vLLM --block-size). */
  blockTokens: number;
  maxQueuedBatches?: number;
  /** Payload bytes a stream holds between drains before the oldest batches are dropped (default 64 MiB). */
  maxQueuedBytes?: number;
  /** The largest KV-event frame accepted, bytes (ZMQ_MAXMSGSIZE; default 64 MiB). */
  maxMessageBytes?: number;
  /** The drain's reusable payload buffer, bytes (default 4 MiB; a bigger payload is applied alone from its own buffer). */
  scratchBytes?: number;
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
  /** The last drain that took from this feed (a failed drain tells those streams they lost batches). */
  drainId: number;
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
  /** Called once per outage when an engine's publisher cannot be reached (KvEventStream.onUnreachable); null: none. */
  onUnreachable: ((name: string, endpoint: string, where: string, reason: string) => void) | null = null;
  /** Engine resets seen (disconnects and restarts), over all streams. */
  engineResets = 0;
  /** Drains that threw (their batches were lost: the streams they came from were cleared and marked unhealthy). */
  drainErrors = 0;
  /** Exceptions thrown by onEngineReset (caught; the feed went on). */
  resetHookErrors = 0;
  // one native call's input to applyPayloads: fixed buffers, never grown (a payload larger than the scratch
  // goes alone, straight from its own buffer), so no burst leaves memory behind
  readonly #data: Uint8Array;
  readonly #itemCap: number;
  readonly #items: Uint32Array;
  readonly #status: Uint8Array;
  #ranks = new Int32Array(0);
  readonly #taken: (QueuedBatch | null)[] = [];
  readonly #takenFeed: (Feed | null)[] = [];
  /** Items and scratch bytes of the native call being built. */
  #n = 0;
  #bytes = 0;
  #drainId = 0;

  constructor(index: PrefixIndex, o: KvFeedOptions) {
    if (index.blockSize !== o.blockTokens * 4) throw new RangeError(`the precise index's blockSize must be blockTokens × 4 bytes (${o.blockTokens * 4}), got ${index.blockSize}`);
    this.index = index;
    this.#o = {
      maxQueuedBatches: 4096,
      maxQueuedBytes: DEFAULT_MAX_QUEUED_BYTES,
      maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
      scratchBytes: 4 << 20,
      maxBatchesPerDrain: 256,
      replayTimeoutMs: 1000,
      eventMapLimit: 1 << 20,
      inlineDrainsPerTurn: 8,
      ...o,
    };
    for (const k of ['maxQueuedBatches', 'maxQueuedBytes', 'maxMessageBytes', 'scratchBytes', 'maxBatchesPerDrain'] as const) {
      const v = this.#o[k];
      if (!Number.isInteger(v) || v < 1) throw new RangeError(`KvEventFeed ${k} must be an integer >= 1, got ${v}`);
    }
    this.#data = new Uint8Array(this.#o.scratchBytes);
    // a drain's items: its batches and at most one clear before each (a stream never queues two in a row), plus slack
    this.#itemCap = 2 * this.#o.maxBatchesPerDrain + 16;
    this.#items = new Uint32Array(ITEM_WORDS * this.#itemCap);
    this.#status = new Uint8Array(this.#itemCap);
    index.setEventMapLimit(this.#o.eventMapLimit);
  }

  /** Bytes of the drain's scratch buffer (fixed: scratchBytes). */
  get scratchBytes(): number {
    return this.#data.length;
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
      drainId: 0,
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
        maxQueuedBytes: ep.maxQueuedBytes ?? this.#o.maxQueuedBytes,
        maxMessageBytes: ep.maxMessageBytes ?? this.#o.maxMessageBytes,
        replayTimeoutMs: this.#o.replayTimeoutMs,
      },
      () => this.#wake(feed),
      () => {
        this.engineResets++;
        const cb = this.onEngineReset;
        if (cb === null) return;
        for (const h of feed.holders) {
          try {
            cb(h);
          } catch {
            // the router's hook: counted, never thrown into a socket event
            this.resetHookErrors++;
          }
        }
      },
    );
    feed.stream.onConnection = (connected) => this.onConnection?.(ep.name, ep.endpoint, connected);
    feed.stream.onUnreachable = (reason) => this.onUnreachable?.(ep.name, ep.endpoint, ep.where ?? '', reason);
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

  /** Decodes and applies what the streams queued (bounded per call; reschedules itself for the rest). Never throws. */
  drain(): void {
    this.#scheduled = false;
    if (this.#closed) return;
    const id = ++this.#drainId;
    try {
      this.#drainSome(id);
    } catch {
      // a drain runs from a microtask or setImmediate: nothing may escape it (it would end the process). What
      // it had taken is lost: those engines' entries are cleared before their next batches.
      this.drainErrors++;
      for (let i = 0; i < this.#n; i++) {
        this.#taken[i] = null;
        this.#takenFeed[i] = null;
      }
      this.#n = 0;
      this.#bytes = 0;
      for (const f of this.#feeds) if (f.drainId === id) f.stream.lost();
    }
    this.drains++;
    if (this.#ready.size > 0 && !this.#scheduled) {
      // more than one drain's budget waiting: yield to the loop first
      this.#scheduled = true;
      setImmediate(this.#drainFn);
    }
  }

  #drainSome(id: number): void {
    let budget = this.#o.maxBatchesPerDrain;
    const data = this.#data;
    for (const f of this.#ready) {
      this.#ready.delete(f);
      f.drainId = id;
      const items = f.stream.take(budget);
      for (const item of items) {
        if (item === 'clear') {
          this.#item(f, null, 0);
          continue;
        }
        budget--;
        const len = item.payload.length;
        if (len > data.length) {
          // bigger than the scratch: applied alone from its own buffer (no copy, nothing grows)
          this.#flush(data);
          this.#item(f, item, len);
          this.#flush(item.payload);
          continue;
        }
        if (this.#n === this.#itemCap || this.#bytes + len > data.length) this.#flush(data);
        data.set(item.payload, this.#bytes);
        this.#item(f, item, len);
      }
      if (f.stream.queued > 0) this.#ready.add(f);
      else f.stream.drained();
      if (budget <= 0) break;
    }
    this.#flush(data);
  }

  /** Appends one item (a payload of `len` bytes at #bytes, or a clear) to the native call being built (the caller made room). */
  #item(f: Feed, b: QueuedBatch | null, len: number): void {
    if (b === null && this.#n === this.#itemCap) this.#flush(this.#data);
    const it = this.#items;
    const o = this.#n * ITEM_WORDS;
    it[o] = b === null ? ITEM_CLEAR : ITEM_PAYLOAD;
    it[o + 1] = this.#bytes;
    this.#bytes += len;
    it[o + 2] = this.#bytes;
    it[o + 3] = f.ep.id;
    it[o + 4] = f.rankOff;
    it[o + 5] = f.rankLen;
    it[o + 6] = f.seedHi;
    it[o + 7] = f.seedLo;
    this.#taken[this.#n] = b;
    this.#takenFeed[this.#n] = f;
    this.#n++;
  }

  /** One native call for the items built so far, over `data` (the scratch, or a lone big payload). */
  #flush(data: Uint8Array): void {
    const n = this.#n;
    if (n === 0) return;
    this.index.applyPayloads(data, this.#items, n, this.#ranks, this.#status, this.totals);
    this.#n = 0;
    this.#bytes = 0;
    const now = performance.now();
    const status = this.#status;
    for (let i = 0; i < n; i++) {
      const b = this.#taken[i];
      const f = this.#takenFeed[i]!;
      this.#taken[i] = null;
      this.#takenFeed[i] = null;
      if (b === null) continue;
      if (status[i] === APPLY_STATUS.malformed) f.stream.decodeFailed(true);
      else {
        f.stream.decoded();
        this.lag.observe(Math.max(0, now - b.at) / 1000);
      }
    }
  }
}
