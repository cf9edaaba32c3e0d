// One simulated engine: an OpenAI-compatible HTTP server (uWebSockets.js, or
// node:http where uWS does not load: http.ts) in front of a Scheduler (its routes, the P/D side doors, health, metrics and
// models). Several engines can share one process and event loop. Each POST is
// a Call (call.ts).

import { BOOTSTRAP_PATH, PULL_PATH, roomKey, RoomTable, TransferTable } from './pd.js';
import { simHttpApp, type SimHttpApp, type SimHttpRequest as HttpRequest, type SimHttpResponse as HttpResponse } from './http.js';
import { SimMetrics } from './metrics.js';
import { KvEventPublisher, resolveKvEventsConfig } from './kv-events.js';
import { resolveSimOptions, scaledCosts, type FailureKind, type ResolvedSimOptions, type SimOptions } from './options.js';
import { Scheduler, type SchedulerStats } from './scheduler.js';
import { Kind } from './request.js';
import { Call, type CallHost } from './call.js';
import { FailureInjector } from './failures.js';
import { mix32 } from './text.js';
import { JSON_TYPE, STATUS, echoId, errorBody } from './wire.js';

export interface SimEngineStats extends SchedulerStats {
  /** HTTP requests currently open (reading, waiting, running or delayed). */
  open: number;
  healthy: boolean;
}

export interface SimEngine {
  /** http://HOST:PORT */
  readonly url: string;
  readonly port: number;
  readonly options: ResolvedSimOptions;
  /** The HTTP server it listens with (options.frontEnd resolved). */
  readonly frontEnd: 'uws' | 'node';
  stats(): SimEngineStats;
  /** Marks the engine dead (GET /health answers 503) or alive again. */
  setHealthy(healthy: boolean): void;
  /** Changes failure injection at run time. */
  setFailures(rate: number, kinds?: FailureKind[]): void;
  /** Graceful shutdown: new requests 503, in-flight ones finish (up to graceMs), then close. */
  drain(graceMs?: number): Promise<void>;
  /** Drops every idle cached KV block. */
  clearCache(): void;
  /** An engine restart as the fleet sees it: the cache is gone, the KV-event publisher starts again at seq 0 (POST /sim/restart). */
  restart(): void;
  /**
   * Starts (names) or stops (null) recording the named request headers of
   * every POST, for tests that check what a router forwards; the last 256 are
   * kept, oldest first. Off by default (then no cost).
   */
  recordHeaders(names: readonly string[] | null): void;
  /** The recorded requests: path and the named headers ('' when absent). */
  recorded(): { path: string; headers: Record<string, string> }[];
  /** The KV-event publisher (null unless kvEventsConfig enables it): its bound addresses, restart (seq 0). */
  readonly kvEvents: KvEventPublisher | null;
  /** The inter-token latencies so far, model ms (empty unless options.keepItlSamples). */
  itlSamples(): readonly number[];
  /** Renders /metrics text (what GET /metrics serves). */
  metricsText(): Promise<string>;
  /** Stops listening, drops open connections and frees everything. Idempotent. */
  close(): Promise<void>;
}

/** Routes that answer at once, without generating (the pooling and tokenizer routes). */
const INSTANT_ROUTES: [string, Kind][] = [
  ['/tokenize', Kind.Tokenize],
  ['/detokenize', Kind.Detokenize],
  ['/v1/embeddings', Kind.Embeddings],
  ['/score', Kind.Score],
  ['/v1/score', Kind.Score],
  ['/rerank', Kind.Rerank],
  ['/v1/rerank', Kind.Rerank],
  ['/v2/rerank', Kind.Rerank],
];
const POST_PATHS = new Set(['/v1/completions', '/v1/chat/completions', ...INSTANT_ROUTES.map(([p]) => p), '/sim/restart', '/v1/load_lora_adapter', '/v1/unload_lora_adapter']);

