// Typed surface over the native HTTP/1.1 upstream client (native/upstream_client.cc over native/upstream_core.h).
//
// The native side owns the sockets (libuv, on this thread's event loop) and
// reports responses as event records in a shared Int32Array, delivered to
// `onEvents(count)` in batches (at most one call per event-loop turn, or when
// the read arena fills up). Body events name byte ranges of the shared arena,
// which is valid only during the onEvents call.
import { native } from './native.js';

/** Int32 words per event record (32 bytes; a Float64 sits at byte 16). */
export const UPSTREAM_EVENT_WORDS = 8;
export const UPSTREAM_EVENT_HEAD = 1;
export const UPSTREAM_EVENT_DATA = 2;
export const UPSTREAM_EVENT_END = 3;
export const UPSTREAM_EVENT_ERROR = 4;
/** Call ids: slot | generation << UPSTREAM_SLOT_BITS. */
export const UPSTREAM_SLOT_BITS = 20;
export const UPSTREAM_MAX_SLOTS = 1 << UPSTREAM_SLOT_BITS;
/** Content-type indexes below this are stable for the client's lifetime (cacheable). */
export const UPSTREAM_INTERNED_TYPES = 256;

/** Error reasons of UPSTREAM_EVENT_ERROR records (word 3); word 2 is the libuv errno, word 6 the "stale" flag. */
export const UpstreamErrorReason = {
  Connect: 1,
  ConnectTimeout: 2,
  Timeout: 3,
  Closed: 4,
  Io: 5,
  BadStatus: 6,
  HeadTooLarge: 7,
  BadChunk: 8,
  BadLength: 9,
  Unexpected: 10,
  ClientClosed: 11,
  /** Waited longer than headersTimeoutMs for a free connection (every connectionsPerEndpoint one busy). */
  QueueTimeout: 12,
} as const;

export interface NativeUpstreamOptions {
  connectTimeoutMs: number;
  headersTimeoutMs: number;
  bodyTimeoutMs: number;
  connectionsPerEndpoint: number;
}

interface NativeUpstream {
  addPool(poolId: number, ip: string, port: number): void;
  send(id: number, poolId: number, head: string, body: Uint8Array | null): void;
  abort(id: number): void;
  pause(id: number): void;
  resume(id: number): void;
  close(): void;
  closePool(poolId: number): void;
  destroy(): void;
  contentType(index: number): string;
  stats(): number[];
}

const NativeCtor = native.UpstreamClient as {
  new (
    onEvents: (count: number) => void,
    events: Int32Array,
    arena: Uint8Array,
    connectTimeoutMs: number,
    headersTimeoutMs: number,
    bodyTimeoutMs: number,
    connectionsPerEndpoint: number,
  ): NativeUpstream;
};

/**
 * The native connection pools of one client. Methods are thin: the caller
 * (src/proxy/native-client.ts) owns call ids and turns events into sink calls.
 * The native side holds `onEvents` strongly until destroy() (or the thread's
 * environment teardown): call destroy() when done, or the object stays alive.
 */
export class NativeUpstreamConnections {
  readonly events: Int32Array;
  readonly events64: Float64Array;
  readonly arena: Buffer;
  readonly #n: NativeUpstream;

  constructor(opts: NativeUpstreamOptions, onEvents: (count: number) => void, eventCapacity = 1024, arenaBytes = 1 << 20) {
    const buf = new ArrayBuffer(eventCapacity * UPSTREAM_EVENT_WORDS * 4);
    this.events = new Int32Array(buf);
    this.events64 = new Float64Array(buf);
    this.arena = Buffer.allocUnsafeSlow(arenaBytes);
    this.#n = new NativeCtor(
      onEvents,
      this.events,
      this.arena,
      opts.connectTimeoutMs,
      opts.headersTimeoutMs,
      opts.bodyTimeoutMs,
      opts.connectionsPerEndpoint,
    );
  }

  addPool(poolId: number, ip: string, port: number): void {
    this.#n.addPool(poolId, ip, port);
  }
  /** `head` is the request head (latin1, ending in CRLF CRLF); the body follows it on the wire. */
  send(id: number, poolId: number, head: string, body: Uint8Array | null): void {
    // the addon reads both as 32-bit integers, which would wrap 2^32 to 0 or cut 1.5 to 1:
    // numbers are checked here (two compares); other types get the addon's TypeError
    if (typeof id === 'number' && (id | 0) !== id) throw new RangeError('call id must be a non-negative int32');
    if (typeof poolId === 'number' && (poolId >>> 0) !== poolId) throw new RangeError('poolId must be an integer in [0, 2^20)');
    this.#n.send(id, poolId, head, body);
  }
  abort(id: number): void {
    this.#n.abort(id);
  }
  pause(id: number): void {
    this.#n.pause(id);
  }
  resume(id: number): void {
    this.#n.resume(id);
  }
  /** Fails waiting calls and closes idle connections; calls in flight finish. */
  close(): void {
    this.#n.close();
  }
  /**
   * The endpoint of `poolId` is gone: its waiting calls fail, its idle
   * connections close now and busy ones when their call ends. A later send
   * needs addPool again.
   */
  closePool(poolId: number): void {
    if ((poolId >>> 0) !== poolId) throw new RangeError('poolId must be an integer in [0, 2^20)');
    this.#n.closePool(poolId);
  }
  /** Closes every connection at once (no events follow) and frees the native state. */
  destroy(): void {
    this.#n.destroy();
  }
  contentType(index: number): string {
    return this.#n.contentType(index);
  }
  /** [event batches delivered, events delivered, connections opened, connections open]. */
  stats(): { flushes: number; events: number; opened: number; open: number } {
    const s = this.#n.stats();
    return { flushes: s[0]!, events: s[1]!, opened: s[2]!, open: s[3]! };
  }
}

/** What h1ParseForTest saw (see native/h1_parser_probe.cc). */
export interface H1ParseProbe {
  /** done: the response ended; eof: a body delimited by close ended at eof; fail: malformed; more: incomplete. */
  outcome: 'done' | 'eof' | 'fail' | 'more';
  /** An UpstreamErrorReason (6-10) when outcome is fail, else 0. */
  error: number;
  /** Final heads reported (0 or 1). */
  heads: number;
  status: number;
  type: string;
  length: number;
  keepAlive: boolean;
  /** Bytes of the input that belonged to the response (done, eof). */
  consumed: number;
  body: Buffer;
}

/**
 * Test-only: feeds `bytes` to one native HTTP/1.1 response parser (native/h1_parser.h)
 * in reads ending at the offsets in `splits` (increasing, inside bytes), then an
 * end of stream if `eof`. Not for request paths: it builds a JS object per call.
 */
export function h1ParseForTest(bytes: Uint8Array, splits: Uint32Array, eof: boolean): H1ParseProbe {
  return native.h1ParseForTest(bytes, splits, eof) as H1ParseProbe;
}
