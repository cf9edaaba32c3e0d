// UpstreamClient over undici: one keep-alive Pool per endpoint (pipelining 1),
// driven through undici's raw dispatch handler (no streams, no promise per
// request, no header object: the two headers the relay needs are read from
// the raw header list). Backpressure: onData returns false while paused, and
// undici's resume callback restarts the flow.
import { Pool, type Dispatcher } from 'undici';
import type { ProxyConfig } from '../config/schema.js';
import { DEFAULTS } from '../config/schema.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import type { UpstreamCall, UpstreamClient, UpstreamRequest, UpstreamSink } from './upstream.js';

class AbortedByRouter extends Error {
  constructor() {
    super('aborted by the router');
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

  constructor(sink: UpstreamSink) {
    this.#sink = sink;
  }

  onConnect(abort: (err?: Error) => void): void {
    if (this.#aborted) abort(new AbortedByRouter());
    else this.#abort = abort;
  }

  onHeaders(statusCode: number, raw: Buffer[] | string[] | null, resume: () => void): boolean {
    if (statusCode < 200) return true; // 1xx informational
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

  constructor(cfg: ProxyConfig = DEFAULTS.proxy) {
    this.#cfg = cfg;
  }

  #pool(ep: Endpoint): Pool {
    let p = this.#pools[ep.id];
    if (!p) {
      p = new Pool(ep.url, {
        connections: this.#cfg.connectionsPerEndpoint,
        pipelining: 1,
        keepAliveTimeout: 60_000,
        connectTimeout: this.#cfg.connectTimeoutMs,
        headersTimeout: this.#cfg.headersTimeoutMs,
        bodyTimeout: this.#cfg.bodyTimeoutMs,
      });
      this.#pools[ep.id] = p;
    }
    return p;
  }

  send(ep: Endpoint, req: UpstreamRequest, sink: UpstreamSink): UpstreamCall {
    const call = new UndiciCall(sink);
    this.#pool(ep).dispatch(
      { method: req.method, path: req.path, headers: req.headers, body: req.body },
      call as unknown as Dispatcher.DispatchHandler,
    );
    return call;
  }

  async close(): Promise<void> {
    await Promise.all(this.#pools.map((p) => p?.destroy().catch(() => {})));
  }
}
