// The simulator's KV-cache event publisher, in vLLM's wire format (see
// shared/reference/PROTOCOLS.md, "KV-cache events", and docs/kv-events.md):
//
//   ZMQ PUB, multipart [topic, seq (8 bytes big-endian, from 0, +1 per batch), msgpack(batch)]
//   batch = [ts: float, events: [...], data_parallel_rank: int | null]
//   events: BlockStored / BlockRemoved / AllBlocksCleared, as arrays (tag first, vLLM's
//   msgspec array_like layout) or as maps with a "type" key (fields equal to their default omitted)
//
// Replay: a ROUTER socket at replay_endpoint; a DEALER sends ["", start seq (8 bytes BE)] (or just the
// seq) and gets every buffered batch with seq >= start as [.., seq, payload], then [.., -1, ""].
//
// Events of one event-loop turn go out as one batch (vLLM publishes one batch per engine step).
// The configuration mirrors vLLM's --kv-events-config JSON; `layout`, `block_hash_format` and
// `data_parallel_rank` are the simulator's own additions.
import { Publisher, Router } from 'zeromq';
import { MsgpackWriter } from './msgpack-write.js';

export interface KvEventsConfig {
  enable_kv_cache_events?: boolean;
  /** "zmq" publishes; "null" keeps events off. */
  publisher?: 'zmq' | 'null';
  /** Where the PUB socket binds, e.g. "tcp://*:5557"; "tcp://127.0.0.1:*" picks a free port. */
  endpoint?: string;
  /** Where the replay ROUTER binds (null: no replay). */
  replay_endpoint?: string | null;
  /** Batches kept for replay. */
  buffer_steps?: number;
  topic?: string;
  /** Event layout: "array" (older vLLM) or "map" (newer vLLM). */
  layout?: 'array' | 'map';
  /** Block hashes as uint64 integers or as 32-byte digests (the hash in the last 8 bytes, big-endian). */
  block_hash_format?: 'int' | 'bytes';
  /** The data-parallel rank the batches carry (null: none). */
  data_parallel_rank?: number | null;
}

export type ResolvedKvEventsConfig = Required<KvEventsConfig>;

export const KV_EVENTS_DEFAULTS: ResolvedKvEventsConfig = Object.freeze({
  enable_kv_cache_events: false,
  publisher: 'null',
  endpoint: 'tcp://127.0.0.1:*',
  replay_endpoint: null,
  buffer_steps: 10000,
  topic: '',
  layout: 'array',
  block_hash_format: 'int',
  data_parallel_rank: null,
}) as ResolvedKvEventsConfig;

export type Medium = 'GPU' | 'CPU';

/** What the KV cache reports (kv-cache.ts calls it; the publisher implements it). */
export interface KvEventSink {
  stored(hashes: readonly number[], parent: number | null, tokens: Uint32Array, loraId: number | null, loraName: string | null, medium: Medium): void;
  removed(hashes: readonly number[], medium: Medium): void;
  cleared(): void;
}

/** Checks a --kv-events-config value; returns a message naming the bad field, or null. */
export function kvEventsConfigProblem(c: unknown): string | null {
  if (typeof c !== 'object' || c === null || Array.isArray(c)) return 'expected a JSON object';
  const o = c as Record<string, unknown>;
  const known = Object.keys(KV_EVENTS_DEFAULTS).concat(['hwm', 'max_queue_size']);
  for (const k of Object.keys(o)) if (!known.includes(k)) return `unknown field ${JSON.stringify(k)}`;
  if (o.enable_kv_cache_events !== undefined && typeof o.enable_kv_cache_events !== 'boolean') return 'enable_kv_cache_events: expected a boolean';
  if (o.publisher !== undefined && o.publisher !== 'zmq' && o.publisher !== 'null') return 'publisher: expected "zmq" or "null"';
  if (o.endpoint !== undefined && (typeof o.endpoint !== 'string' || !/^(tcp|ipc|inproc):\/\/./.test(o.endpoint)))
    return 'endpoint: expected a ZMQ address such as "tcp://*:5557"';
  if (o.replay_endpoint !== undefined && o.replay_endpoint !== null && (typeof o.replay_endpoint !== 'string' || !/^(tcp|ipc|inproc):\/\/./.test(o.replay_endpoint)))
    return 'replay_endpoint: expected a ZMQ address or null';
  if (o.buffer_steps !== undefined && (!Number.isInteger(o.buffer_steps) || (o.buffer_steps as number) < 1)) return 'buffer_steps: expected an integer >= 1';
  if (o.topic !== undefined && typeof o.topic !== 'string') return 'topic: expected a string';
  if (o.layout !== undefined && o.layout !== 'array' && o.layout !== 'map') return 'layout: expected "array" or "map"';
  if (o.block_hash_format !== undefined && o.block_hash_format !== 'int' && o.block_hash_format !== 'bytes') return 'block_hash_format: expected "int" or "bytes"';
  const dp = o.data_parallel_rank;
  if (dp !== undefined && dp !== null && (!Number.isInteger(dp) || (dp as number) < 0)) return 'data_parallel_rank: expected an integer >= 0 or null';
  return null;
}

