// A lean HTTP/1.1 upstream client: keep-alive net.Socket connections per
// endpoint, one request at a time per connection (no pipelining), one write
// per request, and the response parser of src/proxy/h1-parser.ts. It exists
// because it costs about half the CPU per proxied request of undici's
// general-purpose client (bench/overhead.ts measures both: `proxy.client:
// undici | h1`), and it is the client for endpoints named by DNS names
// (`proxy.client: auto` picks the native client only for IP literals).
//
// Why two plain-http clients, and how they stay one behaviour: the native
// client is cheaper (`node dist/bench/upstream-clients.js --seconds 3
// --rounds 3`, 2026-12-01 00:50 UTC, a loaded 2-core VM: native 92 % / 90 % /
// 80 % of h1's router CPU per request at 16 / 64 / 256 connections, 110-115 %
// of its req/s), so retiring this client for DNS names (native DNS through
// uv_getaddrinfo) is the better end state; it needs address selection and
// re-resolution in the addon and changes to config validation and client
// selection, more risk than this change could carry. Until then both clients
// parse with the same rules (native/h1_parser.h and h1-parser.ts), held to
// one reference model (test/native-h1-parser.property.test.ts) and one
// conformance suite over real sockets (test/h1-conformance.test.ts).
import { connect, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import type { ProxyConfig } from '../config/schema.js';
import { DEFAULTS } from '../config/schema.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import type { UpstreamCall, UpstreamClient, UpstreamRequest, UpstreamSink } from './upstream.js';
import { H1Error, H1Result, H1ResponseParser, type H1ParserSink } from './h1-parser.js';

export class UpstreamSocketError extends Error {
  readonly code: string;
  constructor(message: string, code: string) {
    super(message);
    this.name = 'UpstreamSocketError';
    this.code = code;
  }
}

/**
 * Every upstream socket reads into this one buffer (Node's `onread` option:
 * no Buffer and no stream machinery per read). Safe because a chunk is handed
 * to the sink synchronously and the sink copies what it keeps.
 */
const READ_BUFFER = Buffer.allocUnsafe(64 * 1024);
/** Bodies up to this size are copied behind the request head to go out in one write of one buffer. */
const JOIN_BODY_MAX = 16 * 1024;
const IDLE_KEEPALIVE_MS = 4000; // below the 10 s idle timeout of uWS-based engines
/** Upper bound of the pool's clock tick (timeouts fire up to two ticks late). */
const MAX_TICK_MS = 250;

const PARSE_ERRORS: Record<number, string> = {
  [H1Error.BadStatus]: 'malformed status line',
  [H1Error.HeadTooLarge]: 'response headers too large',
  [H1Error.BadChunk]: 'malformed chunked body',
  [H1Error.BadLength]: 'malformed content-length',
  [H1Error.Unexpected]: 'unexpected bytes from the endpoint',
};

class H1Call implements UpstreamCall {
  sink: UpstreamSink | null;
  readonly pool: H1Pool;
  readonly req: UpstreamRequest;
  conn: H1Conn | null = null;
  paused = false;
  aborted = false;
  /** A reused connection failed before any response byte: tried once more on a fresh one. */
  redispatched = false;
  /** The pool's clock when the call joined the queue for a free connection; -1 when not queued. */
  queuedAt = -1;

  constructor(pool: H1Pool, req: UpstreamRequest, sink: UpstreamSink) {
    this.pool = pool;
    this.req = req;
    this.sink = sink;
  }

  pause(): void {
    this.paused = true;
    this.conn?.socket.pause();
  }

  resume(): void {
    if (!this.paused) return;
    this.paused = false;
    const conn = this.conn;
    if (conn) {
      // the pause was the client's doing: the body timeout starts afresh
      conn.activeAt = conn.pool.clock;
      conn.socket.resume();
    }
  }

  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    this.sink = null;
    const c = this.conn;
    if (c) {
      this.conn = null;
      c.call = null;
      c.destroy(); // mid-request: the connection cannot be reused; the engine sees the disconnect
    } else this.pool.dequeue(this);
  }
}

