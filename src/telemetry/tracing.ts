// OpenTelemetry tracing of requests, exported over OTLP (HTTP/protobuf or
// gRPC) with the official OpenTelemetry JS SDK. Off by default: the router then
// never loads this module's OpenTelemetry imports (startRouter imports it only
// when `tracing.enabled`), and the director's only cost is a null check.
//
// On, the head-sampling decision is made once per request, before any span
// exists: an unsampled request allocates nothing here. A sampled request gets
// one RequestTrace: a SERVER span for the request, child spans for admission
// (queue wait), scheduling (chosen endpoint, score, prefix blocks) and one
// CLIENT span per upstream leg (a retry is a second leg) with its time to
// first byte. Attribute names follow the OpenTelemetry GenAI semantic
// conventions (gen_ai.*) and the HTTP/server ones; Switchyard's own are
// `switchyard.*`.
//
// Export never blocks a request and its memory is bounded: finished spans wait
// in a queue of `maxQueueSize`; when the collector is slow or down the queue
// fills and further spans are dropped and counted
// (switchyard_tracing_spans_dropped_total). One export runs at a time, each
// bounded by `exportTimeoutMs`.
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, TraceFlags, type Context, type Span, type Tracer } from '@opentelemetry/api';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { AlwaysOnSampler, BasicTracerProvider, type ReadableSpan, type SpanExporter, type SpanProcessor } from '@opentelemetry/sdk-trace-base';
import { connect } from 'node:net';
import type { Logger } from 'pino';
import type { TracingConfig } from '../config/tracing.js';
import { redactUrl } from '../config/defaults.js';
import { formatTraceparent, sampledFlag, validTraceparent, type TraceCarrier } from '../proxy/trace-context.js';

/** Counters of the export pipeline (read by /metrics). */
export interface ExportStats {
  /** Spans handed to the exporter and acknowledged. */
  exported: number;
  /** Spans dropped because the queue was full (collector slow or down). */
  dropped: number;
  /** Spans lost in exports that failed (collector down, timeout, refused). */
  failed: number;
  /** Spans waiting for export now. */
  readonly queued: number;
}

/** A queue of finished spans with a hard bound, exported in batches; never blocks, drops and counts when full. */
export class BoundedExportProcessor implements SpanProcessor, ExportStats {
  exported = 0;
  dropped = 0;
  failed = 0;
  readonly #exporter: SpanExporter;
  readonly #max: number;
  readonly #batch: number;
  #queue: ReadableSpan[] = [];
  #inFlight = false;
  #timer: NodeJS.Timeout | null;
  #idle: (() => void)[] = [];
  /** Told each export's result (`error`: why it failed, '' when it succeeded): the tracer logs the changes. */
  onResult: ((ok: boolean, error: string) => void) | null = null;

  constructor(exporter: SpanExporter, o: { maxQueueSize: number; maxExportBatchSize: number; exportIntervalMs: number }) {
    this.#exporter = exporter;
    this.#max = o.maxQueueSize;
    this.#batch = Math.min(o.maxExportBatchSize, o.maxQueueSize);
    this.#timer = setInterval(() => this.#flush(), o.exportIntervalMs);
    this.#timer.unref();
  }

  get queued(): number {
    return this.#queue.length;
  }

  onStart(): void {}

  onEnd(span: ReadableSpan): void {
    if ((span.spanContext().traceFlags & TraceFlags.SAMPLED) === 0) return;
    if (this.#queue.length >= this.#max) {
      this.dropped++;
      return;
    }
    this.#queue.push(span);
    if (this.#queue.length >= this.#batch) this.#flush();
  }

  #flush(): void {
    if (this.#inFlight) return;
    if (this.#queue.length === 0) {
      for (const w of this.#idle.splice(0)) w();
      return;
    }
    const batch = this.#queue.length <= this.#batch ? this.#queue : this.#queue.slice(0, this.#batch);
    this.#queue = batch === this.#queue ? [] : this.#queue.slice(this.#batch);
    this.#inFlight = true;
    let settled = false;
    const done = (ok: boolean, error = '') => {
      if (settled) return;
      settled = true;
      this.#inFlight = false;
      if (ok) this.exported += batch.length;
      else this.failed += batch.length;
      try {
        this.onResult?.(ok, error);
      } catch {
        // the log hook: never into the exporter's callback
      }
      // more waiting (or someone waiting for the queue to empty): go on
      if (this.#queue.length >= this.#batch || this.#idle.length > 0) setImmediate(() => this.#flush());
    };
    try {
      this.#exporter.export(batch, (r) => done(r.code === 0, r.error?.message ?? 'the export failed'));
    } catch (err) {
      done(false, (err as Error)?.message ?? String(err));
    }
  }

  /** Exports everything queued now; resolves when the queue is empty (or after `timeoutMs`). */
  forceFlush(timeoutMs = 30_000): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(resolve, timeoutMs);
      t.unref();
      this.#idle.push(() => {
        clearTimeout(t);
        resolve();
      });
      this.#flush();
    });
  }

  async shutdown(): Promise<void> {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
    await this.forceFlush(5000);
    await this.#exporter.shutdown();
  }
}