export function resolveKvEventsConfig(c: KvEventsConfig | null | undefined): ResolvedKvEventsConfig | null {
  if (!c || !c.enable_kv_cache_events || c.publisher === 'null' || c.publisher === undefined) return null;
  return { ...KV_EVENTS_DEFAULTS, ...c } as ResolvedKvEventsConfig;
}

/** A fixed-port tcp endpoint moved by `offset` (engine i of a fleet); wildcard ports stay. */
export function offsetEndpoint(ep: string, offset: number): string {
  if (offset === 0) return ep;
  const m = /^(tcp:\/\/.*):(\d+)$/.exec(ep);
  return m ? `${m[1]}:${Number(m[2]) + offset}` : ep;
}

const END_SEQ = Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);

function seqBytes(seq: number): Buffer {
  const b = Buffer.allocUnsafe(8);
  b.writeUInt32BE(Math.floor(seq / 0x100000000), 0);
  b.writeUInt32BE(seq >>> 0, 4);
  return b;
}

export class KvEventPublisher implements KvEventSink {
  readonly config: ResolvedKvEventsConfig;
  #pub: Publisher | null = null;
  #router: Router | null = null;
  #endpoint: string;
  #replayEndpoint: string | null;
  #seq = 0;
  readonly #events = new MsgpackWriter();
  readonly #batch = new MsgpackWriter();
  #count = 0;
  #scheduled = false;
  readonly #ring: { seq: number; payload: Buffer }[] = [];
  readonly #outbox: Buffer[][] = [];
  #pumping = false;
  #closed = false;
  readonly #topic: Buffer;
  readonly #digest = Buffer.alloc(32);
  /** Batches and block events published (tests and benchmarks read them). */
  batches = 0;
  blocksStored = 0;
  blocksRemoved = 0;

  constructor(config: ResolvedKvEventsConfig, fleetIndex = 0) {
    this.config = config;
    this.#endpoint = offsetEndpoint(config.endpoint, fleetIndex);
    this.#replayEndpoint = config.replay_endpoint === null ? null : offsetEndpoint(config.replay_endpoint, fleetIndex);
    this.#topic = Buffer.from(config.topic, 'utf8');
  }

  /** The bound PUB address (wildcard ports resolved). */
  get endpoint(): string {
    return this.#endpoint;
  }
  get replayEndpoint(): string | null {
    return this.#replayEndpoint;
  }
  get seq(): number {
    return this.#seq;
  }

  async open(): Promise<void> {
    const pub = new Publisher({ linger: 0, sendHighWaterMark: 100000 });
    await bindRetry(pub, this.#endpoint);
    this.#endpoint = pub.lastEndpoint ?? this.#endpoint;
    this.#pub = pub;
    if (this.#replayEndpoint !== null) {
      const router = new Router({ linger: 0 });
      await bindRetry(router, this.#replayEndpoint);
      this.#replayEndpoint = router.lastEndpoint ?? this.#replayEndpoint;
      this.#router = router;
      void this.#serveReplay(router);
    }
  }

  /** Closes the sockets and opens them again at the same addresses with seq 0 and an empty buffer (an engine restart). */
  async restart(): Promise<void> {
    this.#closeSockets();
    this.#seq = 0;
    this.#ring.length = 0;
    this.#outbox.length = 0;
    this.#events.reset();
    this.#count = 0;
    await this.open();
  }

  /** The payloads of the batches kept for replay, oldest first (benchmarks read them). */
  buffered(): Buffer[] {
    return this.#ring.map((r) => r.payload);
  }

  close(): void {
    this.#closed = true;
    this.#closeSockets();
  }

  #closeSockets(): void {
    this.#pub?.close();
    this.#router?.close();
    this.#pub = null;
    this.#router = null;
  }

  // ---- KvEventSink

  stored(hashes: readonly number[], parent: number | null, tokens: Uint32Array, loraId: number | null, loraName: string | null, medium: Medium): void {
    const w = this.#events;
    const map = this.config.layout === 'map';
    if (map) {
      const n = 4 + (parent !== null ? 1 : 0) + (loraId !== null ? 2 : 0) + (medium !== 'GPU' ? 1 : 0);
      w.map(n);
      w.str('type');
      w.str('BlockStored');
      w.str('block_hashes');
    } else {
      w.array(loraName !== null ? 8 : 7);
      w.str('BlockStored');
    }
    this.#hashes(hashes);
    if (map) {
      if (parent !== null) {
        w.str('parent_block_hash');
        this.#hash(parent);
      }
      w.str('token_ids');
    } else if (parent === null) w.nil();
    else this.#hash(parent);
    w.array(tokens.length);
    for (let i = 0; i < tokens.length; i++) w.int(tokens[i]!);
    if (map) w.str('block_size');
    w.int(tokens.length / hashes.length);
    if (map) {
      if (loraId !== null) {
        w.str('lora_id');
        w.int(loraId);
        w.str('lora_name');
        w.str(loraName ?? '');
      }
      if (medium !== 'GPU') {
        w.str('medium');
        w.str(medium);
      }
    } else {
      if (loraId === null) w.nil();
      else w.int(loraId);
      w.str(medium);
      if (loraName !== null) w.str(loraName);
    }
    this.blocksStored += hashes.length;
    this.#queued();
  }

  removed(hashes: readonly number[], medium: Medium): void {
    const w = this.#events;
    if (this.config.layout === 'map') {
      w.map(medium !== 'GPU' ? 3 : 2);
      w.str('type');
      w.str('BlockRemoved');
      w.str('block_hashes');
      this.#hashes(hashes);
      if (medium !== 'GPU') {
        w.str('medium');
        w.str(medium);
      }
    } else {
      w.array(3);
      w.str('BlockRemoved');
      this.#hashes(hashes);
      w.str(medium);
    }
    this.blocksRemoved += hashes.length;
    this.#queued();
  }

  cleared(): void {
    const w = this.#events;
    if (this.config.layout === 'map') {
      w.map(1);
      w.str('type');
    } else w.array(1);
    w.str('AllBlocksCleared');
    this.#queued();
  }

  #hashes(hashes: readonly number[]): void {
    this.#events.array(hashes.length);
    for (let i = 0; i < hashes.length; i++) this.#hash(hashes[i]!);
  }