class H1Conn implements H1ParserSink {
  readonly socket: Socket;
  readonly pool: H1Pool;
  call: H1Call | null = null;
  connected = false;
  reused = false;
  gotBytes = false;
  dead = false;
  /**
   * The pool's coarse clock when this connection last saw progress (connect,
   * request start, the complete head, body bytes) or went idle. Timeouts are checked by the
   * pool's one timer instead of a socket timer refreshed on every read/write.
   */
  activeAt = 0;
  /** How long the current call waited for this connection (ms): it counts toward the headers limit. */
  waited = 0;
  readonly #parser = new H1ResponseParser();
  /** Inactivity limit of the current phase (connect, headers, body) in ms. */
  limitMs = 0;

  constructor(pool: H1Pool) {
    this.pool = pool;
    const s = (this.socket = connect({
      host: pool.host,
      port: pool.port,
      noDelay: true,
      keepAlive: true,
      onread: { buffer: READ_BUFFER, callback: (n: number, buf: Buffer) => this.#onRead(n, buf) },
    }));
    this.activeAt = pool.clock;
    this.limitMs = pool.cfg.connectTimeoutMs;
    s.on('connect', () => {
      this.connected = true;
      this.activeAt = this.pool.clock - this.waited;
      this.limitMs = this.pool.cfg.headersTimeoutMs;
    });
    s.on('end', () => this.#onEnd());
    s.on('error', (err: NodeJS.ErrnoException) => this.#fail(new UpstreamSocketError(`${err.message}`, err.code ?? 'ECONNRESET')));
    s.on('close', () => this.#fail(new UpstreamSocketError('connection closed by the endpoint', 'ECONNRESET')));
  }

  /** Called by the pool's timer: fails a call whose phase saw no progress for its limit. */
  checkTimeout(now: number, slackMs: number): void {
    if (this.dead || (this.call === null && this.connected)) return;
    // 0 = no limit for this phase; a call paused for a slow client receives nothing by design
    if (this.limitMs === 0 || (this.call !== null && this.call.paused)) return;
    // activeAt is the clock of the tick before the progress: allow one tick so nothing ends early
    if (now - this.activeAt <= this.limitMs + slackMs) return;
    if (this.call) this.#fail(new UpstreamSocketError(this.connected ? 'timed out waiting for the endpoint' : 'connect timeout', 'ETIMEDOUT'));
    else this.destroy();
  }

  start(call: H1Call): void {
    this.call = call;
    call.conn = this;
    this.gotBytes = false;
    this.#parser.start();
    const now = this.pool.clock;
    this.waited = call.queuedAt >= 0 ? now - call.queuedAt : 0;
    call.queuedAt = -1;
    // the connect phase has its own limit; the headers phase counts a queued call's wait
    this.activeAt = this.connected ? now - this.waited : now;
    if (this.connected) this.limitMs = this.pool.cfg.headersTimeoutMs;
    if (call.paused) this.socket.pause();
    else this.socket.resume();
    const r = call.req;
    let head = `${r.method} ${r.path} HTTP/1.1\r\nhost: ${this.pool.hostHeader}\r\n`;
    const h = r.headers;
    for (let i = 0; i + 1 < h.length; i += 2) head += `${h[i]}: ${h[i + 1]}\r\n`;
    const body = r.body;
    if (body !== null) {
      head += `content-length: ${body.length}\r\n\r\n`;
      if (body.length <= JOIN_BODY_MAX) {
        // one buffer, one write: no writev, no stream cork bookkeeping
        const hl = head.length;
        const out = Buffer.allocUnsafe(hl + body.length);
        out.write(head, 0, hl, 'latin1');
        body.copy(out, hl);
        this.socket.write(out);
      } else {
        this.socket.cork();
        this.socket.write(head, 'latin1');
        this.socket.write(body);
        this.socket.uncork();
      }
    } else {
      this.socket.write(head + '\r\n', 'latin1');
    }
  }

  #onRead(n: number, shared: Buffer): boolean {
    try {
      this.#onData(n === shared.length ? shared : shared.subarray(0, n));
    } catch (err) {
      // a throwing sink must not take the process down: fail this call
      this.#fail(new UpstreamSocketError(`internal error: ${(err as Error).message}`, 'EINTERNAL'));
    }
    return true;
  }

  /** `b` may be the shared read buffer: anything kept past this call is copied (the parser does). */
  #onData(b: Buffer): void {
    const call = this.call;
    if (call === null) {
      // bytes on an idle connection: protocol violation; drop the connection
      this.destroy();
      return;
    }
    this.gotBytes = true;
    // the head must be complete within the headers limit (bytes of it do not restart it,
    // or an engine trickling a head could hold the call forever); body bytes are progress
    if (!this.#parser.inHead) this.activeAt = this.pool.clock;
    const p = this.#parser;
    switch (p.feed(b, this)) {
      case H1Result.Done:
        if (this.call === call) this.#complete(p.consumed < b.length); // bytes after the response: not ours
        break;
      case H1Result.Fail:
        this.#fail(new UpstreamSocketError(PARSE_ERRORS[p.error] ?? 'malformed response', 'EPROTO'));
        break;
      default:
        break; // More, or Stop: the sink gave the call up
    }
  }

  /** H1ParserSink: the final head. */
  onHead(status: number, contentType: string, contentLength: number): boolean {
    const call = this.call!;
    this.limitMs = this.pool.cfg.bodyTimeoutMs;
    this.activeAt = this.pool.clock; // the body phase starts
    call.sink?.onUpstreamHeaders(status, contentType, contentLength);
    return this.call === call; // false: the sink aborted (e.g. a retry on 5xx)
  }

  /** H1ParserSink: body bytes. */
  onBody(buf: Buffer, start: number, end: number): boolean {
    const call = this.call!;
    call.sink?.onUpstreamData(start === 0 && end === buf.length ? buf : buf.subarray(start, end));
    return this.call === call;
  }

  #complete(extraBytes: boolean): void {
    const call = this.call!;
    this.call = null;
    call.conn = null;
    const sink = call.sink;
    call.sink = null;
    if (this.#parser.keepAlive && !extraBytes && !this.dead) {
      this.reused = true;
      this.activeAt = this.pool.clock;
      if (call.paused) this.socket.resume();
      this.pool.release(this);
    } else this.destroy();
    sink?.onUpstreamEnd();
  }

  #onEnd(): void {
    if (this.call && this.#parser.eof()) this.#complete(false);
    else this.#fail(new UpstreamSocketError('connection closed by the endpoint', 'ECONNRESET'));
  }

  #fail(err: UpstreamSocketError): void {
    const call = this.call;
    const wasReused = this.reused;
    const noBytes = !this.gotBytes;
    this.call = null;
    this.destroy();
    if (call === null) return;
    call.conn = null;
    // A kept-alive connection the endpoint closed while idle: the request never
    // reached it; send it once more on a fresh connection.
    if (wasReused && noBytes && !call.redispatched && err.code !== 'ETIMEDOUT') {
      call.redispatched = true;
      this.pool.dispatch(call);
      return;
    }
    const sink = call.sink;
    call.sink = null;
    sink?.onUpstreamError(err);
  }

  destroy(): void {
    if (this.dead) return;
    this.dead = true;
    this.pool.forget(this);
    this.socket.destroy();
  }
}

class H1Pool {
  readonly host: string;
  readonly port: number;
  readonly hostHeader: string;
  readonly cfg: ProxyConfig;
  readonly #idle: H1Conn[] = [];
  readonly #queue: H1Call[] = [];
  /** Every open connection (for the timeout sweep). */
  readonly #conns: H1Conn[] = [];
  readonly #tickMs: number;
  #open = 0;
  #sweep: NodeJS.Timeout | undefined;
  /** Coarse clock (performance.now() at the last tick) that connections stamp their progress with. */
  clock = performance.now();
  closed = false;

