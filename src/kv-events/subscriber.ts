// One engine's KV-event stream: a ZMQ SUB socket on the engine's publisher,
// the sequence bookkeeping (gaps → replay, else clear; a publisher that
// restarts at seq 0 → clear), a bounded queue of received batches, and the
// stream's health. Batches are decoded and applied by the KvEventFeed that
// owns this stream, in bulk (one native call per drain); this file only moves
// bytes and decides what they mean for the sequence. See docs/kv-events.md.
import { lookup } from 'node:dns';
import { isIP } from 'node:net';
import { Dealer, Subscriber } from 'zeromq';

export interface KvStreamOptions {
  /** The engine's PUB address, e.g. tcp://10.0.0.5:5557. */
  endpoint: string;
  /** The engine's replay ROUTER address (null: no replay, a gap clears the endpoint). */
  replayEndpoint: string | null;
  /** Topic prefix to subscribe to ("" = all). */
  topic: string;
  /** Batches held between drains before the oldest are dropped. */
  maxQueued: number;
  /** Payload bytes held between drains (and held back during a replay, and in one replay's answer) before the oldest are dropped. */
  maxQueuedBytes: number;
  /** The largest ZMQ frame accepted (ZMQ_MAXMSGSIZE on the SUB and replay sockets): a publisher that sends a bigger one is disconnected. */
  maxMessageBytes: number;
  /** How long a replay may take before the gap is treated as unrecoverable, ms. */
  replayTimeoutMs: number;
}

/** Why a stream is not trusted right now. */
export type StreamProblem = 'connecting' | 'disconnected' | 'decode-errors' | 'gaps' | 'overflow' | null;

/** Counters of one stream (read by the router's metrics at scrape time). */
export class KvStreamCounters {
  batches = 0;
  gaps = 0;
  replays = 0;
  replayFailures = 0;
  duplicates = 0;
  restarts = 0;
  dropped = 0;
  /** Of dropped: dropped because the queue's bytes were over maxQueuedBytes. */
  droppedBytes = 0;
  decodeErrors = 0;
  clears = 0;
  /** Times the publisher's connection went away (a frame over maxMessageBytes makes libzmq drop it). */
  disconnects = 0;
  /** New sockets opened after a disconnect (libzmq does not reconnect a connection it dropped for a protocol error). */
  resubscribes = 0;
  /** Replays whose answer went over maxQueuedBytes or maxQueued (failed: the endpoint was cleared). */
  replayOverflows = 0;
  /** Exceptions caught in a receive, disconnect or replay callback (the stream went on; the endpoint was cleared). */
  callbackErrors = 0;
}

export interface QueuedBatch {
  seq: number;
  payload: Buffer;
  /** performance.now() when it was received (the event-to-index lag starts here). */
  at: number;
}

const END_SEQ_HI = 0xffffffff;

/**
 * Messages libzmq holds for one SUB socket before it stops reading the publisher's connection (TCP then pushes
 * back and the publisher drops at its own high-water mark: a gap). The loop normally takes each message as it
 * arrives and the byte-bounded queue decides; this only matters while the loop is held.
 */
export const RECEIVE_HWM = 1000;

function readSeq(b: Buffer): number {
  if (b.length !== 8) return -1;
  const hi = b.readUInt32BE(0);
  if (hi === END_SEQ_HI && b.readUInt32BE(4) === 0xffffffff) return -2;
  // beyond 2^53 cannot happen in practice (+1 per batch); treat as malformed
  if (hi > 0x1fffff) return -1;
  return hi * 0x100000000 + b.readUInt32BE(4);
}

/** Whether replayed batches run without a hole from `from` (-1: anywhere) up to just before `live`. */
function covers(got: QueuedBatch[], from: number, live: number): boolean {
  if (live === 0) return true;
  let next = from;
  for (const b of got) {
    if (b.seq >= live) break;
    if (next !== -1 && b.seq !== next) return false;
    next = b.seq + 1;
  }
  return next === live || (from === -1 && next === -1);
}

function seqBytes(seq: number): Buffer {
  const b = Buffer.allocUnsafe(8);
  b.writeUInt32BE(Math.floor(seq / 0x100000000), 0);
  b.writeUInt32BE(seq >>> 0, 4);
  return b;
}

