// UpstreamClient over undici: one keep-alive Pool per endpoint (pipelining 1),
// driven through undici's raw dispatch handler (no streams, no promise per
// request, no header object: the two headers the relay needs are read from
// the raw header list). Backpressure: onData returns false while paused, and
// undici's resume callback restarts the flow.
//
// Two things undici does not do as the native client does, fixed here:
// - headersTimeoutMs bounds the time from send() to the final response head,
//   whatever 1xx heads arrive (undici restarts its headers timer on each 1xx,
//   so an engine sending 102 every 100 ms held a request forever): one coarse
//   timer per client sweeps the calls still waiting for their final head;
// - a 100 Continue head is skipped like any other 1xx (RFC 9110 15.2: a client
//   must parse 1xx heads it did not ask for); undici's parser destroys the
//   connection on an unexpected 100, so each connection's parser is given an
//   onHeadersComplete that passes a 100 on as another 1xx (see patch100).
import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';
import { Pool, buildConnector, type Dispatcher } from 'undici';
import type { ProxyConfig } from '../config/schema.js';
import { DEFAULTS } from '../config/schema.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import type { UpstreamCall, UpstreamClient, UpstreamRequest, UpstreamSink } from './upstream.js';
import { UpstreamSocketError } from './upstream.js';
import { SwitchyardError } from '../errors.js';

/** Upper bound of the headers sweep's tick (a call fails up to two ticks after its limit). */
const MAX_TICK_MS = 250;
/** The 1xx code a 100 Continue is passed to undici as: one no engine sends, that only UndiciCall.onHeaders sees (and skips). */
const CONTINUE_AS = 199;

/** undici's per-socket parser slot (lib/core/symbols.js kParser), or undefined if this undici has none. */
const PARSER_SLOT: symbol | undefined = (() => {
  try {
    const sym = (createRequire(import.meta.url)('undici/lib/core/symbols.js') as { kParser?: unknown }).kParser;
    return typeof sym === 'symbol' ? sym : undefined;
  } catch {
    return undefined;
  }
})();

interface UndiciParser {
  onHeadersComplete(statusCode: number, upgrade: boolean, shouldKeepAlive: boolean): number;
}

/**
 * Makes the parser undici puts on `socket` skip a 100 head like any other 1xx:
 * its onHeadersComplete (called by undici's llhttp glue on the instance) gets
 * an own wrapper that hands undici CONTINUE_AS instead of 100. Once per
 * connection; the slot becomes a plain data property again at the first write.
 * If undici's internals change shape, nothing is patched (a 100 stays an error,
 * and test/undici-client.test.ts says so).
 */
function patch100(socket: object): void {
  if (PARSER_SLOT === undefined) return;
  const slot = PARSER_SLOT;
  Object.defineProperty(socket, slot, {
    configurable: true,
    enumerable: true,
    get: () => undefined,
    set(parser: unknown) {
      Object.defineProperty(socket, slot, { value: parser, writable: true, configurable: true, enumerable: true });
      const p = parser as UndiciParser | null;
      if (p === null || typeof p !== 'object' || typeof p.onHeadersComplete !== 'function') return;
      const original = p.onHeadersComplete;
      p.onHeadersComplete = function (statusCode: number, upgrade: boolean, shouldKeepAlive: boolean): number {
        return original.call(this, statusCode === 100 ? CONTINUE_AS : statusCode, upgrade, shouldKeepAlive);
      };
    },
  });
}

class AbortedByRouter extends SwitchyardError {
  constructor() {
    super('aborted by the router', { code: 'SWY_ERR_ABORTED' });
    this.name = 'AbortError';
  }
}

function eqLower(b: Buffer, lower: string): boolean {
  if (b.length !== lower.length) return false;
  for (let i = 0; i < b.length; i++) if ((b[i] | 0x20) !== lower.charCodeAt(i)) return false;
  return true;
}

/** undici's legacy (non-wrapped) handler shape: the cheapest path through its client. */
class UndiciCall implements UpstreamCall {
  #sink: UpstreamSink | null;
  #abort: ((err?: Error) => void) | null = null;
  #resume: (() => void) | null = null;
  #paused = false;
  #aborted = false;
  #headed = false;
  /** The client's clock when sent (for its headers limit). */
  readonly sentAt: number;

  constructor(sink: UpstreamSink, sentAt: number) {
    this.#sink = sink;
    this.sentAt = sentAt;
  }

  /** Still waiting for its final head (not answered, failed or aborted). */
  get waitingHead(): boolean {
    return !this.#headed && this.#sink !== null;
  }

  /** The headers limit passed: fails the call and closes its connection. */
  timeOut(): void {
    const s = this.#sink;
    if (s === null) return;
    this.abort();
    s.onUpstreamError(new UpstreamSocketError('timed out waiting for the endpoint', 'ETIMEDOUT'));
  }

