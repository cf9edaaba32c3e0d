// The native HTTP/1.1 upstream client (`proxy.client: native`): the sockets,
// connection pools, request writes, response parsing and timeouts live in the
// addon (native/upstream_core.h/.cc; the parser is native/h1_parser.h, the N-API class native/upstream_client.cc) on this thread's libuv loop; this file
// owns call ids and turns the addon's batched event records into sink calls.
// Compared with the h1 client it takes Node's stream machinery (StreamBase
// reads, WriteWraps, per-socket JS callbacks) off every proxied request: one
// JS->native call per request and at most one native->JS call per event-loop
// turn for all responses that progressed in it.
//
// Endpoints must be plain http:// with an IP address or `localhost` as host
// (the addon does no DNS resolution); config validation says so.
import { isIP } from 'node:net';
import { getSystemErrorName } from 'node:util';
import {
  NativeUpstreamConnections,
  UPSTREAM_EVENT_DATA,
  UPSTREAM_EVENT_END,
  UPSTREAM_EVENT_ERROR,
  UPSTREAM_EVENT_HEAD,
  UPSTREAM_INTERNED_TYPES,
  UPSTREAM_MAX_SLOTS,
  UPSTREAM_SLOT_BITS,
  UpstreamErrorReason,
} from '../../bindings/upstream-client.js';
import type { ProxyConfig } from '../config/schema.js';
import { DEFAULTS } from '../config/schema.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import { UpstreamSocketError } from './h1-client.js';
import type { UpstreamCall, UpstreamClient, UpstreamRequest, UpstreamSink } from './upstream.js';

const SLOT_MASK = UPSTREAM_MAX_SLOTS - 1;
const GEN_MASK = 0x7ff; // ids stay positive int32s

/** Why an endpoint URL cannot be served by the native client, or null if it can. */
export function nativeEndpointProblem(url: string): string | null {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return `not a URL: ${url}`;
  }
  if (u.protocol !== 'http:') return `the native client speaks plain http only (${url}); use proxy.client: undici`;
  const host = u.hostname.replace(/^\[|\]$/g, '');
  if (host !== 'localhost' && isIP(host) === 0) return `the native client needs an IP address or localhost as host (${url}); use proxy.client: h1`;
  return null;
}

class NativeCall implements UpstreamCall {
  id = 0;
  sink: UpstreamSink | null;
  readonly client: NativeUpstreamClient;
  readonly pool: number;
  readonly req: UpstreamRequest;
  paused = false;
  /** A reused connection failed before any response byte: sent once more on a fresh one. */
  redispatched = false;

  constructor(client: NativeUpstreamClient, pool: number, req: UpstreamRequest, sink: UpstreamSink) {
    this.client = client;
    this.pool = pool;
    this.req = req;
    this.sink = sink;
  }

  pause(): void {
    if (this.paused || this.sink === null) return;
    this.paused = true;
    this.client.conns.pause(this.id);
  }

  resume(): void {
    if (!this.paused) return;
    this.paused = false;
    if (this.sink !== null) this.client.conns.resume(this.id);
  }

  abort(): void {
    if (this.sink === null) return;
    this.sink = null;
    this.client.release(this);
    this.client.conns.abort(this.id); // mid-request: the addon closes the connection; the engine sees the disconnect
  }
}

