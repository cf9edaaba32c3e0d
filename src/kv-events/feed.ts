// The KV-event feed: every engine's stream (subscriber.ts) into one precise
// prefix index. Received batches wait in their stream's bounded queue; a drain
// (scheduled with setImmediate, so it runs between requests, never inside
// one) decodes up to `maxBatchesPerDrain` of them with msgpackr into flat
// typed arrays and applies them with ONE native call (PrefixIndex.applyEvents),
// then yields to the loop again if more are waiting. A stream's health decides
// whether the scheduler trusts this index for that engine. See docs/kv-events.md.
import { PrefixIndex } from '../../bindings/index.js';
import { Histogram } from '../metrics/histogram.js';
import { EventBatchEncoder, KvDecodeError, type DecodeCounts } from './decode.js';
import { KvEventStream, type QueuedBatch } from './subscriber.js';

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

export interface KvFeedOptions {
  /** Tokens per engine KV block (vLLM --block-size). */
  blockTokens: number;
  maxQueuedBatches?: number;
  maxBatchesPerDrain?: number;
  replayTimeoutMs?: number;
}

/** Bounds of the event-to-index lag histogram, seconds. */
export const LAG_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1];

interface Feed {
  ep: KvFeedEndpoint;
  stream: KvEventStream;
  holders: number[];
}

export class KvEventFeed implements DecodeCounts {
  readonly index: PrefixIndex;
  readonly lag = new Histogram(LAG_BUCKETS);
  /** [stored, removed, orphans, unknown] blocks applied by the native index. */
  readonly totals = new Float64Array(4);
  unknownEvents = 0;
  badEvents = 0;
  blockSizeMismatch = 0;
  droppedRanks = 0;
  drains = 0;
  readonly #o: Required<KvFeedOptions>;
  readonly #enc: EventBatchEncoder;
  readonly #feeds: Feed[] = [];
  readonly #byId: (Feed | undefined)[] = [];
  readonly #ready = new Set<Feed>();
  #scheduled = false;
  readonly #seeds = new Map<string, readonly [number, number]>();
  #current: Feed | null = null;
  readonly #holder = (rank: number | null): number => this.#holderOf(rank);
  readonly #seed = (lora: string | null): readonly [number, number] => this.#seedOf(lora);
  #closed = false;

  constructor(index: PrefixIndex, o: KvFeedOptions) {
    if (index.blockSize !== o.blockTokens * 4) throw new RangeError(`the precise index's blockSize must be blockTokens × 4 bytes (${o.blockTokens * 4}), got ${index.blockSize}`);
    this.index = index;
    this.#o = { maxQueuedBatches: 4096, maxBatchesPerDrain: 256, replayTimeoutMs: 1000, ...o };
    this.#enc = new EventBatchEncoder(o.blockTokens);
  }

  /** Subscribes to one engine. */
  add(ep: KvFeedEndpoint): KvEventStream {
    const feed: Feed = {
      ep,
      holders: [ep.id, ...Object.values(ep.ranks ?? {}).filter((id) => id !== ep.id)],
      stream: null as unknown as KvEventStream,
    };
    feed.stream = new KvEventStream(
      {
        endpoint: ep.endpoint,
        replayEndpoint: ep.replayEndpoint ?? null,
        topic: ep.topic ?? '',
        maxQueued: this.#o.maxQueuedBatches,
        replayTimeoutMs: this.#o.replayTimeoutMs,
      },
      () => this.#wake(feed),
    );
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

  get streams(): readonly { name: string; stream: KvEventStream }[] {
    return this.#feeds.map((f) => ({ name: f.ep.name, stream: f.stream }));
  }

  close(): void {
    this.#closed = true;
    for (const f of this.#feeds) f.stream.close();
  }

  #wake(f: Feed): void {
    this.#ready.add(f);
    if (!this.#scheduled) {
      this.#scheduled = true;
      setImmediate(() => this.drain());
    }
  }

  /** Decodes and applies what the streams queued (bounded per call; reschedules itself for the rest). */
  drain(): void {
    this.#scheduled = false;
    if (this.#closed) return;
    const enc = this.#enc;
    const max = this.#o.maxBatchesPerDrain;
    let budget = max;
    const now = performance.now();
    for (const f of this.#ready) {
      this.#ready.delete(f);
      this.#current = f;
      const items = f.stream.take(budget);
      for (const item of items) {
        if (item === 'clear') {
          for (const h of f.holders) enc.clear(h);
          continue;
        }
        budget--;
        this.#decodeOne(f, item, now);
      }
      if (f.stream.queued > 0) this.#ready.add(f);
      else f.stream.drained();
      if (budget <= 0) break;
    }
    this.#current = null;
    if (enc.nOps > 0) {
      this.index.applyEvents(enc.ops, enc.nOps, enc.words, enc.tokens, this.totals);
      enc.reset();
    }
    this.drains++;
    if (this.#ready.size > 0 && !this.#scheduled) {
      this.#scheduled = true;
      setImmediate(() => this.drain());
    }
  }

  #decodeOne(f: Feed, b: QueuedBatch, now: number): void {
    try {
      this.#enc.add(b.payload, this.#holder, this.#seed, this);
      f.stream.decoded();
      this.lag.observe(Math.max(0, now - b.at) / 1000);
    } catch (err) {
      if (!(err instanceof KvDecodeError)) throw err;
      f.stream.decodeFailed();
    }
  }

  #holderOf(rank: number | null): number {
    const ep = this.#current!.ep;
    if (rank === null || (rank === 0 && ep.ranks?.[0] === undefined)) return ep.id;
    const h = ep.ranks?.[rank];
    if (h === undefined) {
      this.droppedRanks++;
      return -1;
    }
    return h;
  }

  #seedOf(lora: string | null): readonly [number, number] {
    const name = lora ?? this.#current!.ep.model;
    let s = this.#seeds.get(name);
    if (s === undefined) {
      const v = PrefixIndex.seedFor(name);
      s = [Number(v >> 32n), Number(v & 0xffffffffn)] as const;
      if (this.#seeds.size < 65536) this.#seeds.set(name, s);
    }
    return s;
  }
}
