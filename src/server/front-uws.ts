// The uWebSockets.js front end: the router's routes on a uWS app (moved
// from core.ts unchanged in behaviour), listen with an OS-picked port, and
// the accept pause near the open-file limit (close the listening socket,
// listen again). Inference requests are HttpExchange / ResponsesExchange
// (http-exchange.ts), which read the body and write the director's answer.
import { KIND_CHAT, KIND_COMPLETION, KIND_EMBEDDINGS, KIND_PATHS } from '../director/director.js';
import { answerUnauthorized, errorBody, statusLine } from './http-errors.js';
import { isRefusal } from '../identity.js';
import { headerBytes, HttpExchange } from './http-exchange.js';
import { KIND_RESPONSES, mountResponseReads, ResponsesExchange } from './responses-http.js';
import { mountBatchRoutes } from './batch-http.js';
import { framingProblem, scanBaggage, scanTraceparent, scanTracestate } from './framing.js';
import { knownPaths, type FrontEnd, type FrontHost } from './front-end.js';
import { uws, type HttpRequest, type HttpResponse, type TemplatedApp, type us_listen_socket } from '../uws.js';

// Header names read on every inference request, as bytes: uWS converts a JS
// string argument into a fresh UTF-8 heap copy per call, a Buffer it reads in place.
const H_CONTENT_LENGTH = Buffer.from('content-length');
const H_REQUEST_ID = Buffer.from('x-request-id');
// the request whose headers the module-level getter reads (no closure per request)
let curReq: HttpRequest;
const getCurHeader = (name: string): string => curReq.getHeader(name);
const H_TRANSFER_ENCODING = Buffer.from('transfer-encoding');

const KNOWN_PATHS = knownPaths(KIND_PATHS);

function localPort(sock: us_listen_socket): number {
  return uws.us_socket_local_port(sock as unknown as Parameters<typeof uws.us_socket_local_port>[0]);
}

export class UwsFrontEnd implements FrontEnd {
  readonly name = 'uws' as const;
  readonly #h: FrontHost;
  readonly #app: TemplatedApp;
  #listenSocket: us_listen_socket | null = null;
  #host = '';
  #port = 0;

  constructor(host: FrontHost) {
    this.#h = host;
    this.#app = this.#routes(uws.App());
  }