/** gen_ai.operation.name of the router's request kinds (KIND_CHAT = 0, KIND_COMPLETION = 1). */
const OPERATIONS = ['chat', 'text_completion'];

/** What a trace needs of an endpoint (structurally the router's Endpoint). */
export interface TracedEndpoint {
  readonly name: string;
  readonly url: string;
  readonly engine: string;
}

/** The tracer of one router: the sampling decision and the OpenTelemetry pipeline. */
export class RequestTracer {
  readonly config: TracingConfig;
  readonly stats: ExportStats;
  readonly tracer: Tracer;
  readonly #provider: BasicTracerProvider;
  /** A new trace is sampled when random() < this. */
  readonly #ratio: number;
  readonly #random: () => number;
  readonly #log: Logger | null;
  /** Whether the collector answers: null until known; false once a line said it does not (the next one says when it answers again). */
  #reachable: boolean | null = null;

  constructor(config: TracingConfig, exporter: SpanExporter, opts: { version?: string; random?: () => number; log?: Logger } = {}) {
    this.config = config;
    this.#ratio = config.sampleRatio;
    this.#random = opts.random ?? Math.random;
    this.#log = opts.log ?? null;
    const processor = new BoundedExportProcessor(exporter, config);
    processor.onResult = (ok, error) => (ok ? this.#answered() : this.#unreachable(error));
    this.stats = processor;
    this.#provider = new BasicTracerProvider({
      // the decision is ours (before any span object exists); every span we start is recorded
      sampler: new AlwaysOnSampler(),
      resource: resourceFromAttributes({ 'service.name': config.serviceName, 'service.version': opts.version ?? '' }),
      spanProcessors: [processor],
    });
    this.tracer = this.#provider.getTracer('switchyard', opts.version);
  }

  /**
   * Head sampling for one request: a RequestTrace when it is recorded, null
   * (and nothing allocated) when not. With `parentBased`, a valid incoming
   * traceparent's sampled flag decides; otherwise `sampleRatio`.
   */
  start(carrier: TraceCarrier, kind: number, requestId: string, startTime: number): RequestTrace | null {
    const tp = carrier.traceparent;
    const parent = tp !== undefined && tp !== '' && validTraceparent(tp) ? tp : '';
    if (parent !== '' && this.config.parentBased) {
      if (!sampledFlag(parent)) return null;
    } else if (!(this.#random() < this.#ratio)) return null;
    let ctx: Context = ROOT_CONTEXT;
    if (parent !== '') {
      ctx = trace.setSpanContext(ROOT_CONTEXT, {
        traceId: parent.slice(3, 35),
        spanId: parent.slice(36, 52),
        traceFlags: TraceFlags.SAMPLED,
        isRemote: true,
      });
    }
    return new RequestTrace(this.tracer, ctx, kind, requestId, startTime);
  }

  /**
   * The start's check of the collector (not awaited by the start): a TCP connection to its host and port,
   * bounded by exportTimeoutMs (at most 5 s). One that does not resolve or does not answer is one warn line
   * naming the block and the URL; the router serves on without it.
   */
  async checkCollector(): Promise<void> {
    const why = await probeCollector(this.config.endpoint, Math.min(this.config.exportTimeoutMs, 5000));
    if (why !== null) this.#unreachable(why);
  }

  #unreachable(why: string): void {
    if (this.#reachable === false) return;
    this.#reachable = false;
    const url = redactUrl(this.config.endpoint);
    this.#log?.warn(
      { event: 'tracing.unreachable', block: 'tracing.endpoint', url, protocol: this.config.protocol, err: why },
      `tracing (tracing.endpoint): the OTLP collector at ${url} cannot be reached: ${why}; serving without it: sampled spans are still queued and each export tried every ${this.config.exportIntervalMs} ms, a failed export's spans are dropped and counted (switchyard_tracing_spans_failed_total; logged again when it answers)`,
    );
  }

  #answered(): void {
    if (this.#reachable === false) this.#log?.info({ event: 'tracing.reachable', block: 'tracing.endpoint', url: redactUrl(this.config.endpoint) }, `tracing (tracing.endpoint): the OTLP collector answers again`);
    this.#reachable = true;
  }

  /** Exports what is queued (tests, shutdown). */
  flush(): Promise<void> {
    return (this.stats as BoundedExportProcessor).forceFlush();
  }

  /** Flushes (bounded) and stops the exporter. */
  async close(): Promise<void> {
    await this.#provider.shutdown();
  }
}