export class Engine implements SimEngine, CallHost {
  readonly options: ResolvedSimOptions;
  readonly sched: Scheduler;
  readonly #metrics: SimMetrics;
  readonly calls = new Set<Call>();
  readonly modelJson = new Map<string, string>();
  /** LoRA adapter name → hash salt. */
  readonly loraSalt = new Map<string, number>();
  /** LoRA adapter name → its integer id in KV events (vLLM's lora_int_id: 1, 2, ...). */
  readonly loraId = new Map<string, number>();
  /** Adapters served now (at start and loaded since, less those unloaded): name → path (`root` in /v1/models). */
  readonly loraPath = new Map<string, string>();
  #nextLoraId = 1;
  readonly kvEvents: KvEventPublisher | null;
  readonly engineId: string;
  readonly idPrefix: string;
  readonly failures: FailureInjector;
  healthy = true;
  /** Transfers this engine holds for decode engines (a prefill with do_remote_decode). */
  readonly transfers: TransferTable;
  /** SGLang bootstrap rooms this engine (a prefill server) has seen, for its decode sides. */
  readonly rooms: RoomTable;
  /** Date.now() until which the engine is "loading" (health 503, requests 503). */
  loadingUntil = 0;
  /** drain() began: health 503, no new requests. */
  draining = false;
  #app: SimHttpApp | null = null;
  #port = 0;
  #closed: Promise<void> | null = null;
  #recordNames: readonly string[] | null = null;
  #recorded: { path: string; headers: Record<string, string> }[] = [];

  /** `salt` separates the failure draws of the engines of a fleet (their text stays the same). */
  constructor(opts: ResolvedSimOptions, salt = 0) {
    this.options = opts;
    this.sched = new Scheduler(scaledCosts(opts));
    this.#metrics = new SimMetrics(opts, this.sched);
    for (const m of opts.models) this.modelJson.set(m, JSON.stringify(m));
    for (const m of opts.loras) this.#addLora(m, opts.loraPaths[m] ?? m);
    const kv = resolveKvEventsConfig(opts.kvEventsConfig);
    this.kvEvents = kv === null ? null : new KvEventPublisher(kv, salt);
    if (this.kvEvents !== null) this.sched.cache.setEvents(this.kvEvents);
    this.failures = new FailureInjector(opts, salt);
    this.engineId = `sim-${process.pid}-${(Math.random() * 0xffffffff) >>> 0}`;
    this.transfers = new TransferTable(opts.kvTransferTtlMs);
    this.rooms = new RoomTable(opts.kvTransferTtlMs);
    this.loadingUntil = opts.loadingMs > 0 ? Date.now() + opts.loadingMs : 0;
    this.idPrefix = ((Math.random() * 0xffffff) >>> 0).toString(16) + '-';
  }