  onConnect(abort: (err?: Error) => void): void {
    if (this.#aborted) abort(new AbortedByRouter());
    else this.#abort = abort;
  }

  onHeaders(statusCode: number, raw: Buffer[] | string[] | null, resume: () => void): boolean {
    if (statusCode < 200) return true; // 1xx informational
    this.#headed = true;
    this.#resume = resume;
    let contentType = '';
    let contentLength = -1;
    if (raw) {
      for (let i = 0; i + 1 < raw.length; i += 2) {
        const k = raw[i];
        const name = typeof k === 'string' ? Buffer.from(k) : k;
        if (name.length === 12 && eqLower(name, 'content-type')) contentType = raw[i + 1].toString('latin1'); // one char per byte, as the h1 and native clients
        else if (name.length === 14 && eqLower(name, 'content-length')) contentLength = Number(raw[i + 1].toString());
      }
    }
    this.#sink?.onUpstreamHeaders(statusCode, contentType, contentLength);
    return !this.#paused;
  }

  onData(chunk: Buffer): boolean {
    this.#sink?.onUpstreamData(chunk);
    return !this.#paused;
  }

  onComplete(): void {
    const s = this.#sink;
    this.#sink = null;
    s?.onUpstreamEnd();
  }

  onError(err: Error): void {
    const s = this.#sink;
    this.#sink = null;
    s?.onUpstreamError(err);
  }

  pause(): void {
    this.#paused = true;
  }

  resume(): void {
    if (!this.#paused) return;
    this.#paused = false;
    this.#resume?.();
  }

  abort(): void {
    if (this.#aborted) return;
    this.#aborted = true;
    this.#sink = null;
    this.#abort?.(new AbortedByRouter());
  }
}

export class UndiciUpstreamClient implements UpstreamClient {
  readonly #pools: (Pool | undefined)[] = [];
  readonly #cfg: ProxyConfig;
  /** Calls in sending order, for the headers sweep; entries before #waitFrom are done with. */
  #waiting: UndiciCall[] = [];
  #waitFrom = 0;
  /** Above this many entries after #waitFrom the list is filtered down to the waiting calls. */
  #compactAt = 1024;
  #sweep: NodeJS.Timeout | undefined;
  readonly #tickMs: number;
  /** Coarse clock (performance.now() at the last tick, or at a send that started the sweep). */
  #clock = 0;

  constructor(cfg: ProxyConfig = DEFAULTS.proxy) {
    this.#cfg = cfg;
    this.#tickMs = Math.max(5, Math.min(MAX_TICK_MS, Math.floor(cfg.headersTimeoutMs / 8)));
  }

  #pool(ep: Endpoint): Pool {
    let p = this.#pools[ep.id];
    if (!p) {
      const connector = buildConnector({ timeout: this.#cfg.connectTimeoutMs });
      p = new Pool(ep.url, {
        connections: this.#cfg.connectionsPerEndpoint,
        pipelining: 1,
        keepAliveTimeout: 60_000,
        connect: (opts, cb) =>
          connector(opts, (err, socket) => {
            // on a connect error undici passes no socket (undefined, not null): a throw here would
            // leave the request waiting forever
            if (err === null && socket) {
              try {
                patch100(socket);
              } catch {
                // undici's internals changed shape: a 100 stays an error (test/undici-client.test.ts)
              }
            }
            cb(err as Error, socket as never);
          }),
        headersTimeout: this.#cfg.headersTimeoutMs,
        bodyTimeout: this.#cfg.bodyTimeoutMs,
      });
      this.#pools[ep.id] = p;
    }
    return p;
  }

  forget(ep: Endpoint): void {
    const p = this.#pools[ep.id];
    this.#pools[ep.id] = undefined;
    void p?.close().catch(() => {});
  }

  send(ep: Endpoint, req: UpstreamRequest, sink: UpstreamSink): UpstreamCall {
    const limit = this.#cfg.headersTimeoutMs;
    if (limit > 0 && this.#sweep === undefined) {
      this.#clock = performance.now();
      this.#sweep = setInterval(() => this.#tick(), this.#tickMs);
      this.#sweep.unref();
    }
    const call = new UndiciCall(sink, this.#clock);
    if (limit > 0) this.#waiting.push(call);
    this.#pool(ep).dispatch(
      { method: req.method, path: req.path, headers: req.headers, body: req.body },
      call as unknown as Dispatcher.DispatchHandler,
    );
    return call;
  }

  /**
   * The headers sweep: fails calls whose final head has not come within
   * headersTimeoutMs of their send (the list is in sending order, so the scan
   * stops at the first call still in time), and stops when no call waits.
   */
  #tick(): void {
    const now = (this.#clock = performance.now());
    const limit = this.#cfg.headersTimeoutMs + this.#tickMs; // the clock is up to a tick old at send
    const w = this.#waiting;
    let i = this.#waitFrom;
    for (; i < w.length; i++) {
      const c = w[i]!;
      if (!c.waitingHead) continue;
      if (now - c.sentAt <= limit) break;
      c.timeOut();
    }
    // drop the calls done with, in place: the front ones once they are most of the list,
    // and the answered ones behind a long-waiting front call whenever the list has doubled
    // (amortised O(1) per send, whatever the limit)
    if (i === w.length) {
      w.length = 0;
      i = 0;
    } else if (i > 64 && i * 2 > w.length) {
      w.copyWithin(0, i);
      w.length -= i;
      i = 0;
    }
    if (w.length - i > this.#compactAt) {
      let k = 0;
      for (let j = i; j < w.length; j++) if (w[j]!.waitingHead) w[k++] = w[j]!;
      w.length = k;
      i = 0;
      this.#compactAt = Math.max(1024, 2 * k);
    }
    this.#waitFrom = i;
    if (w.length === 0) {
      clearInterval(this.#sweep);
      this.#sweep = undefined;
    }
  }

  async close(): Promise<void> {
    clearInterval(this.#sweep);
    this.#sweep = undefined;
    await Promise.all(this.#pools.map((p) => p?.destroy().catch(() => {})));
  }
}