function errorOf(errno: number, reason: number): UpstreamSocketError {
  let code: string;
  try {
    code = getSystemErrorName(errno);
  } catch {
    code = 'EIO';
  }
  switch (reason) {
    case UpstreamErrorReason.Connect:
      return new UpstreamSocketError(`connect ${code}`, code);
    case UpstreamErrorReason.ConnectTimeout:
      return new UpstreamSocketError('connect timeout', 'ETIMEDOUT');
    case UpstreamErrorReason.Timeout:
      return new UpstreamSocketError('timed out waiting for the endpoint', 'ETIMEDOUT');
    case UpstreamErrorReason.Closed:
      return new UpstreamSocketError('connection closed by the endpoint', 'ECONNRESET');
    case UpstreamErrorReason.Io:
      return new UpstreamSocketError(`socket error ${code}`, code);
    case UpstreamErrorReason.BadStatus:
      return new UpstreamSocketError('malformed status line', 'EPROTO');
    case UpstreamErrorReason.HeadTooLarge:
      return new UpstreamSocketError('response headers too large', 'EPROTO');
    case UpstreamErrorReason.BadChunk:
      return new UpstreamSocketError('malformed chunked body', 'EPROTO');
    case UpstreamErrorReason.BadLength:
      return new UpstreamSocketError('malformed content-length', 'EPROTO');
    case UpstreamErrorReason.Unexpected:
      return new UpstreamSocketError('unexpected bytes from the endpoint', 'EPROTO');
    case UpstreamErrorReason.QueueTimeout:
      return new UpstreamSocketError('timed out waiting for a free connection to the endpoint (all proxy.connectionsPerEndpoint busy)', 'ETIMEDOUT');
    case UpstreamErrorReason.ClientClosed:
      return new UpstreamSocketError('the upstream client is closed', 'ECLOSED');
    default:
      return new UpstreamSocketError(`upstream error ${code}`, code);
  }
}

export class NativeUpstreamClient implements UpstreamClient {
  readonly conns: NativeUpstreamConnections;
  readonly #calls: (NativeCall | undefined)[] = [];
  readonly #gens: number[] = [];
  readonly #free: number[] = [];
  /** `host:` header value per endpoint id (undefined: pool not registered yet). */
  readonly #hosts: (string | undefined)[] = [];
  readonly #types: string[] = [];
  /** Per pool: the last request line + host header written (see #write). */
  readonly #lines: ({ method: string; path: string; text: string } | undefined)[] = [];
  #live = 0;
  #closed = false;
  #destroyed = false;

  constructor(cfg: ProxyConfig = DEFAULTS.proxy) {
    this.conns = new NativeUpstreamConnections(cfg, (n) => this.#onEvents(n));
  }

  send(ep: Endpoint, req: UpstreamRequest, sink: UpstreamSink): UpstreamCall {
    if (this.#destroyed) {
      // before the pool lookup: a destroyed client cannot register one (it would throw)
      const call = new NativeCall(this, ep.id, req, sink);
      call.sink = null;
      process.nextTick(() => sink.onUpstreamError(new UpstreamSocketError('the upstream client is closed', 'ECLOSED')));
      return call;
    }
    const host = this.#hosts[ep.id] ?? this.#addPool(ep);
    const call = new NativeCall(this, ep.id, req, sink);
    let slot = this.#free.pop();
    if (slot === undefined) {
      slot = this.#calls.length;
      if (slot >= UPSTREAM_MAX_SLOTS) throw new UpstreamSocketError('too many upstream calls in flight', 'EMFILE');
      this.#gens.push(0);
    }
    call.id = slot | (this.#gens[slot]! << UPSTREAM_SLOT_BITS);
    this.#calls[slot] = call;
    this.#live++;
    this.#write(call, host);
    return call;
  }

  #write(call: NativeCall, host: string): void {
    const r = call.req;
    // the request line and host header, kept per pool for the last method and path
    let pre = this.#lines[call.pool];
    if (pre === undefined || pre.method !== r.method || pre.path !== r.path) {
      pre = { method: r.method, path: r.path, text: `${r.method} ${r.path} HTTP/1.1\r\nhost: ${host}\r\n` };
      this.#lines[call.pool] = pre;
    }
    let head = pre.text;
    const h = r.headers;
    for (let i = 0; i + 1 < h.length; i += 2) head += `${h[i]}: ${h[i + 1]}\r\n`;
    const body = r.body;
    head += body !== null ? `content-length: ${body.length}\r\n\r\n` : '\r\n';
    this.conns.send(call.id, call.pool, head, body);
  }

  #addPool(ep: Endpoint): string {
    const problem = nativeEndpointProblem(ep.url);
    if (problem !== null) throw new UpstreamSocketError(problem, 'EPROTO');
    const u = new URL(ep.url);
    const host = u.hostname.replace(/^\[|\]$/g, '');
    this.conns.addPool(ep.id, host === 'localhost' ? '127.0.0.1' : host, Number(u.port || 80));
    this.#hosts[ep.id] = u.host;
    return u.host;
  }