  /** Registers an adapter: its id, its hash salt (its KV blocks are its own), its name as a model. */
  #addLora(name: string, path: string): void {
    const id = this.#nextLoraId++;
    this.modelJson.set(name, JSON.stringify(name));
    this.loraSalt.set(name, mix32(0x10a + id - 1) + 1);
    this.loraId.set(name, id);
    this.loraPath.set(name, path);
  }

  /**
   * POST /v1/load_lora_adapter {lora_name, lora_path} and POST
   * /v1/unload_lora_adapter {lora_name} (vLLM's runtime API): 200 with a
   * plain-text line, 400 for a bad body or an adapter already loaded, 404 to
   * unload one that is not. A load answers after loraLoadMs (model time).
   */
  #loraRoute(res: HttpResponse, load: boolean): void {
    const o = this.options;
    readSideBody(res, o.maxBodyBytes, (text, gone) => {
      const fail = (status: number, msg: string, param: string | null = null) => {
        if (!gone()) res.cork(() => res.writeStatus(STATUS[status]!).writeHeader('Content-Type', JSON_TYPE).end(errorBody(status, msg, param, o.legacy)));
      };
      const ok = (msg: string) => {
        if (!gone()) res.cork(() => res.writeHeader('Content-Type', 'text/plain; charset=utf-8').end(msg));
      };
      if (!o.enableLora) return fail(400, 'LoRA is not enabled on this server (start it with --enable-lora)');
      let b: Record<string, unknown>;
      try {
        const j = JSON.parse(text) as unknown;
        if (typeof j !== 'object' || j === null || Array.isArray(j)) throw new TypeError('not an object');
        b = j as Record<string, unknown>;
      } catch {
        return fail(400, 'the request body must be a JSON object');
      }
      const name = b.lora_name;
      const path = b.lora_path;
      if (!load) {
        if (typeof name !== 'string' || name === '') return fail(400, "'lora_name' must be provided", 'lora_name');
        if (!this.loraPath.has(name)) return fail(404, `The lora adapter '${name}' cannot be found.`, 'lora_name');
        this.loraPath.delete(name);
        this.modelJson.delete(name);
        this.sched.dropLora(name);
        return ok(`Success: LoRA adapter '${name}' removed successfully.`);
      }
      if (typeof name !== 'string' || name === '' || typeof path !== 'string' || path === '') return fail(400, "Both 'lora_name' and 'lora_path' must be provided.");
      if (this.loraPath.has(name) || o.models.includes(name)) return fail(400, `The lora adapter '${name}' has already been loaded.`, 'lora_name');
      const done = () => {
        if (o.loraLoadFail) return fail(500, `failed to load LoRA adapter '${name}' from ${path}`);
        if (!this.loraPath.has(name)) this.#addLora(name, path);
        ok(`Success: LoRA adapter '${name}' added successfully.`);
      };
      const wait = o.loraLoadMs * o.timeScale;
      if (wait > 0) setTimeout(done, wait).unref();
      else done();
    });
  }

  get port(): number {
    return this.#port;
  }
  get frontEnd(): 'uws' | 'node' {
    return this.#app?.kind ?? (this.options.frontEnd === 'uws' ? 'uws' : 'node');
  }
  get url(): string {
    const h = this.options.host;
    const host = h === '0.0.0.0' ? '127.0.0.1' : h.includes(':') ? `[${h}]` : h;
    return `http://${host}:${this.#port}`;
  }

  async listen(): Promise<void> {
    if (this.kvEvents !== null) await this.kvEvents.open();
    try {
      await this.#listenHttp();
    } catch (err) {
      this.kvEvents?.close();
      throw err;
    }
  }

  #listenHttp(): Promise<void> {
    const o = this.options;
    const app = simHttpApp(o.frontEnd);
    this.#app = app;
    app.post('/v1/completions', (res, req) => this.#post(res, req, Kind.Completion));
    app.post('/v1/chat/completions', (res, req) => this.#post(res, req, Kind.Chat));
    for (const [path, kind] of INSTANT_ROUTES) app.post(path, (res, req) => this.#post(res, req, kind));
    app.post(PULL_PATH, (res) => this.#pull(res));
    app.post(BOOTSTRAP_PATH, (res) => this.#bootstrap(res));
    app.post('/v1/load_lora_adapter', (res) => this.#loraRoute(res, true));
    app.post('/v1/unload_lora_adapter', (res) => this.#loraRoute(res, false));
    // an engine restart as the fleet sees it (docs/sim.md): the cache is gone and the publisher starts at seq 0
    app.post('/sim/restart', (res) => {
      res.onAborted(() => {});
      this.restart();
      res.writeHeader('Content-Type', JSON_TYPE).end('{"restarted":true}');
    });
    app.get('/health', (res, req) => {
      const rid = req.getHeader('x-request-id');
      res.writeStatus(this.healthy && !this.draining && !this.loading() ? '200 OK' : '503 Service Unavailable');
      if (rid !== '') res.writeHeader('x-request-id', echoId(rid));
      res.end();
    });
    app.get('/metrics', (res) => {
      // prom-client renders asynchronously: the client may be gone before the text is
      let gone = false;
      res.onAborted(() => {
        gone = true;
      });
      this.metricsText().then(
        (text) => {
          if (!gone) res.cork(() => res.writeHeader('Content-Type', this.#metrics.registry.contentType).end(text));
        },
        () => {
          if (!gone) res.cork(() => res.writeStatus('500 Internal Server Error').end());
        },
      );
    });
    app.get('/v1/models', (res, req) => {
      const rid = req.getHeader('x-request-id');
      res.writeHeader('Content-Type', JSON_TYPE);
      if (rid !== '') res.writeHeader('x-request-id', echoId(rid));
      res.end(this.#modelsBody());
    });
    app.get('/version', (res) => {
      res.writeHeader('Content-Type', JSON_TYPE).end(JSON.stringify({ version: o.revision, engine: o.engine, role: o.role }));
    });
    app.any((res, req) => {
      const method = req.getMethod();
      const url = req.getUrl();
      const known = POST_PATHS.has(url) || url === '/health' || url === '/metrics' || url === '/v1/models';
      const status = known ? 405 : 404;
      res.writeStatus(STATUS[status]!).writeHeader('Content-Type', JSON_TYPE);
      const msg = known ? `method ${method.toUpperCase()} not allowed on ${url}` : `no route for ${method.toUpperCase()} ${url}`;
      // A response to HEAD carries no body (RFC 9110 9.3.2): the client reads
      // none, so body bytes would be parsed as the next response on its
      // keep-alive connection. (Not endWithoutBody(length): in uWS 20.30 that
      // does not count as responding, and uWS aborts the process.)
      if (method.toLowerCase() === 'head') res.end();
      else res.end(errorBody(status, msg, null, o.legacy));
    });
    return app.listen(o.host, o.port).then(
      (port) => {
        this.#port = port;
      },
      (err: Error) => {
        throw new Error(`switchyard sim: ${err.message}`);
      },
    );
  }

  #modelsBody(): string {
    const o = this.options;
    const created = Math.floor(Date.now() / 1000);
    const base = o.models.map((m) => ({ id: m, object: 'model', created, owned_by: o.engine, root: o.models[0], parent: null, max_model_len: o.maxModelLen }));
    const loras = [...this.loraPath].map(([m, path]) => ({ id: m, object: 'model', created, owned_by: o.engine, root: path, parent: o.models[0], max_model_len: o.maxModelLen }));
    return JSON.stringify({ object: 'list', data: [...base, ...loras] });
  }

  loading(): boolean {
    if (this.loadingUntil === 0) return false;
    if (Date.now() < this.loadingUntil) return true;
    this.loadingUntil = 0;
    return false;
  }

  /** A decode engine reads a transfer this engine holds (the simulator's stand-in for the NIXL read). */
  #pull(res: HttpResponse): void {
    readSideBody(res, this.options.maxBodyBytes, (text) => {
      let id: unknown;
      try {
        id = (JSON.parse(text) as Record<string, unknown>).remote_request_id;
      } catch {
        id = undefined;
      }
      const ok = typeof id === 'string' && this.transfers.take(id);
      res.cork(() => {
        if (ok) res.writeHeader('Content-Type', JSON_TYPE).end('{"ok":true}');
        else
          res
            .writeStatus(STATUS[404] ?? '404 Not Found')
            .writeHeader('Content-Type', JSON_TYPE)
            .end(errorBody(404, `no KV transfer ${JSON.stringify(id)} held by engine ${this.engineId} (unknown, expired or already read)`, null, false));
      });
    });
  }

  /**
   * The bootstrap server of a prefill engine (SGLang): a decode engine asks
   * for a room and the answer comes once that room's prefill is done (200),
   * or failed, expired, was taken, or never arrived within the wait (404).
   */
  #bootstrap(res: HttpResponse): void {
    readSideBody(res, this.options.maxBodyBytes, (text, gone) => {
      let room: string;
      let timeoutMs = this.options.bootstrapTimeoutMs;
      try {
        const b = JSON.parse(text) as Record<string, unknown>;
        room = roomKey(b.bootstrap_room);
        if (typeof b.timeout_ms === 'number' && b.timeout_ms >= 0) timeoutMs = Math.min(b.timeout_ms, 600_000);
      } catch {
        res.cork(() => res.writeStatus(STATUS[400]!).writeHeader('Content-Type', JSON_TYPE).end(errorBody(400, 'expected {"bootstrap_room": <integer>}', 'bootstrap_room')));
        return;
      }
      const answer = (problem: string | null): void => {
        if (gone()) return;
        res.cork(() => {
          if (problem === null) res.writeHeader('Content-Type', JSON_TYPE).end('{"ok":true}');
          else res.writeStatus(STATUS[404]!).writeHeader('Content-Type', JSON_TYPE).end(errorBody(404, `bootstrap room ${room} on engine ${this.engineId}: ${problem}`, null));
        });
      };
      void this.rooms.wait(room, timeoutMs).then(answer);
    });
  }

  #post(res: HttpResponse, req: HttpRequest, kind: Kind): void {
    const names = this.#recordNames;
    if (names !== null) {
      const headers: Record<string, string> = {};
      for (const n of names) headers[n] = req.getHeader(n);
      if (this.#recorded.length >= 256) this.#recorded.shift();
      this.#recorded.push({ path: req.getUrl(), headers });
    }
    if (this.draining || this.loading()) {
      res.writeStatus('503 Service Unavailable').writeHeader('Content-Type', JSON_TYPE);
      res.end(errorBody(503, this.draining ? 'the engine is shutting down' : 'the model is loading', null, this.options.legacy));
      return;
    }
    const call = new Call(this, res, kind, req.getHeader('x-request-id'));
    this.calls.add(call);
    res.onAborted(() => call.onAborted());
    res.onData((chunk, isLast) => call.onData(chunk, isLast));
  }

  stats(): SimEngineStats {
    return { ...this.sched.stats(), open: this.calls.size, healthy: this.healthy };
  }

  setHealthy(healthy: boolean): void {
    this.healthy = healthy;
  }

  setFailures(rate: number, kinds?: FailureKind[]): void {
    this.failures.set(this.options, rate, kinds);
  }

  clearCache(): void {
    this.sched.clearCache();
  }

  /**
   * What a restart does to the cache, without dropping connections: every cached block (GPU and host
   * tier) is gone, and the KV-event publisher reopens at seq 0 with an empty replay buffer; the removals
   * are not published (a restarted engine knows nothing of its old blocks). Requests in flight keep
   * running (a real restart would fail them), but their blocks are freed when they end, not cached.
   */
  restart(): void {
    this.sched.cache.forgetAll();
    if (this.kvEvents !== null) void this.kvEvents.restart().catch(() => {});
  }

  recordHeaders(names: readonly string[] | null): void {
    this.#recordNames = names === null ? null : names.map((n) => n.toLowerCase());
    this.#recorded = [];
  }

  recorded(): { path: string; headers: Record<string, string> }[] {
    return this.#recorded.map((r) => ({ path: r.path, headers: { ...r.headers } }));
  }

  itlSamples(): readonly number[] {
    return this.sched.itlSamples ?? [];
  }

  metricsText(): Promise<string> {
    return this.#metrics.text();
  }

  /**
   * Graceful shutdown: health 503 and new requests 503 at once (a router
   * stops sending), requests in flight run to their end (up to graceMs), then close().
   */
  async drain(graceMs = 30_000): Promise<void> {
    this.draining = true;
    const t0 = Date.now();
    while (this.calls.size > 0 && Date.now() - t0 < graceMs) await new Promise((r) => setTimeout(r, 10));
    await this.close();
  }

  close(): Promise<void> {
    if (this.#closed !== null) return this.#closed;
    this.#closed = new Promise((resolve) => {
      for (const call of this.calls) {
        call.aborted = true;
        if (call.delay !== null) clearTimeout(call.delay);
        if (call.req !== null) this.sched.abort(call.req);
      }
      this.calls.clear();
      this.rooms.clear('the prefill server went away');
      this.kvEvents?.close();
      this.#app?.close();
      this.#app = null;
      setImmediate(resolve);
    });
    return this.#closed;
  }
}

/**
 * Reads the small JSON body of a side-door POST (P/D pull, bootstrap) and hands it over once whole, unless
 * the client left; a body over `max` bytes is answered 413 at once. `gone()` tells later whether it left.
 */
function readSideBody(res: HttpResponse, max: number, onBody: (text: string, gone: () => boolean) => void): void {
  let text = '';
  let bytes = 0;
  let gone = false;
  res.onAborted(() => (gone = true));
  res.onData((chunk, isLast) => {
    if (gone) return;
    bytes += chunk.byteLength;
    if (bytes > max) {
      gone = true;
      res.cork(() => res.writeStatus(STATUS[413]!).writeHeader('Content-Type', JSON_TYPE).end(errorBody(413, `request body exceeds ${max} bytes`, null), true));
      return;
    }
    text += Buffer.from(chunk).toString('utf8');
    if (isLast) onBody(text, () => gone);
  });
}

/** Starts one simulated engine; resolves once it listens. */
export function startEngine(opts: SimOptions = {}): Promise<SimEngine> {
  return startSaltedEngine(opts, 0);
}

/** startEngine for engine `salt` of a fleet (distinct failure draws). */
export async function startSaltedEngine(opts: SimOptions, salt: number): Promise<SimEngine> {
  const engine = new Engine(resolveSimOptions(opts), salt);
  await engine.listen();
  return engine;
}

