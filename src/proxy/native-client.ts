// The native HTTP/1.1 upstream client (`proxy.client: native`, and `auto` for
// plain-http endpoints): the sockets, connection pools, request writes,
// response parsing and timeouts live in the addon (native/upstream_core.h/.cc;
// the parser is native/h1_parser.h, the N-API class native/upstream_client.cc)
// on this thread's libuv loop; this file owns call ids and turns the addon's
// batched event records into sink calls: one JS->native call per request and
// at most one native->JS call per event-loop turn for all responses that
// progressed in it.
//
// The addon connects to addresses only. An endpoint named by DNS name
// (`http://localhost:8001`, `http://engine.internal:8000`) is resolved here,
// asynchronously (resolver.ts): calls sent before its first address wait for
// the lookup; the name is looked up again when its TTL passes (in the
// background) and after a connect failure, and every address it has is tried
// before a connect error reaches the caller. The host header stays the name.
import { performance } from 'node:perf_hooks';
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
import { DEFAULT_DNS_TTL_MS, hostName, LOOKUP_RETRY_MS, NamedHost, systemLookup, type LookupFn } from './resolver.js';
import type { UpstreamCall, UpstreamClient, UpstreamRequest, UpstreamSink } from './upstream.js';
import { UpstreamSocketError } from './upstream.js';

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
  /** Named endpoints: the address this call dialled, the addresses it moved on from, whether it made the name be looked up again. */
  addr: string | undefined = undefined;
  moves = 0;
  relooked = false;

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

export interface NativeClientOptions {
  /** Resolves endpoints' DNS names (default: node:dns, every address); tests pass their own. */
  lookup?: LookupFn;
  /** How long a looked-up address is used before the name is looked up again (ms). */
  dnsTtlMs?: number;
}

export class NativeUpstreamClient implements UpstreamClient {
  /** The addon writes what it can from the caller's memory and copies the rest (native/upstream_core.cc Conn::TryWrite). */
  readonly copiesBody = true;
  readonly conns: NativeUpstreamConnections;
  readonly #calls: (NativeCall | undefined)[] = [];
  readonly #gens: number[] = [];
  readonly #free: number[] = [];
  /** `host:` header value per endpoint id (undefined: pool not registered yet). */
  readonly #hosts: (string | undefined)[] = [];
  readonly #types: string[] = [];
  /** Per pool: the last request line + host header written (see #write). */
  readonly #lines: ({ method: string; path: string; text: string } | undefined)[] = [];
  /** Per pool named by DNS name: its addresses (undefined: an IP address, registered once). */
  readonly #names: (NamedHost<NativeCall> | undefined)[] = [];
  readonly #lookup: LookupFn;
  readonly #ttlMs: number;
  #live = 0;
  #closed = false;
  #destroyed = false;

  constructor(cfg: ProxyConfig = DEFAULTS.proxy, opts: NativeClientOptions = {}) {
    this.conns = new NativeUpstreamConnections(cfg, (n) => this.#onEvents(n));
    this.#lookup = opts.lookup ?? systemLookup;
    this.#ttlMs = opts.dnsTtlMs ?? DEFAULT_DNS_TTL_MS;
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
    const named = this.#names[ep.id];
    if (named !== undefined && !this.#addressed(named, call)) return call; // sent when the lookup answers
    this.#write(call, host);
    return call;
  }

  /** A call to a named endpoint: true when it can be written now (an address is known), else it waits for the lookup. */
  #addressed(n: NamedHost<NativeCall>, call: NativeCall): boolean {
    if (n.addrs.length > 0) {
      // past the TTL: look again in the background; this call uses the address in hand
      if (!n.looking && performance.now() >= n.expires) this.#resolve(n);
      call.addr = n.address;
      return true;
    }
    n.waiting.push(call);
    if (!n.looking) this.#resolve(n);
    return false;
  }

  #resolve(n: NamedHost<NativeCall>): void {
    n.looking = true;
    let p: Promise<readonly { address: string }[]>;
    try {
      p = this.#lookup(n.name);
    } catch (err) {
      p = Promise.reject(err);
    }
    p.then(
      (list) => this.#looked(n, list.map((a) => a.address), null),
      (err: NodeJS.ErrnoException) => this.#looked(n, null, err),
    );
  }