  #routes(app: TemplatedApp): TemplatedApp {
    app.post('/v1/chat/completions', (res, req) => this.#inference(res, req, KIND_CHAT));
    app.post('/v1/completions', (res, req) => this.#inference(res, req, KIND_COMPLETION));
    // passthrough routes (embeddings, vLLM's score/rerank/tokenize/detokenize): same path, same handling, load-aware routing
    for (let kind = KIND_EMBEDDINGS; kind < KIND_PATHS.length; kind++) app.post(KIND_PATHS[kind]!, (res, req) => this.#inference(res, req, kind));
    if (this.#h.responses !== null) {
      app.post('/v1/responses', (res, req) => this.#inference(res, req, KIND_RESPONSES));
      mountResponseReads(app, this.#h);
    }
    mountBatchRoutes(app, this.#h);
    app.get('/v1/models', (res, req) => {
      if (this.#badlyFramed(res, req)) return;
      curReq = req;
      const caller = this.#h.callerOf(getCurHeader);
      if (isRefusal(caller)) return answerUnauthorized(this.#h, res, caller.refused);
      this.#json(res, 200, this.#h.modelsBodyFor(caller));
    });
    app.get('/healthz', (res, req) => {
      if (!this.#badlyFramed(res, req)) this.#json(res, 200, '{"status":"ok"}');
    });
    app.get('/readyz', (res, req) => {
      if (!this.#badlyFramed(res, req)) this.#readyz(res);
    });
    app.get('/metrics', (res, req) => {
      if (this.#badlyFramed(res, req)) return;
      // prom-client renders asynchronously: the response may be gone before the text is
      let aborted = false;
      res.onAborted(() => {
        aborted = true;
      });
      const contentType = this.#h.metrics.registry.contentType;
      this.#h.metrics.text().then(
        (body) => {
          if (aborted) return;
          res.cork(() => {
            res.writeStatus('200 OK').writeHeader('content-type', contentType).end(body, this.#h.draining);
          });
        },
        (err: unknown) => {
          this.#h.log.error({ err }, '/metrics: rendering failed');
          if (aborted) return;
          res.cork(() => {
            res.writeStatus(statusLine(500)).writeHeader('content-type', 'application/json');
            res.end(errorBody(500, 'metrics rendering failed'), this.#h.draining);
          });
        },
      );
    });
    app.any('/*', (res, req) => {
      if (this.#badlyFramed(res, req)) return;
      const url = req.getUrl();
      const method = req.getMethod().toUpperCase();
      const allowed = url === '/v1/responses' && this.#h.responses === null ? undefined : KNOWN_PATHS[url];
      if (method === 'HEAD') {
        // a HEAD answer has headers only, or the keep-alive connection goes out of sync
        const status = allowed === 'GET' ? 200 : allowed !== undefined ? 405 : 404;
        res.cork(() => {
          res.writeStatus(statusLine(status));
          if (status === 405) res.writeHeader('allow', allowed!);
          res.endWithoutBody();
        });
        return;
      }
      // uWS reads and drops the body of a request it has no onData for (by its
      // Content-Length or chunks), so the connection stays in step and can stay
      // open. Only a declared body over the limit closes it (not worth reading);
      // that answer is deferred, as a "Connection: close" written inside the
      // handler does not stop uWS from serving a request pipelined behind it.
      const cl = req.getHeader(H_CONTENT_LENGTH);
      const close = cl !== '' && Number(cl) > this.#h.limits.maxBodyBytes;
      const [status, message] =
        allowed !== undefined ? [405, `method ${method} is not allowed on ${url} (use ${allowed})`] : [404, `no route for ${method} ${url}`];
      if (close) this.#deferredError(res, status, message, allowed);
      else this.#error(res, status, message, false, allowed);
    });
    return app;
  }

  /**
   * Rejects ambiguous body framing (framingProblem) with 400 and a closed
   * connection; true if it did. GET routes check only when a Content-Length
   * or Transfer-Encoding is present (two header lookups, no header walk).
   */
  #badlyFramed(res: HttpResponse, req: HttpRequest, always = false): boolean {
    if (!always && req.getHeader(H_CONTENT_LENGTH) === '' && req.getHeader(H_TRANSFER_ENCODING) === '') return false;
    const problem = framingProblem(req);
    if (problem === '') return false;
    this.#deferredError(res, 400, `bad request framing: ${problem}`);
    return true;
  }

  /**
   * Answers `status` and closes the connection, after uWS has finished with
   * the bytes of this read. An answer written inside the handler is lost when
   * uWS then closes the socket itself (a body it cannot parse: the write is
   * still in its cork buffer), and uWS clears the close flag when the next
   * pipelined request of the same read starts, so it would serve that one.
   * Deferred, the request is still pending when uWS meets a pipelined one:
   * uWS closes the connection (no answer rather than a served hidden request).
   */
  #deferredError(res: HttpResponse, status: number, message: string, allow?: string): void {
    this.#h.metrics.countRequest('', -1, status);
    let gone = false;
    res.onAborted(() => {
      gone = true;
    });
    setImmediate(() => {
      if (gone) return;
      res.cork(() => {
        res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json');
        if (allow) res.writeHeader('allow', allow);
        res.end(errorBody(status, message), true);
      });
    });
  }

  #json(res: HttpResponse, status: number, body: string): void {
    res.cork(() => {
      res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json').end(body, this.#h.draining);
    });
  }

  #error(res: HttpResponse, status: number, message: string, close: boolean, allow?: string): void {
    this.#h.metrics.countRequest('', -1, status);
    res.cork(() => {
      res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json');
      if (allow) res.writeHeader('allow', allow);
      res.end(errorBody(status, message), close || this.#h.draining);
    });
  }

  #inference(res: HttpResponse, req: HttpRequest, kind: number): void {
    if (this.#badlyFramed(res, req, true)) return;
    const clText = req.getHeader(H_CONTENT_LENGTH);
    // who it is, before the body is read: a refused request is answered 401 and its body dropped
    curReq = req;
    const caller = this.#h.callerOf(getCurHeader);
    if (isRefusal(caller)) return answerUnauthorized(this.#h, res, caller.refused, clText);
    const contentLength = clText === '' ? -1 : Number(clText);
    let id = req.getHeader(H_REQUEST_ID);
    let idHeader: string | Buffer;
    if (id === '' || id.length > 256) idHeader = id = this.#h.newRequestId();
    else idHeader = headerBytes(id);
    const ctx = kind === KIND_RESPONSES ? new ResponsesExchange(this.#h, res, kind, id, idHeader, caller, contentLength) : new HttpExchange(this.#h, res, kind, id, idHeader, caller, contentLength);
    const names = this.#h.headerNames;
    let h: Record<string, string> | null = null;
    if (names.length > 0) {
      h = {};
      for (let i = 0; i < names.length; i++) h[names[i]] = req.getHeader(names[i]);
    }
    if (this.#h.sessionHeaderBytes !== null && kind < KIND_EMBEDDINGS) ctx.sessionHeader = req.getHeader(this.#h.sessionHeaderBytes);
    // the trace headers framingProblem() collected (#badlyFramed ran it): for every upstream leg
    if (scanTraceparent !== '' || scanTracestate !== '' || scanBaggage !== '') {
      h ??= {};
      if (scanTraceparent !== '') h.traceparent = scanTraceparent;
      if (scanTracestate !== '') h.tracestate = scanTracestate;
      if (scanBaggage !== '') h.baggage = scanBaggage;
    }
    if (h !== null) ctx.headers = h;
    this.#h.requestBegan(ctx);
    // bound methods, not arrow closures: uWS calls onData once per request, and a
    // fresh closure pays V8's lazy-code install on its first call
    res.onAborted(ctx.onClientAbort.bind(ctx));
    if (contentLength > this.#h.limits.maxBodyBytes) {
      ctx.reject(413, `request body of ${contentLength} bytes exceeds the limit of ${this.#h.limits.maxBodyBytes} bytes`);
      return;
    }
    ctx.readStart = this.#h.clock;
    this.#h.reading.add(ctx);
    res.onData(ctx.onBodyChunk.bind(ctx));
  }

  listen(host: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      const done = (sock: us_listen_socket | false): void => {
        if (!sock) {
          reject(new Error(`cannot listen on ${host}:${port} (address in use or not available)`));
          return;
        }
        this.#listenSocket = sock;
        this.#port = localPort(sock);
        this.#host = host;
        resolve(this.#port);
      };
      if (port !== 0) {
        this.#app.listen(host, port, done);
        return;
      }
      // An OS-picked port: uWS sets SO_REUSEADDR only on a listening socket given a port, and
      // without it the connections accepted on it keep a new listening socket from binding
      // there (listening again after a pause at the open-file limit). So: learn a free port,
      // then listen on it as on any configured port (a few tries in case another process takes it).
      for (let attempt = 0; attempt < 5; attempt++) {
        let picked = 0;
        this.#app.listen(host, 0, (probe) => {
          if (!probe) return;
          picked = localPort(probe);
          uws.us_listen_socket_close(probe);
        });
        if (picked === 0) break;
        let sock: us_listen_socket | false = false;
        this.#app.listen(host, picked, (s) => {
          sock = s;
        });
        if (sock) return done(sock);
      }
      done(false);
    });
  }


  pauseAccepting(): void {
    if (this.#listenSocket) uws.us_listen_socket_close(this.#listenSocket);
    this.#listenSocket = null;
  }

  resumeAccepting(): boolean {
    if (this.#listenSocket) return true;
    let ok = false;
    // uWS calls back synchronously
    this.#app.listen(this.#host, this.#port, (sock) => {
      if (!sock) return;
      this.#listenSocket = sock;
      ok = true;
    });
    return ok;
  }

  stopListening(): void {
    this.pauseAccepting();
  }

  close(): void {
    this.pauseAccepting();
    (this.#app as unknown as { close(): void }).close();
  }

  #readyz(res: HttpResponse): void {
    const [status, body] = this.#h.readiness();
    this.#json(res, status, body);
  }
}
