// The simulated engine's HTTP server: uWebSockets.js where its binary loads (Node 16/18/20), else
// node:http (every Node release). Both are seen through the small uWS-shaped surface the engine
// uses (SimHttpResponse, SimHttpRequest), so server.ts and call.ts are written once.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { uws, uwsProblem } from '../uws.js';

/** What the engine writes an answer with (a subset of uWS's HttpResponse, chainable as there). */
export interface SimHttpResponse {
  writeStatus(status: string): SimHttpResponse;
  /** A Buffer value is its bytes as sent (uWS writes a string as UTF-8). */
  writeHeader(key: string, value: string | Buffer): SimHttpResponse;
  write(chunk: string): boolean;
  /** Ends the answer; closeConnection adds `Connection: close` and closes after it. */
  end(body?: string, closeConnection?: boolean): SimHttpResponse;
  /** Runs fn with the socket's writes batched. */
  cork(fn: () => void): SimHttpResponse;
  /** Drops the connection at once (the answer is cut). */
  close(): SimHttpResponse;
  onAborted(handler: () => void): SimHttpResponse;
  /** Body chunks; each chunk's memory is valid only during the call. */
  onData(handler: (chunk: ArrayBuffer, isLast: boolean) => void): SimHttpResponse;
}

/** What the engine reads of a request (valid only inside the route handler, as with uWS). */
export interface SimHttpRequest {
  /** A header's value ('' when absent); name in lower case. */
  getHeader(name: string): string;
  /** The path, without the query. */
  getUrl(): string;
  /** The method in lower case. */
  getMethod(): string;
}

export type SimHandler = (res: SimHttpResponse, req: SimHttpRequest) => void;

export interface SimHttpApp {
  /** Which server this is. */
  readonly kind: 'uws' | 'node';
  post(path: string, h: SimHandler): void;
  get(path: string, h: SimHandler): void;
  /** Every request no other route took. */
  any(h: SimHandler): void;
  /** Resolves with the bound port; rejects when the address cannot be bound. */
  listen(host: string, port: number): Promise<number>;
  /** Stops listening and drops every connection. */
  close(): void;
}

export type SimFrontEnd = 'auto' | 'uws' | 'node';

/** The server for `frontEnd` (auto: uWS where its binary loads, else node:http). */
export function simHttpApp(frontEnd: SimFrontEnd): SimHttpApp {
  if (frontEnd === 'node') return new NodeApp();
  if (frontEnd === 'uws') return new UwsApp();
  return uwsProblem() === null ? new UwsApp() : new NodeApp();
}

class UwsApp implements SimHttpApp {
  readonly kind = 'uws' as const;
  readonly #app = uws.App();
  #listen: unknown = null;

  post(path: string, h: SimHandler): void {
    this.#app.post(path, h as never);
  }
  get(path: string, h: SimHandler): void {
    this.#app.get(path, h as never);
  }
  any(h: SimHandler): void {
    this.#app.any('/*', h as never);
  }
  listen(host: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      this.#app.listen(host, port, (sock) => {
        if (!sock) return reject(new Error(`cannot listen on ${host}:${port} (port in use or address unavailable)`));
        this.#listen = sock;
        resolve(uws.us_socket_local_port(sock as never));
      });
    });
  }
  close(): void {
    if (this.#listen !== null) uws.us_listen_socket_close(this.#listen as never);
    this.#listen = null;
    // Closes every remaining connection too (keep-alive sockets).
    (this.#app as unknown as { close?: () => void }).close?.();
  }
}

/** Idle keep-alive connections close after this, as uWS's do. */
const IDLE_MS = 10_000;

class NodeApp implements SimHttpApp {
  readonly kind = 'node' as const;
  readonly #routes = new Map<string, SimHandler>();
  #fallback: SimHandler = (res) => void res.writeStatus('404 Not Found').end();
  readonly #server: Server;

  constructor() {
    this.#server = createServer({ keepAliveTimeout: IDLE_MS, requestTimeout: 0, headersTimeout: IDLE_MS }, (req, res) => this.#serve(req, res));
    // a malformed request: node:http answers 400 and closes; nothing to do here
    this.#server.on('clientError', (_err, socket: Socket) => socket.destroy());
  }

  post(path: string, h: SimHandler): void {
    this.#routes.set('POST ' + path, h);
  }
  get(path: string, h: SimHandler): void {
    this.#routes.set('GET ' + path, h);
  }
  any(h: SimHandler): void {
    this.#fallback = h;
  }

  #serve(req: IncomingMessage, res: ServerResponse): void {
    const url = req.url ?? '/';
    const q = url.indexOf('?');
    const path = q < 0 ? url : url.slice(0, q);
    const h = this.#routes.get(req.method + ' ' + path) ?? this.#fallback;
    const r = new NodeResponse(req, res);
    h(r, { getHeader: (n) => headerText(req.headers[n]), getUrl: () => path, getMethod: () => (req.method ?? '').toLowerCase() });
    r.started();
  }

  listen(host: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      const onError = (err: Error) => reject(new Error(`cannot listen on ${host}:${port} (${err.message})`));
      this.#server.once('error', onError);
      this.#server.listen(port, host, () => {
        this.#server.off('error', onError);
        const a = this.#server.address();
        resolve(typeof a === 'object' && a !== null ? a.port : port);
      });
    });
  }

  close(): void {
    this.#server.close();
    this.#server.closeAllConnections();
  }
}