  #looked(n: NamedHost<NativeCall>, list: string[] | null, err: NodeJS.ErrnoException | null): void {
    n.looking = false;
    if (this.#destroyed || this.#names[n.pool] !== n) return; // forgotten or destroyed: its waiting calls were failed then
    const now = performance.now();
    if (list !== null && list.length > 0) {
      const moved = n.update(list, now, this.#ttlMs);
      // a new address: the addon closes idle connections to the old one, busy ones when their call ends
      if (moved !== null && !this.#register(n, moved)) list = null;
    }
    const waiting = n.waiting;
    n.waiting = [];
    if (list === null || list.length === 0) {
      n.expires = now + (n.addrs.length > 0 ? LOOKUP_RETRY_MS : 0);
      if (n.addrs.length === 0) {
        const why = err === null ? 'no address' : (err.code ?? err.message);
        for (const call of waiting) this.#fail(call, new UpstreamSocketError(`cannot resolve ${n.name}: ${why}`, err?.code ?? 'ENOTFOUND'));
        return;
      }
    }
    for (const call of waiting) {
      if (call.sink === null) continue; // aborted while waiting
      call.addr = n.address;
      this.#write(call, this.#hosts[call.pool]!);
      if (call.paused) this.conns.pause(call.id);
    }
  }

  /** Points the pool at `address`; false (and the name's addresses dropped) when the addon refuses it. */
  #register(n: NamedHost<NativeCall>, address: string): boolean {
    try {
      this.conns.addPool(n.pool, address, n.port);
      return true;
    } catch {
      n.addrs = [];
      return false;
    }
  }

  #fail(call: NativeCall, err: UpstreamSocketError): void {
    const sink = call.sink;
    if (sink === null) return;
    call.sink = null;
    this.release(call);
    sink.onUpstreamError(err);
  }

  /**
   * A call to a named endpoint did not connect: it dials the name's next
   * address, or, when it has tried them all, waits for the name to be looked
   * up again (once per call). False: the error goes to the caller.
   */
  #redial(n: NamedHost<NativeCall>, call: NativeCall): boolean {
    const next = n.next(call.addr);
    if (next !== null) this.#register(n, next);
    if (call.moves + 1 < n.addrs.length) {
      call.moves++;
      call.addr = n.address;
      this.#write(call, this.#hosts[call.pool]!);
      if (call.paused) this.conns.pause(call.id);
      return true;
    }
    if (call.relooked) return false;
    call.relooked = true;
    call.moves = 0;
    n.expires = 0;
    n.waiting.push(call);
    if (!n.looking) this.#resolve(n);
    return true;
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
    const port = Number(u.port || 80);
    const name = hostName(u);
    if (name === null) this.conns.addPool(ep.id, u.hostname.replace(/^\[|\]$/g, ''), port);
    // always written (undefined for an address), so send() reads within the array's length
    this.#names[ep.id] = name === null ? undefined : new NamedHost(name, port, ep.id); // a name: registered with the addon when the lookup answers
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
    const n = this.#names[ep.id];
    if (n !== undefined) {
      this.#names[ep.id] = undefined;
      for (const call of n.waiting) this.#fail(call, errorOf(0, UpstreamErrorReason.ClientClosed));
    }
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
    if (reason === UpstreamErrorReason.Connect || reason === UpstreamErrorReason.ConnectTimeout) {
      const n = this.#names[call.pool];
      if (n !== undefined && !this.#closed && this.#redial(n, call)) return;
    }
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
    for (const n of this.#names) {
      if (n === undefined) continue;
      const waiting = n.waiting;
      n.waiting = [];
      for (const call of waiting) this.#fail(call, errorOf(0, UpstreamErrorReason.ClientClosed));
    }
    this.conns.close();
    if (this.#live === 0) this.#scheduleDestroy();
  }
}