  #hash(h: number): void {
    if (this.config.block_hash_format === 'int') {
      this.#events.int(h);
      return;
    }
    // a 32-byte digest whose last 8 bytes (big-endian) are the hash; the rest is filler derived from it
    const d = this.#digest;
    for (let i = 0; i < 24; i++) d[i] = (h * (i + 7)) & 0xff;
    d.writeUInt32BE(Math.floor(h / 0x100000000), 24);
    d.writeUInt32BE(h >>> 0, 28);
    this.#events.bin(d);
  }

  #queued(): void {
    this.#count++;
    if (!this.#scheduled) {
      this.#scheduled = true;
      setImmediate(() => this.flush());
    }
  }

  /** Publishes the events queued so far as one batch. */
  flush(): void {
    this.#scheduled = false;
    if (this.#count === 0 || this.#closed) return;
    const b = this.#batch;
    b.reset();
    b.array(3);
    b.float(Date.now() / 1000);
    b.array(this.#count);
    b.raw(this.#events.view());
    const dp = this.config.data_parallel_rank;
    if (dp === null) b.nil();
    else b.int(dp);
    this.#events.reset();
    this.#count = 0;
    const payload = b.take();
    const seq = this.#seq++;
    this.#ring.push({ seq, payload });
    if (this.#ring.length > this.config.buffer_steps) this.#ring.shift();
    this.batches++;
    this.#outbox.push([this.#topic, seqBytes(seq), payload]);
    void this.#pump();
  }

  async #pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      while (this.#outbox.length > 0 && this.#pub !== null) {
        const msg = this.#outbox.shift()!;
        try {
          await this.#pub.send(msg);
        } catch {
          // closed or restarting: the batch stays in the replay buffer
        }
      }
    } finally {
      this.#pumping = false;
    }
  }

  async #serveReplay(router: Router): Promise<void> {
    try {
      for await (const frames of router) {
        if (frames.length < 2) continue;
        const id = frames[0]!;
        const seqFrame = frames[frames.length - 1]!;
        const delim = frames.length >= 3 ? [Buffer.alloc(0)] : [];
        if (seqFrame.length !== 8) {
          await router.send([id, ...delim, END_SEQ, Buffer.alloc(0)]);
          continue;
        }
        const start = seqFrame.readUInt32BE(0) * 0x100000000 + seqFrame.readUInt32BE(4);
        for (const r of this.#ring) if (r.seq >= start) await router.send([id, ...delim, seqBytes(r.seq), r.payload]);
        await router.send([id, ...delim, END_SEQ, Buffer.alloc(0)]);
      }
    } catch {
      // socket closed
    }
  }
}

async function bindRetry(sock: Publisher | Router, ep: string): Promise<void> {
  for (let i = 0; ; i++) {
    try {
      await sock.bind(ep);
      return;
    } catch (err) {
      // a restart re-binds an address whose previous socket is still closing
      if (i >= 50) throw err;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}