/**
 * The stream. `onReady` is called (once per turn at most) when batches are
 * queued; the owner then calls take() and applies what it gets, in order.
 * A `clear` marker in take()'s output means: forget what this engine was
 * believed to hold before the batches that follow.
 */
export class KvEventStream {
  readonly options: KvStreamOptions;
  readonly counters = new KvStreamCounters();
  #sub: Subscriber | null = null;
  #closed = false;
  /** Next sequence number expected (-1: nothing received yet). */
  #expected = -1;
  #queue: (QueuedBatch | 'clear')[] = [];
  #queued = 0;
  /** Payload bytes in #queue. */
  #queuedBytes = 0;
  #replaying = false;
  /** Live batches received while a replay is under way, and their payload bytes. */
  #held: QueuedBatch[] = [];
  #heldBytes = 0;
  #problem: StreamProblem = 'connecting';
  #decodeErrorsInRow = 0;
  #recentGaps: number[] = [];
  readonly #onReady: () => void;
  readonly #onReset: (() => void) | null;
  /** Socket re-creations since the last good batch (the pause before the next one doubles), and the timer. */
  #reopens = 0;
  #reopenTimer: NodeJS.Timeout | null = null;
  #notified = false;

  /**
   * `onReset` (optional) is called when the engine may have lost its cache: its publisher went away (a
   * disconnect) or came back at seq 0 (a restart).
   */
  constructor(options: KvStreamOptions, onReady: () => void, onReset: (() => void) | null = null) {
    this.options = options;
    this.#onReady = onReady;
    this.#onReset = onReset;
  }

  /** Called when the stream's socket connects (true) or loses its publisher (false): the router logs it. */
  onConnection: ((connected: boolean) => void) | null = null;
  /**
   * Called once per outage when the publisher cannot be reached (libzmq retries a connection that was
   * refused or whose name did not resolve, silently): `reason` says which. Not again until the stream has
   * connected; a publisher lost after connecting is told by onConnection(false) instead.
   */
  onUnreachable: ((reason: string) => void) | null = null;
  /** An outage already told (by onUnreachable or a disconnect); cleared when the socket connects. */
  #told = false;

  /** Whether the index's entries for this engine can be trusted (else: score it by the approximate mode). */
  get healthy(): boolean {
    return this.#problem === null;
  }
  get problem(): StreamProblem {
    return this.#problem;
  }
  get queued(): number {
    return this.#queued;
  }
  /** Payload bytes queued (at most maxQueuedBytes, or one payload). */
  get queuedBytes(): number {
    return this.#queuedBytes;
  }

  start(): void {
    this.#open();
  }

