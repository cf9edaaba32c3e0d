// UpstreamClient over undici: one keep-alive Pool per endpoint (pipelining 1),
// driven through the raw dispatch handler API (no streams, no promises per
// request): the handler forwards callbacks to the sink and exposes
// pause/resume/abort through undici's dispatch controller.
import { Pool, type Dispatcher } from 'undici';
import type { ProxyConfig } from '../config/schema.js';
import { DEFAULTS } from '../config/schema.js';
import type { Endpoint } from '../endpoints/endpoint.js';
import type { UpstreamCall, UpstreamClient, UpstreamHeaders, UpstreamRequest, UpstreamSink } from './upstream.js';

class AbortedByRouter extends Error {
  constructor() {
    super('aborted by the router');
    this.name = 'AbortError';
  }
}
const ABORTED = new AbortedByRouter();

class UndiciCall implements UpstreamCall, Dispatcher.DispatchHandler {
  #sink: UpstreamSink | null;
  #controller: Dispatcher.DispatchController | null = null;
  #paused = false;
  #aborted = false;

  constructor(sink: UpstreamSink) {
    this.#sink = sink;
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller;
    if (this.#aborted) controller.abort(ABORTED);
    else if (this.#paused) controller.pause();
  }

  onResponseStart(controller: Dispatcher.DispatchController, statusCode: number, headers: UpstreamHeaders): void {
    this.#controller = controller;
    if (this.#paused) controller.pause();
    this.#sink?.onUpstreamHeaders(statusCode, headers);
  }

  onResponseData(_c: Dispatcher.DispatchController, chunk: Buffer): void {
    this.#sink?.onUpstreamData(chunk);
  }

  onResponseEnd(): void {
    const s = this.#sink;
    this.#sink = null;
    s?.onUpstreamEnd();
  }

  onResponseError(_c: Dispatcher.DispatchController, err: Error): void {
    const s = this.#sink;
    this.#sink = null;
    s?.onUpstreamError(err);
  }

  pause(): void {
    this.#paused = true;
    this.#controller?.pause();
  }

  resume(): void {
    this.#paused = false;
    this.#controller?.resume();
  }

  abort(): void {
    if (this.#aborted) return;
    this.#aborted = true;
    this.#sink = null;
    this.#controller?.abort(ABORTED);
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
    this.#pool(ep).dispatch({ method: req.method, path: req.path, headers: req.headers, body: req.body }, call);
    return call;
  }

  async close(): Promise<void> {
    await Promise.all(this.#pools.map((p) => p?.destroy().catch(() => {})));
  }
}