/** performance.now() → epoch milliseconds, the time base OpenTelemetry spans use. */
const epoch = (t: number) => performance.timeOrigin + t;

/** The spans of one sampled request. Every method is cheap and never throws into the request path. */
export class RequestTrace {
  readonly #tracer: Tracer;
  readonly root: Span;
  readonly #rootCtx: Context;
  readonly #op: string;
  #model = '';
  #admission: Span | null = null;
  #leg: Span | null = null;
  #legStart = 0;
  #attempt = 0;

  constructor(tracer: Tracer, parent: Context, kind: number, requestId: string, startTime: number) {
    this.#tracer = tracer;
    this.#op = OPERATIONS[kind] ?? 'chat';
    this.root = tracer.startSpan(
      this.#op,
      {
        kind: SpanKind.SERVER,
        startTime: epoch(startTime),
        attributes: {
          'gen_ai.operation.name': this.#op,
          'http.request.method': 'POST',
          'url.path': kind === 1 ? '/v1/completions' : '/v1/chat/completions',
          'switchyard.request_id': requestId,
        },
      },
      parent,
    );
    this.#rootCtx = trace.setSpan(parent, this.root);
  }

  /** The body parsed: the model and request parameters (GenAI attributes). */
  parsed(model: string, body: Readonly<Record<string, unknown>>): void {
    this.#model = model;
    this.root.updateName(`${this.#op} ${model}`);
    this.root.setAttribute('gen_ai.request.model', model);
    const num = (k: string, attr: string) => {
      const v = body[k];
      if (typeof v === 'number' && Number.isFinite(v)) this.root.setAttribute(attr, v);
    };
    num('max_tokens', 'gen_ai.request.max_tokens');
    num('max_completion_tokens', 'gen_ai.request.max_tokens');
    num('temperature', 'gen_ai.request.temperature');
    num('top_p', 'gen_ai.request.top_p');
    num('seed', 'gen_ai.request.seed');
    if (typeof body.stream === 'boolean') this.root.setAttribute('gen_ai.request.stream', body.stream);
  }

  admissionStart(now: number): void {
    this.#admission = this.#tracer.startSpan('switchyard.admission', { startTime: epoch(now) }, this.#rootCtx);
  }

  /** `reason` '' when admitted. */
  admissionEnd(now: number, admitted: boolean, reason: string): void {
    const s = this.#admission;
    if (s === null) return;
    this.#admission = null;
    s.setAttribute('switchyard.admission.admitted', admitted);
    if (!admitted) s.setAttribute('switchyard.admission.reason', reason);
    s.end(epoch(now));
  }

  /** One pick: the chosen endpoint, its weighted score among `candidates`, the prefix blocks matched. */
  scheduled(t0: number, t1: number, ep: TracedEndpoint | null, candidates: number, score: number, promptBlocks: number, matchedBlocks: number): void {
    const s = this.#tracer.startSpan('switchyard.schedule', { startTime: epoch(t0) }, this.#rootCtx);
    s.setAttribute('switchyard.attempt', this.#attempt);
    if (ep !== null) {
      s.setAttribute('switchyard.endpoint', ep.name);
      s.setAttribute('switchyard.scheduler.candidates', candidates);
      s.setAttribute('switchyard.scheduler.score', score);
      s.setAttribute('switchyard.prefix.prompt_blocks', promptBlocks);
      s.setAttribute('switchyard.prefix.matched_blocks', matchedBlocks);
    } else s.setStatus({ code: SpanStatusCode.ERROR, message: 'no endpoint' });
    s.end(epoch(t1));
  }

  /** An upstream leg begins: returns the traceparent the engine gets (this leg's span as parent). */
  legStart(now: number, ep: TracedEndpoint): string {
    this.legEnd(now, 'superseded'); // defensive: a leg left open ends here
    let address = '';
    let port = 0;
    try {
      const u = new URL(ep.url);
      address = u.hostname;
      port = Number(u.port) || (u.protocol === 'https:' ? 443 : 80);
    } catch {}
    const leg = this.#tracer.startSpan(
      `${this.#op} ${this.#model}`,
      {
        kind: SpanKind.CLIENT,
        startTime: epoch(now),
        attributes: {
          'gen_ai.operation.name': this.#op,
          'gen_ai.request.model': this.#model,
          'gen_ai.provider.name': ep.engine,
          'server.address': address,
          'server.port': port,
          'switchyard.endpoint': ep.name,
          'switchyard.attempt': this.#attempt,
        },
      },
      this.#rootCtx,
    );
    this.#leg = leg;
    this.#legStart = now;
    this.#attempt++;
    const sc = leg.spanContext();
    return formatTraceparent(sc.traceId, sc.spanId, true);
  }