  constructor(url: string, cfg: ProxyConfig) {
    const u = new URL(url);
    this.host = u.hostname.replace(/^\[|\]$/g, '');
    this.port = Number(u.port || (u.protocol === 'https:' ? 443 : 80));
    this.hostHeader = u.host;
    this.cfg = cfg;
    // 0 disables a limit: it does not count towards the tick
    const limits = [cfg.connectTimeoutMs, cfg.headersTimeoutMs, cfg.bodyTimeoutMs].filter((ms) => ms > 0);
    const shortest = limits.length ? Math.min(...limits) : MAX_TICK_MS * 8;
    this.#tickMs = Math.max(5, Math.min(MAX_TICK_MS, Math.floor(shortest / 8)));
  }

  #connect(call: H1Call): void {
    this.#open++;
    // the coarse clock is that of the last tick, before whatever JavaScript ran since:
    // the connect limit counts from now (once per connection, not per request)
    this.clock = performance.now();
    if (this.#sweep === undefined) {
      this.#sweep = setInterval(() => this.#tick(), this.#tickMs);
      this.#sweep.unref();
    }
    const c = new H1Conn(this);
    this.#conns.push(c);
    c.start(call);
  }

  dispatch(call: H1Call): void {
    if (this.closed) {
      const s = call.sink;
      call.sink = null;
      s?.onUpstreamError(new UpstreamSocketError('the upstream client is closed', 'ECLOSED'));
      return;
    }
    while (this.#idle.length > 0) {
      const c = this.#idle.pop()!;
      if (!c.dead) {
        c.start(call);
        return;
      }
    }
    if (this.#open < this.cfg.connectionsPerEndpoint) {
      this.#connect(call);
      return;
    }
    call.queuedAt = this.clock;
    this.#queue.push(call);
  }