function headerText(v: string | string[] | undefined): string {
  return v === undefined ? '' : Array.isArray(v) ? v.join(', ') : v;
}

const EMPTY = new ArrayBuffer(0);

/** uWS's answer calls over one node:http request and response. */
class NodeResponse implements SimHttpResponse {
  #status = 200;
  #reason: string | undefined;
  #headers: [string, string][] = [];
  #headSent = false;
  #done = false;
  #aborted: (() => void) | null = null;
  #onData: ((chunk: ArrayBuffer, isLast: boolean) => void) | null = null;

  constructor(
    readonly req: IncomingMessage,
    readonly res: ServerResponse,
  ) {
    res.on('error', () => {});
    // the client left before the answer was finished
    res.on('close', () => {
      if (this.#done || res.writableFinished) return;
      this.#done = true;
      this.#aborted?.();
    });
  }

  /** After the route handler: a request whose handler read no body has it dropped. */
  started(): void {
    if (this.#onData === null) this.req.resume();
  }

  writeStatus(status: string): this {
    const sp = status.indexOf(' ');
    this.#status = Number(sp < 0 ? status : status.slice(0, sp));
    this.#reason = sp < 0 ? undefined : status.slice(sp + 1);
    return this;
  }

  writeHeader(key: string, value: string | Buffer): this {
    // node:http writes header strings one byte per char
    this.#headers.push([key, typeof value === 'string' ? value : value.toString('latin1')]);
    return this;
  }

  #head(): void {
    if (this.#headSent) return;
    this.#headSent = true;
    const res = this.res;
    res.statusCode = this.#status;
    if (this.#reason !== undefined) res.statusMessage = this.#reason;
    for (const [k, v] of this.#headers) res.appendHeader(k, v);
  }

  write(chunk: string): boolean {
    if (this.#done) return false;
    this.#head();
    return this.res.write(chunk);
  }

  end(body?: string, closeConnection?: boolean): this {
    if (this.#done) return this;
    this.#done = true;
    if (closeConnection === true && !this.#headSent) this.#headers.push(['Connection', 'close']);
    this.#head();
    this.res.end(body);
    return this;
  }

  cork(fn: () => void): this {
    this.res.cork();
    try {
      fn();
    } finally {
      this.res.uncork();
    }
    return this;
  }

  close(): this {
    this.#done = true;
    this.res.socket?.destroy();
    return this;
  }

  onAborted(handler: () => void): this {
    this.#aborted = handler;
    return this;
  }

  onData(handler: (chunk: ArrayBuffer, isLast: boolean) => void): this {
    this.#onData = handler;
    const req = this.req;
    req.on('data', (b: Buffer) => {
      if (this.#done) return;
      // uWS hands an ArrayBuffer of exactly the chunk (call.ts reads it from offset 0)
      handler(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength) as ArrayBuffer, false);
    });
    req.on('end', () => {
      if (!this.#done) handler(EMPTY, true);
    });
    return this;
  }
}