  #open(): void {
    this.#reopenTimer = null;
    if (this.#closed) return;
    const sub = new Subscriber({ linger: 0, receiveHighWaterMark: RECEIVE_HWM, maxMessageSize: this.options.maxMessageBytes });
    this.#sub = sub;
    sub.events.on('connect:retry', () => {
      if (sub !== this.#sub || this.#told || this.#closed) return;
      this.#told = true;
      void this.#whyUnreachable().then((why) => {
        // connected meanwhile (or closed): nothing to tell
        if (this.#closed || !this.#told || this.#problem === null) return;
        try {
          this.onUnreachable?.(why);
        } catch {
          this.counters.callbackErrors++;
        }
      });
    });
    sub.events.on('connect', () => {
      if (sub !== this.#sub) return;
      this.#told = false;
      if (this.#problem === 'connecting' || this.#problem === 'disconnected') this.#problem = null;
      if (!this.#closed) this.onConnection?.(true);
    });
    sub.events.on('disconnect', () => {
      // the engine went away (or sent a frame over maxMessageBytes, which makes libzmq drop it): whatever it
      // sends while we are not connected is lost, and it may come back restarted with an empty cache; forget
      // its entries, and on the next batch join again (replay from 0)
      if (this.#closed || sub !== this.#sub) return;
      this.#told = true; // the disconnect is the outage's line: the new socket's retries say nothing more
      this.counters.disconnects++;
      this.onConnection?.(false);
      this.#setProblem('disconnected');
      this.counters.clears++;
      this.#push('clear');
      if (!this.#replaying) this.#expected = -1;
      try {
        this.#onReset?.();
      } catch {
        // the owner's hook threw: never out of a socket event (it would end the process)
        this.counters.callbackErrors++;
      }
      // libzmq does not reconnect a connection it dropped for a protocol error (an oversize frame is one):
      // a new socket, after a pause that doubles while the publisher keeps getting dropped before sending
      // anything good (up to 5 s), so a hostile publisher cannot make it spin
      this.#sub = null;
      sub.close();
      const delay = Math.min(5000, 100 * 2 ** Math.min(this.#reopens, 6));
      this.#reopens++;
      this.counters.resubscribes++;
      this.#reopenTimer = setTimeout(() => this.#open(), delay);
      this.#reopenTimer.unref();
    });
    sub.connect(this.options.endpoint);
    sub.subscribe(this.options.topic);
    void this.#receive(sub);
  }

  /** Why a connection attempt failed, as far as can be told (libzmq does not say): a name that does not resolve, or nothing accepting there. */
  #whyUnreachable(): Promise<string> {
    let host = '';
    const m = /^tcp:\/\/(\[[^\]]*\]|[^:/]*):(\d+|\*)$/.exec(this.options.endpoint);
    if (m !== null) host = m[1]!.replace(/^\[|\]$/g, '');
    if (host === '' || isIP(host) !== 0 || host === '*') return Promise.resolve('nothing accepts connections there (refused or unreachable), libzmq keeps retrying');
    return new Promise((resolve) =>
      lookup(host, (err) =>
        resolve(err ? `the name ${host} does not resolve (${(err as NodeJS.ErrnoException).code ?? err.message}), libzmq keeps retrying` : 'nothing accepts connections there (refused or unreachable), libzmq keeps retrying'),
      ),
    );
  }

  close(): void {
    this.#closed = true;
    if (this.#reopenTimer !== null) clearTimeout(this.#reopenTimer);
    this.#reopenTimer = null;
    this.#sub?.close();
    this.#sub = null;
  }

  /** Up to `limit` batches (and the clear markers among them) queued since the last take, in order. */
  take(limit: number): (QueuedBatch | 'clear')[] {
    this.#notified = false;
    const q = this.#queue;
    if (this.#queued <= limit) {
      this.#queue = [];
      this.#queued = 0;
      this.#queuedBytes = 0;
      return q;
    }
    let n = 0;
    let i = 0;
    let bytes = 0;
    for (; i < q.length && n < limit; i++) {
      const x = q[i]!;
      if (x !== 'clear') {
        n++;
        bytes += x.payload.length;
      }
    }
    this.#queued -= n;
    this.#queuedBytes -= bytes;
    return q.splice(0, i);
  }

  /**
   * The owner lost batches it had taken (its drain failed): forget the engine's entries before whatever comes
   * next, without waking the owner (the clear goes with the next batch), and distrust the stream until then.
   */
  lost(): void {
    this.counters.clears++;
    this.#push('clear', false);
    this.#setProblem('decode-errors');
  }

  /**
   * The owner could not decode a batch of this stream. `cleared`: the owner already cleared the engine's
   * entries in order (the native decoder does); otherwise a clear is queued.
   */
  decodeFailed(cleared = false): void {
    this.counters.decodeErrors++;
    // a lost batch leaves the index unsure of this engine: forget it, and distrust after a few in a row
    this.counters.clears++;
    if (!cleared) this.#push('clear');
    if (++this.#decodeErrorsInRow >= 3) this.#setProblem('decode-errors');
  }

  /** The owner decoded a batch of this stream. */
  decoded(): void {
    this.#decodeErrorsInRow = 0;
    this.#reopens = 0;
    if (this.#problem === 'decode-errors') this.#problem = null;
  }

  async #receive(sub: Subscriber): Promise<void> {
    for (;;) {
      let frames: Buffer[];
      try {
        frames = await sub.receive();
      } catch {
        if (this.#closed || sub.closed || sub !== this.#sub) return; // closed (or replaced after a disconnect)
        // not expected from a SUB socket (EAGAIN only with a receive timeout): go on receiving, after a pause
        this.counters.callbackErrors++;
        await new Promise((r) => setTimeout(r, 100));
        continue;
      }
      try {
        if (frames.length !== 3) {
          this.decodeFailed();
          continue;
        }
        const seq = readSeq(frames[1]!);
        if (seq < 0) {
          this.decodeFailed();
          continue;
        }
        this.#live({ seq, payload: frames[2]!, at: performance.now() });
      } catch {
        // a bug or a throwing hook must not end this loop (the stream would go silent and stay "healthy")
        this.#callbackFailed();
      }
    }
  }

  #callbackFailed(): void {
    this.counters.callbackErrors++;
    this.counters.clears++;
    this.#push('clear');
    this.#expected = -1;
    this.#setProblem('decode-errors');
  }

  #live(b: QueuedBatch): void {
    this.counters.batches++;
    if (this.#problem === 'connecting' || this.#problem === 'disconnected') this.#problem = null;
    if (this.#replaying) {
      this.#hold(b);
      return;
    }
    const exp = this.#expected;
    if (exp === -1 || b.seq === exp) {
      if (exp === -1 && b.seq > 0 && this.options.replayEndpoint !== null) {
        // joined a running engine: fetch what its replay buffer still holds
        this.#startReplay(0, b);
        return;
      }
      this.#accept(b);
      return;
    }
    if (b.seq > exp) {
      this.counters.gaps++;
      this.#noteGap();
      if (this.options.replayEndpoint !== null) this.#startReplay(exp, b);
      else this.#clearThen(b);
      return;
    }
    if (b.seq === 0) {
      // the publisher restarted (engine restart): its cache restarted too
      this.counters.restarts++;
      this.#clearThen(b);
      this.#onReset?.();
      return;
    }
    this.counters.duplicates++;
  }

  #accept(b: QueuedBatch): void {
    this.#expected = b.seq + 1;
    this.#push(b);
  }

  #clearThen(b: QueuedBatch): void {
    this.counters.clears++;
    this.#push('clear');
    this.#accept(b);
  }

  #push(item: QueuedBatch | 'clear', notify = true): void {
    const q = this.#queue;
    if (item === 'clear') {
      // two clears in a row say no more than one (so clears cannot grow the queue on their own)
      if (q.length > 0 && q[q.length - 1] === 'clear') return;
    } else {
      const max = this.options.maxQueued;
      const maxBytes = this.options.maxQueuedBytes;
      const size = item.payload.length;
      if (this.#queued >= max || (this.#queued > 0 && this.#queuedBytes + size > maxBytes)) {
        // flood: drop the oldest batches until this one fits (in count and bytes; the queue always takes one);
        // what they said is lost, so the engine's entries are cleared first
        let dropped = 0;
        let droppedBytes = 0;
        const byBytes = this.#queued < max;
        while (this.#queued > 0 && (this.#queued >= max || this.#queuedBytes + size > maxBytes)) {
          const x = q.shift();
          if (x === undefined) break;
          if (x !== 'clear') {
            this.#queued--;
            this.#queuedBytes -= x.payload.length;
            dropped++;
            droppedBytes += x.payload.length;
          }
        }
        while (q.length > 0 && q[0] === 'clear') q.shift();
        this.counters.dropped += dropped;
        if (byBytes) this.counters.droppedBytes += dropped;
        this.counters.clears++;
        q.unshift('clear');
        this.#setProblem('overflow');
      }
      this.#queued++;
      this.#queuedBytes += size;
    }
    q.push(item);
    if (notify && !this.#notified) {
      this.#notified = true;
      this.#onReady();
    }
  }

  /** Holds a live batch received during a replay, dropping the oldest held past maxQueued or maxQueuedBytes. */
  #hold(b: QueuedBatch): void {
    const h = this.#held;
    const size = b.payload.length;
    let dropped = 0;
    while (h.length > 0 && (h.length >= this.options.maxQueued || this.#heldBytes + size > this.options.maxQueuedBytes)) {
      this.#heldBytes -= h.shift()!.payload.length;
      dropped++;
    }
    if (dropped > 0) {
      // the first held batch now follows a hole: after the replay, #live sees it as a gap (replay again, or clear)
      this.counters.dropped += dropped;
      this.#setProblem('overflow');
    }
    h.push(b);
    this.#heldBytes += size;
  }

  #takeHeld(): QueuedBatch[] {
    const held = this.#held;
    this.#held = [];
    this.#heldBytes = 0;
    return held;
  }

  /** Called by the owner after a drain emptied the queue: an overflow is over once the backlog is gone. */
  drained(): void {
    if (this.#problem === 'overflow' && this.#queued === 0) this.#problem = null;
    if (this.#problem === 'gaps' && this.#recentGaps.length < 3) this.#problem = null;
  }

  #noteGap(): void {
    const now = Date.now();
    const g = this.#recentGaps;
    g.push(now);
    while (g.length > 0 && now - g[0]! > 10_000) g.shift();
    if (g.length >= 3) this.#setProblem('gaps');
  }

  #setProblem(p: StreamProblem): void {
    if (this.#problem === p) return;
    this.#problem = p;
  }

  #startReplay(from: number, live: QueuedBatch): void {
    this.#replaying = true;
    this.#held = [live];
    this.#heldBytes = live.payload.length;
    this.counters.replays++;
    const joining = this.#expected === -1;
    this.#replay(from)
      .then((got) => this.#replayed(got, from, live, joining))
      .catch(() => {
        // never an unhandled rejection (it would end the process): forget the engine, start again
        this.#replaying = false;
        this.#takeHeld();
        this.#callbackFailed();
      });
  }

  #replayed(got: QueuedBatch[] | null, from: number, live: QueuedBatch, joining: boolean): void {
    {
      this.#replaying = false;
      if (got !== null && !covers(got, joining ? -1 : from, live.seq)) got = null;
      if (got === null && joining) {
        // joining: whatever the buffer no longer holds was never known here; start from the live batch
        for (const b of this.#takeHeld()) this.#afterClear(b);
        return;
      }
      const held = this.#takeHeld();
      if (got === null) {
        this.counters.replayFailures++;
        // what the gap held is lost: a wrong "cached" is worse than a miss
        this.counters.clears++;
        this.#push('clear');
        this.#expected = -1;
        for (const b of held) this.#afterClear(b);
        return;
      }
      for (const b of got) {
        if (this.#expected !== -1 && b.seq < this.#expected) continue;
        this.#accept(b);
      }
      for (const b of held) this.#live(b);
    }
  }

  /** After a failed replay: take held live batches from the first one on, without asking again. */
  #afterClear(b: QueuedBatch): void {
    if (this.#expected === -1 || b.seq >= this.#expected) this.#accept(b);
  }

  /** Asks the replay socket for batches from `from` on; null when it fails or times out. */
  async #replay(from: number): Promise<QueuedBatch[] | null> {
    if (this.#closed || this.options.replayEndpoint === null) return null;
    const d = new Dealer({
      linger: 0,
      receiveTimeout: this.options.replayTimeoutMs,
      sendTimeout: this.options.replayTimeoutMs,
      maxMessageSize: this.options.maxMessageBytes,
    });
    const out: QueuedBatch[] = [];
    let bytes = 0;
    try {
      d.connect(this.options.replayEndpoint);
      await d.send([Buffer.alloc(0), seqBytes(from)]);
      const deadline = Date.now() + this.options.replayTimeoutMs;
      for (;;) {
        if (Date.now() > deadline) return null;
        const frames = await d.receive();
        const f = frames[0]!.length === 0 ? frames.slice(1) : frames;
        if (f.length < 2) return null;
        const seq = readSeq(f[0]!);
        if (seq === -2) break;
        if (seq < 0) return null;
        bytes += f[1]!.length;
        if (bytes > this.options.maxQueuedBytes || out.length >= this.options.maxQueued) {
          // a replay answer bigger than the queue could hold: not applied (what the gap held is lost)
          this.counters.replayOverflows++;
          return null;
        }
        out.push({ seq, payload: f[1]!, at: performance.now() });
      }
      return out;
    } catch {
      return null;
    } finally {
      d.close();
    }
  }
}