  dequeue(call: H1Call): void {
    const i = this.#queue.indexOf(call);
    if (i >= 0) this.#queue.splice(i, 1);
  }

  release(c: H1Conn): void {
    const next = this.#queue.shift();
    if (next !== undefined) c.start(next);
    else this.#idle.push(c);
  }

  /**
   * The pool's one timer: advances the clock, fails calls whose connection
   * made no progress within its phase's timeout, and closes connections idle
   * for longer than the keep-alive window (before the engine does).
   */
  #tick(): void {
    const now = (this.clock = performance.now());
    // calls waiting for a free connection are under the headers limit too (the
    // queue is in sending order: the first one still in time ends the scan);
    // the queue first: a connection failing below would hand its place to a
    // call that is already out of time
    const q = this.#queue;
    const limit = this.cfg.headersTimeoutMs + this.#tickMs;
    while (q.length > 0 && now - q[0].queuedAt > limit) {
      const call = q.shift()!;
      call.queuedAt = -1;
      const sink = call.sink;
      call.sink = null;
      sink?.onUpstreamError(new UpstreamSocketError('timed out waiting for a free connection to the endpoint (all proxy.connectionsPerEndpoint busy)', 'ETIMEDOUT'));
    }
    const conns = this.#conns;
    for (let i = conns.length - 1; i >= 0; i--) if (i < conns.length) conns[i].checkTimeout(now, this.#tickMs);
    const cutoff = now - IDLE_KEEPALIVE_MS;
    for (let i = this.#idle.length - 1; i >= 0; i--) {
      const c = this.#idle[i];
      if (c !== undefined && c.activeAt < cutoff) c.destroy();
    }
  }

  forget(c: H1Conn): void {
    this.#open--;
    let i = this.#idle.indexOf(c);
    if (i >= 0) this.#idle.splice(i, 1);
    i = this.#conns.indexOf(c);
    if (i >= 0) this.#conns.splice(i, 1);
    if (this.#conns.length === 0 && this.#sweep !== undefined) {
      clearInterval(this.#sweep);
      this.#sweep = undefined;
    }
    if (!this.closed && this.#queue.length > 0 && this.#open < this.cfg.connectionsPerEndpoint) {
      this.#connect(this.#queue.shift()!);
    }
  }

  close(): void {
    this.closed = true;
    if (this.#conns.length === 0) {
      // busy connections keep the timer (and their timeouts) until they end
      clearInterval(this.#sweep);
      this.#sweep = undefined;
    }
    for (const call of this.#queue.splice(0)) {
      const s = call.sink;
      call.sink = null;
      s?.onUpstreamError(new UpstreamSocketError('the upstream client is closed', 'ECLOSED'));
    }
    for (const c of this.#idle.splice(0)) c.destroy();
  }
}

export class H1UpstreamClient implements UpstreamClient {
  readonly #pools: (H1Pool | undefined)[] = [];
  readonly #cfg: ProxyConfig;

  constructor(cfg: ProxyConfig = DEFAULTS.proxy) {
    this.#cfg = cfg;
  }

  send(ep: Endpoint, req: UpstreamRequest, sink: UpstreamSink): UpstreamCall {
    let p = this.#pools[ep.id];
    if (!p) {
      if (!ep.url.startsWith('http:')) throw new UpstreamSocketError(`the h1 client speaks plain http only (${ep.url}); use proxy.client: undici`, 'EPROTO');
      this.#pools[ep.id] = p = new H1Pool(ep.url, this.#cfg);
    }
    const call = new H1Call(p, req, sink);
    p.dispatch(call);
    return call;
  }

  async close(): Promise<void> {
    for (const p of this.#pools) p?.close();
  }

  forget(ep: Endpoint): void {
    const p = this.#pools[ep.id];
    this.#pools[ep.id] = undefined;
    p?.close();
  }
}
