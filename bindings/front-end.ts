// Typed surface over the native HTTP/1.1 front end's request parser (native/h1_request_parser.h).
import { native } from './native.js';

/** What h1RequestParseForTest saw (see native/h1_request_probe.cc). */
export interface H1RequestProbe {
  /** done: a whole head was parsed; fail: invalid (status says the answer); more: incomplete. */
  outcome: 'done' | 'fail' | 'more';
  /** The answer for an invalid head (400, 417, 431, 501, 505), else 0. */
  status: number;
  /** A request line was begun (a timeout then answers 408). */
  begun: boolean;
  // the rest only when outcome is 'done'
  method?: string;
  /** One char per byte (latin1), as sent. */
  target?: string;
  form?: 'origin' | 'absolute' | 'authority' | 'asterisk';
  minor?: 0 | 1;
  /** Content-Length, -1 when absent. */
  length?: number;
  chunked?: boolean;
  keepAlive?: boolean;
  expectContinue?: boolean;
  headLen?: number;
  /** [name, value] per field line, one char per byte, the value's SP/HTAB trimmed. */
  fields?: [string, string][];
  /** done: the whole body was read; fail: bad chunked framing (400); more: the body is incomplete. */
  bodyOutcome?: 'done' | 'fail' | 'more';
  body?: Buffer;
  /** Bytes of the input that were this request (head and body) when bodyOutcome is done. */
  consumed?: number;
}

/**
 * Test-only: feeds `bytes` to one native strict request parser as a head buffer growing at the
 * offsets in `splits` (increasing, inside bytes), then decodes its body in the same pieces.
 * Not for request paths: it builds a JS object per call.
 */
export function h1RequestParseForTest(bytes: Uint8Array, splits: Uint32Array, maxHead = 64 * 1024, maxLines = 100): H1RequestProbe {
  return native.h1RequestParseForTest(bytes, splits, maxHead, maxLines) as H1RequestProbe;
}

/** A request as the native front end delivers it: once, whole. */
export interface FrontRequest {
  id: number;
  method: string;
  /** One char per byte (latin1), as sent. */
  target: string;
  /** 0: HTTP/1.0, 1: HTTP/1.1. */
  minor: number;
  /**
   * The head's bytes; the fields are at offsets (4 per field: name at, name len, value at, value len).
   * Both are views of the server's transfer buffer: valid until the next request arrives (copy to keep).
   */
  head: Buffer;
  offsets: Uint32Array;
  body: Buffer;
  /** The values of the options' `wanted` fields, in that order: undefined (a hole) when absent, repeated lines joined with ','; one char per byte. */
  wanted: (string | undefined)[];
}

export interface FrontServerOptions {
  /** Bytes of a head, request line to blank line (431 over it). */
  maxHead?: number;
  /** Field lines (431 over it). */
  maxLines?: number;
  /** Body bytes (413 over it, after draining what the client sends). */
  maxBody?: number;
  /** Body bytes of a request to /v1/files (the Files API's upload); default maxBody. */
  maxFileBody?: number;
  /** A head must arrive within this from its first byte (408). */
  headMs?: number;
  /** A body must progress within this (408); default headMs. */
  bodyMs?: number;
  /** A connection with no request begun is closed after this. */
  idleMs?: number;
  /** Open connections at most (0: no limit); one more is closed at once. */
  maxConnections?: number;
  /** Field names (any case) whose values each request carries in `wanted`. */
  wanted?: readonly string[];
  /** A streamed answer that respond/write reported FULL for can take more (its socket drained). */
  onDrain?: (id: number) => void;
  /** The front end answered a request itself (400, 408, 413, 417, 431, 501, 505). */
  onReject?: (status: number) => void;
  /**
   * Bodies up to this many bytes come through the transfer buffer (one copy, into takeBody's buffer);
   * larger ones are copied by the addon into a buffer of their own. Default 64 KiB.
   */
  transferBody?: number;
  /** Where a body that came through the transfer buffer is copied to (default Buffer.allocUnsafe). */
  takeBody?: (n: number) => Buffer;
}

/** A request whose head and field offsets are in the transfer buffer: viewed on first read. */
class XferRequest implements FrontRequest {
  constructor(
    readonly id: number,
    readonly method: string,
    readonly target: string,
    readonly minor: number,
    readonly body: Buffer,
    readonly wanted: (string | undefined)[],
    readonly heads: Uint8Array,
    readonly headLen: number,
    readonly fields: Uint32Array,
    readonly fieldCount: number,
  ) {}

  get head(): Buffer {
    return Buffer.from(this.heads.buffer, this.heads.byteOffset, this.headLen);
  }

  get offsets(): Uint32Array {
    return this.fields.subarray(0, this.fieldCount * 4);
  }
}

/** Where the head starts in the transfer buffer (after the field offsets: native/front_server.cc kXferOffsets). */
const XFER_OFFSETS = 16 * 1024;