  /** The leg's response head arrived: its status and time to first byte. */
  legFirstByte(now: number, status: number): void {
    const leg = this.#leg;
    if (leg === null) return;
    leg.setAttribute('http.response.status_code', status);
    leg.setAttribute('switchyard.upstream.ttfb_seconds', (now - this.#legStart) / 1000);
    leg.addEvent('first_byte', epoch(now));
  }

  /** The leg ended: `error` '' when it completed, else why (a retry follows or the request fails). */
  legEnd(now: number, error: string): void {
    const leg = this.#leg;
    if (leg === null) return;
    this.#leg = null;
    if (error !== '') {
      leg.setAttribute('error.type', error);
      leg.setStatus({ code: SpanStatusCode.ERROR, message: error });
    }
    leg.end(epoch(now));
  }

  /** The request is over: the status the client got. */
  end(now: number, status: number, error: string): void {
    this.admissionEnd(now, false, 'ended');
    this.legEnd(now, error);
    const r = this.root;
    r.setAttribute('http.response.status_code', status);
    if (status >= 500 || status === 499) {
      r.setAttribute('error.type', status === 499 ? 'client_closed' : String(status));
      r.setStatus({ code: SpanStatusCode.ERROR, message: error || `HTTP ${status}` });
    }
    r.end(epoch(now));
  }
}

/** The OTLP exporter for a config: HTTP/protobuf or gRPC, loaded only when tracing is on. */
export async function otlpExporter(cfg: TracingConfig): Promise<SpanExporter> {
  if (cfg.protocol === 'grpc') {
    const { OTLPTraceExporter } = await import('@opentelemetry/exporter-trace-otlp-grpc');
    const { Metadata, credentials } = await import('@grpc/grpc-js');
    const metadata = new Metadata();
    for (const [k, v] of Object.entries(cfg.headers)) metadata.set(k, v);
    const u = new URL(cfg.endpoint);
    return new OTLPTraceExporter({
      url: cfg.endpoint,
      metadata,
      timeoutMillis: cfg.exportTimeoutMs,
      credentials: u.protocol === 'https:' ? credentials.createSsl() : credentials.createInsecure(),
    });
  }
  const { OTLPTraceExporter } = await import('@opentelemetry/exporter-trace-otlp-proto');
  return new OTLPTraceExporter({ url: cfg.endpoint, headers: cfg.headers, timeoutMillis: cfg.exportTimeoutMs, concurrencyLimit: 1 });
}

/** A RequestTracer for the config's exporter; with `log`, the collector's outages are logged (one line each). */
export async function createTracer(cfg: TracingConfig, version?: string, log?: Logger): Promise<RequestTracer> {
  return new RequestTracer(cfg, await otlpExporter(cfg), { version, log });
}

/**
 * Whether something accepts TCP connections at the collector's host and port (the URL's, or 80 / 443):
 * null when it does, else why not (the name does not resolve, the connection is refused, no answer in
 * `timeoutMs`). It says nothing of OTLP itself: a failed export is logged on its own.
 */
export function probeCollector(endpoint: string, timeoutMs: number): Promise<string | null> {
  let host: string;
  let port: number;
  try {
    const u = new URL(endpoint);
    host = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname;
    port = u.port !== '' ? Number(u.port) : u.protocol === 'https:' ? 443 : 80;
  } catch {
    return Promise.resolve('not a URL');
  }
  return new Promise((resolve) => {
    const sock = connect({ host, port });
    const done = (why: string | null) => {
      clearTimeout(timer);
      sock.destroy();
      resolve(why);
    };
    const timer = setTimeout(() => done(`no answer within ${timeoutMs} ms`), timeoutMs);
    // the check never holds the process open (a router closed meanwhile exits at once)
    timer.unref();
    sock.unref();
    sock.once('connect', () => done(null));
    sock.once('error', (err: NodeJS.ErrnoException) =>
      done(err.code === 'ENOTFOUND' || err.code === 'EAI_AGAIN' ? `the name ${host} does not resolve (${err.code})` : err.code === 'ECONNREFUSED' ? `connection refused at ${host}:${port}` : err.message),
    );
  });
}