  /**
   * The endpoint left the set: its idle connections close now, those busy
   * with a call when the call ends (never parked again), calls still waiting
   * for a connection fail. Its id is never used again by the set.
   */
  forget(ep: Endpoint): void {
    if (this.#destroyed || this.#hosts[ep.id] === undefined) return;
    this.#hosts[ep.id] = undefined;
    this.#lines[ep.id] = undefined;
    this.conns.closePool(ep.id);
  }

  release(call: NativeCall): void {
    const slot = call.id & SLOT_MASK;
    if (this.#calls[slot] !== call) return;
    this.#calls[slot] = undefined;
    this.#gens[slot] = (this.#gens[slot]! + 1) & GEN_MASK;
    this.#free.push(slot);
    if (--this.#live === 0 && this.#closed) this.#scheduleDestroy();
  }

  #type(i: number): string {
    if (i < 0) return '';
    if (i >= UPSTREAM_INTERNED_TYPES) return this.conns.contentType(i);
    return (this.#types[i] ??= this.conns.contentType(i));
  }

  #onEvents(count: number): void {
    const ev = this.conns.events;
    const f64 = this.conns.events64;
    const arena = this.conns.arena;
    const calls = this.#calls;
    for (let k = 0; k < count; k++) {
      const o = k << 3;
      const id = ev[o + 1]!;
      const call = calls[id & SLOT_MASK];
      if (call === undefined || call.id !== id) continue; // aborted (or the slot moved on)
      const sink = call.sink;
      if (sink === null) continue;
      try {
        switch (ev[o]) {
          case UPSTREAM_EVENT_HEAD:
            sink.onUpstreamHeaders(ev[o + 2]!, this.#type(ev[o + 3]!), f64[(o >> 1) + 2]!);
            break;
          case UPSTREAM_EVENT_DATA: {
            const off = ev[o + 2]!;
            sink.onUpstreamData(arena.subarray(off, off + ev[o + 3]!));
            break;
          }
          case UPSTREAM_EVENT_END:
            call.sink = null;
            this.release(call);
            sink.onUpstreamEnd();
            break;
          case UPSTREAM_EVENT_ERROR:
            this.#onError(call, sink, ev[o + 2]!, ev[o + 3]!, ev[o + 6] === 1);
            break;
        }
      } catch (err) {
        // a throwing sink must not take the process down: fail this call
        if (call.sink !== null) {
          call.sink = null;
          this.release(call);
          this.conns.abort(id);
          try {
            sink.onUpstreamError(new UpstreamSocketError(`internal error: ${(err as Error).message}`, 'EINTERNAL'));
          } catch {
            // a second throw must not escape either: the rest of this batch (other calls) still has to be delivered
          }
        }
      }
    }
  }

  #onError(call: NativeCall, sink: UpstreamSink, errno: number, reason: number, stale: boolean): void {
    if (stale && !call.redispatched && !this.#closed) {
      // A kept-alive connection the endpoint closed while idle: the request
      // never reached it; send it once more on a fresh connection.
      call.redispatched = true;
      this.#write(call, this.#hosts[call.pool]!);
      if (call.paused) this.conns.pause(call.id);
      return;
    }
    call.sink = null;
    this.release(call);
    sink.onUpstreamError(errorOf(errno, reason));
  }

  #scheduleDestroy(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    // not from inside an event batch: the addon is still delivering it
    setImmediate(() => this.conns.destroy());
  }

  /** Connection statistics (for benchmarks and tests). */
  stats(): { flushes: number; events: number; opened: number; open: number } {
    return this.conns.stats();
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.conns.close();
    if (this.#live === 0) this.#scheduleDestroy();
  }
}