/** What respond and write report. */
export const GONE = 0;
export const SENT = 1;
/** Sent, but the answer's bytes wait on a slow client: stop producing until onDrain(id). */
export const FULL = 2;

/**
 * The native HTTP/1.1 front end (native/front_server.cc): a listener on this thread's event loop.
 * onRequest is called once per whole request; answer it with respond (and write, for a streamed
 * body); answers go out in request order on each connection. onAbort reports a request whose
 * client left before its answer was written.
 */
export class FrontServer {
  readonly #n: any;

  constructor(onRequest: (r: FrontRequest) => void, onAbort: (id: number) => void, o: FrontServerOptions = {}) {
    // the transfer buffer (native/front_server.cc kXferOffsets): field offsets, the head, a body of up to
    // transferBody bytes are copied into it, so a request costs no ArrayBuffer of its own (the body is
    // copied out into takeBody's buffer: the router's reused ones, src/director/body-pool.ts)
    const maxHead = o.maxHead ?? 64 * 1024;
    const xfer = new ArrayBuffer(XFER_OFFSETS + maxHead + Math.max(64 * 1024, o.transferBody ?? 0));
    const takeBody = o.takeBody ?? ((n: number) => Buffer.allocUnsafe(n));
    const bytes = Buffer.from(xfer);
    const bodyAt = XFER_OFFSETS + maxHead;
    // the head and its offsets are viewed (a Buffer and a Uint32Array over the transfer buffer) only when a
    // handler reads them (header(): rare), not per request
    const heads = new Uint8Array(xfer, XFER_OFFSETS, maxHead);
    const fields = new Uint32Array(xfer, 0, XFER_OFFSETS / 4);
    this.#n = new native.FrontServer(
      (id: number, method: string, target: string, minor: number, head: Buffer | number, offsets: Uint32Array | number, body: Buffer | number, wanted: (string | undefined)[]) => {
        if (typeof body === 'number') {
          const n = body;
          body = takeBody(n);
          bytes.copy(body, 0, bodyAt, bodyAt + n);
        }
        onRequest(
          typeof head === 'number' ? new XferRequest(id, method, target, minor, body, wanted, heads, head, fields, offsets as number) : { id, method, target, minor, head, offsets: offsets as Uint32Array, body, wanted },
        );
      },
      onAbort,
      maxHead,
      o.maxLines ?? 100,
      o.maxBody ?? 16 * 1024 * 1024,
      o.headMs ?? 10_000,
      o.idleMs ?? 10_000,
      { transfer: xfer, onDrain: o.onDrain, onReject: o.onReject, wanted: o.wanted ?? [], bodyMs: o.bodyMs, maxConnections: o.maxConnections ?? 0, maxFileBody: o.maxFileBody },
    );
  }

  /** Listens on an IP address (port 0: any); returns the port. */
  listen(host: string, port: number): number {
    return this.#n.listen(host, port) as number;
  }

  /**
   * The answer's head (headLines: "name: value\r\n" per field, one char per byte; the server adds
   * content-length, or chunked framing when not ended, and connection) and its first body bytes.
   * `close`: the connection closes after this answer. GONE when the request is gone (aborted) or
   * already answered; FULL when its bytes wait on the client (see onDrain).
   */
  respond(id: number, status: number, headLines: string, body: Buffer | string | null, end: boolean, close = false): number {
    return this.#n.respond(id, status, headLines, body, end, close) as number;
  }

  /** More body for a streamed answer; end finishes it. GONE, SENT or FULL as respond. */
  write(id: number, chunk: Buffer | string | null, end: boolean): number {
    return this.#n.write(id, chunk, end) as number;
  }

  /** Cuts the connection of a request (an answer that cannot be finished); its unanswered requests are aborted. */
  abort(id: number): void {
    this.#n.abort(id);
  }

  /** Stops listening; the open connections are served on. */
  unlisten(): void {
    this.#n.unlisten();
  }

  /** false: each new connection is closed at once (the accept guard near the open-file limit). */
  setAccepting(on: boolean): void {
    this.#n.setAccepting(on);
  }

  /** Open connections, and connections refused (the limit, or not accepting) since start. */
  stats(): { connections: number; refused: number } {
    const [connections, refused] = this.#n.stats() as [number, number];
    return { connections, refused };
  }

  /** Stops listening and closes every connection (their pending requests are aborted). */
  close(): void {
    this.#n.close();
  }
}
/** The field lines of a request: [name, value] with one char per byte. */
export function frontFields(r: FrontRequest): [string, string][] {
  const out: [string, string][] = [];
  const o = r.offsets;
  const hb = r.head;
  for (let k = 0; k < o.length; k += 4) {
    out.push([hb.toString('latin1', o[k]!, o[k]! + o[k + 1]!), hb.toString('latin1', o[k + 2]!, o[k + 2]! + o[k + 3]!)]);
  }
  return out;
}
