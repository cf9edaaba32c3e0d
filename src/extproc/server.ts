// The Envoy endpoint-picker transport: a gRPC server for
// envoy.service.ext_proc.v3.ExternalProcessor/Process and
// grpc.health.v1.Health/Check, beside the HTTP server. Envoy (or any proxy
// speaking ext_proc, as in the Gateway API Inference Extension) streams each
// HTTP request's headers and body here; the director runs the same parse,
// admission, flow control and pick as for an HTTP request (Director.decide)
// and this answers with the picked endpoint in the `x-gateway-destination-
// endpoint` header and in the `envoy.lb` dynamic metadata (the endpoint-picker
// protocol, gateway-api-inference-extension docs/proposals/004). A rejection
// becomes an ImmediateResponse (429 shed, 503 no endpoint, 4xx bad request)
// with the OpenAI error body and the reason. On the response path the proxy
// reports the status and the endpoint that served (metadata
// `x-gateway-destination-endpoint-served`): that completes the decision
// (in-flight release, breaker outcome, prefix forget when it failed).
//
// Body modes: BUFFERED (the proxy waits for the headers answer, then sends the
// whole body: the decision answers the body message) and FULL_DUPLEX_STREAMED
// (the body follows the headers at once: the headers answer waits for the
// decision, then the body goes back as a streamed mutation), told apart by the
// first message's protocol_config. It never relays the engine's bytes.
//
// This file: the gRPC server, the endpoint answers (encoded once per
// endpoint) and the stream bookkeeping; codec.ts the wire, health.ts the
// health service, stream.ts one stream.
import * as grpc from '@grpc/grpc-js';
import { EXT_PROC_DEFAULTS, type ExtProcConfig } from '../config/ha.js';
import type { Director, Flight } from '../director/director.js';
import type { Endpoint, EndpointSet } from '../endpoints/endpoint.js';
import type { Logger } from 'pino';
import { DESTINATION_HEADER, encodeConstants, encoder, extProcCodec, extProcServices, setHeader, type Destination, type ProcessingRequest } from './codec.js';
import { ExtProcHealth } from './health.js';
import { ExtProcStream, type StreamHost } from './stream.js';

export { DESTINATION_HEADER, SERVED_KEY, extProcServices, type Destination } from './codec.js';

/** What the server needs of the router (RouterCore has all of it). */
export interface ExtProcHost {
  readonly director: Director;
  readonly endpoints: EndpointSet;
  readonly log: Logger;
  readonly limits: { maxBodyBytes: number };
  readonly gate: { readonly headerNames: readonly string[] };
  readonly draining: boolean;
  readonly leadership: { readonly leading: boolean } | null;
  /** The fallback list is read from it right after a pick. */
  readonly scheduler: { fallbacks(primary: Endpoint, max: number, out: Endpoint[]): Endpoint[] };
  newRequestId(): string;
  /** The outcome counters and duration / TTFT histograms (RouterMetrics): each ext_proc request's end is counted as an HTTP request's is. */
  readonly metrics: StreamHost['core']['metrics'];
  /** Who a request is, or a Refusal (401) when authentication requires a key it lacks (src/identity.ts). */
  callerOf(get: (name: string) => string): import('../identity.js').Caller | import('../identity.js').Refusal;
}

/** `host:port` of an endpoint URL, as the proxy addresses it. */
export function hostPort(url: string): string {
  const u = new URL(url);
  return u.port !== '' ? u.host : `${u.host}:${u.protocol === 'https:' ? 443 : 80}`;
}

export class ExtProcServer {
  readonly server: grpc.Server;
  readonly host: string;
  port = 0;
  readonly #core: ExtProcHost;
  readonly #ns: string;
  readonly #dest: (Destination | undefined)[] = [];
  readonly #byAddress = new Map<string, Endpoint>();
  readonly #streams = new Set<ExtProcStream>();
  readonly #enc: (m: unknown) => Buffer;
  /** Fallback endpoints sent after the pick (config extProc.fallbacks; 0: the pick alone). */
  readonly fallbacks: number;
  readonly #fallbackList: Endpoint[] = [];
  readonly #health: ExtProcHealth;
  /** Streams ended on a message the server could not make sense of. */
  malformed = 0;
  /** Request body bytes buffered awaiting a decision, over all streams. */
  buffered = 0;
  readonly maxBuffered: number;
  readonly #maxStreams: number;
  readonly #idleMs: number;
  readonly #decisionMs: number;
  /** One sweep over the open streams for the idle and decision timeouts (no timer per stream). */
  #sweepTimer: NodeJS.Timeout | null = null;
  /** Streams ended by a timeout, and streams refused over extProc.maxStreams. */
  timedOut = 0;
  refused = 0;

  private constructor(core: ExtProcHost, cfg: ExtProcConfig) {
    this.#core = core;
    this.host = cfg.host;
    this.#ns = cfg.metadataNamespace;
    this.fallbacks = cfg.fallbacks ?? 0;
    this.maxBuffered = cfg.maxBufferedBytes ?? EXT_PROC_DEFAULTS.maxBufferedBytes;
    this.#maxStreams = cfg.maxStreams ?? EXT_PROC_DEFAULTS.maxStreams;
    this.#idleMs = cfg.idleTimeoutMs ?? EXT_PROC_DEFAULTS.idleTimeoutMs;
    this.#decisionMs = cfg.decisionTimeoutMs ?? EXT_PROC_DEFAULTS.decisionTimeoutMs;
    this.#health = new ExtProcHealth(() => this.ready);
    encodeConstants();
    this.#enc = encoder(extProcCodec().response);
    for (const ep of core.endpoints.all) this.#byAddress.set(hostPort(ep.url), ep);
    // endpoints added at runtime (admin API, Kubernetes discovery): their answers are encoded on first pick
    core.endpoints.onAdded((ep) => this.#byAddress.set(hostPort(ep.url), ep));
    core.endpoints.onRemoved((ep) => {
      const addr = hostPort(ep.url);
      if (this.#byAddress.get(addr) === ep) this.#byAddress.delete(addr);
      this.#dest[ep.id] = undefined;
    });
    const defs = extProcServices(true);
    this.server = new grpc.Server({ 'grpc.max_receive_message_length': core.limits.maxBodyBytes + 65536 });
    this.server.addService(defs.extProc, {
      Process: (call: grpc.ServerDuplexStream<ProcessingRequest, unknown>) => this.#process(call),
    });
    this.server.addService(defs.health, {
      Check: (call: grpc.ServerUnaryCall<{ service?: string }, unknown>, cb: grpc.sendUnaryData<unknown>) => this.#health.check(call, cb),
      Watch: (call: grpc.ServerWritableStream<{ service?: string }, unknown>) => this.#health.watch(call),
    });
  }

  /** Listens on cfg.host:cfg.port (0: a port the OS picks, then in `port`). */
  static async start(core: ExtProcHost, cfg: ExtProcConfig): Promise<ExtProcServer> {
    const s = new ExtProcServer(core, cfg);
    const addr = cfg.host.includes(':') ? `[${cfg.host}]:${cfg.port}` : `${cfg.host}:${cfg.port}`;
    s.port = await new Promise<number>((resolve, reject) =>
      s.server.bindAsync(addr, grpc.ServerCredentials.createInsecure(), (err, port) => (err ? reject(new Error(`ext_proc: cannot listen on ${addr}: ${err.message}`)) : resolve(port))),
    );
    core.log.info({ address: `${cfg.host}:${s.port}` }, 'Envoy ext_proc endpoint picker listening');
    return s;
  }

  get namespace(): string {
    return this.#ns;
  }

  /** The encoded answers naming `ep` (encoded once per endpoint). */
  destination(ep: Endpoint): Destination {
    return (this.#dest[ep.id] ??= this.#encodeDestination(hostPort(ep.url), ep));
  }

  /** The answers naming `list` (the pick, then its fallbacks), encoded for this decision. */
  destinationList(list: readonly Endpoint[]): Destination {
    let value = hostPort(list[0].url);
    for (let i = 1; i < list.length; i++) value += ',' + hostPort(list[i].url);
    return this.#encodeDestination(value, list[0]);
  }

  /**
   * The header and the envoy.lb metadata carry the same value (the protocol
   * forbids them to differ): one `ip:port`, or with fallbacks `ip:port,ip:port,...`
   * (the first is the pick; a proxy with retries goes down the list).
   */
  #encodeDestination(value: string, ep: Endpoint): Destination {
    const enc = this.#enc;
    // the client's Authorization is not the engine's: replaced by the pool's upstreamAuth key, or removed
    const auth = ep.upstreamAuthorization;
    const header_mutation = auth !== ''
      ? { set_headers: [setHeader(DESTINATION_HEADER, value), setHeader('authorization', auth)] }
      : { set_headers: [setHeader(DESTINATION_HEADER, value)], remove_headers: ['authorization'] };
    const response = { header_mutation, clear_route_cache: true };
    const dynamic_metadata = { fields: { [this.#ns]: { structValue: { fields: { [DESTINATION_HEADER]: { stringValue: value } } } } } };
    return {
      body: enc({ request_body: { response }, dynamic_metadata }),
      headers: enc({ request_headers: { response }, dynamic_metadata }),
      trailers: enc({ request_trailers: {}, dynamic_metadata }),
    };
  }

  /** The pick and its fallbacks (config extProc.fallbacks), read from the scheduler right after the pick. */
  destinationFor(f: Flight): Destination {
    if (this.fallbacks === 0) return this.destination(f.endpoint);
    const list = this.#core.scheduler.fallbacks(f.endpoint, this.fallbacks, this.#fallbackList);
    if (list.length === 0) return this.destination(f.endpoint);
    list.unshift(f.endpoint);
    return this.destinationList(list);
  }

  endpointAt(address: string): Endpoint | undefined {
    return this.#byAddress.get(address);
  }

  get core(): ExtProcHost {
    return this.#core;
  }

  /** Readiness: leading its standby pair (or no pair) and not draining. */
  get ready(): boolean {
    const l = this.#core.leadership;
    return !this.#core.draining && (l === null || l.leading);
  }

  /** Ends the streams past their idle or decision timeout (their decisions released). */
  #sweep(): void {
    const now = Date.now();
    for (const st of this.#streams) {
      if (st.decidedAt > 0 && now - st.decidedAt > this.#decisionMs) {
        this.timedOut++;
        st.expire(`the response did not complete within extProc.decisionTimeoutMs (${this.#decisionMs} ms) of the decision`);
      } else if (now - st.lastMessageAt > this.#idleMs) {
        this.timedOut++;
        st.expire(`no message for extProc.idleTimeoutMs (${this.#idleMs} ms)`);
      }
    }
  }

  #process(call: grpc.ServerDuplexStream<ProcessingRequest, unknown>): void {
    if (this.#streams.size >= this.#maxStreams) {
      this.refused++;
      call.emit('error', Object.assign(new Error('too many ext_proc streams'), { code: grpc.status.RESOURCE_EXHAUSTED, details: `more than extProc.maxStreams (${this.#maxStreams}) streams open` }));
      return;
    }
    if (this.#sweepTimer === null) {
      const every = Math.max(20, Math.min(1000, Math.floor(Math.min(this.#idleMs, this.#decisionMs) / 4)));
      this.#sweepTimer = setInterval(() => this.#sweep(), every);
      this.#sweepTimer.unref();
    }
    const st = new ExtProcStream(this, call);
    this.#streams.add(st);
    call.on('data', (m: ProcessingRequest) => {
      try {
        st.onMessage(m, Date.now());
      } catch (err) {
        this.#core.log.error({ err }, 'ext_proc: internal error on a message');
        st.abort(grpc.status.INTERNAL, `internal error: ${(err as Error).message}`);
      }
    });
    call.on('end', () => {
      st.onEnd();
      call.end();
    });
    call.on('cancelled', () => st.onEnd());
    call.on('error', () => st.onEnd());
    call.on('close', () => {
      st.onEnd();
      this.#streams.delete(st);
    });
  }

  /** Stops accepting streams; open ones get up to `graceMs` to end. */
  async close(graceMs = 10_000): Promise<void> {
    this.#health.close();
    if (this.#sweepTimer !== null) clearInterval(this.#sweepTimer);
    this.#sweepTimer = null;
    await new Promise<void>((resolve) => {
      const t = setTimeout(() => {
        this.server.forceShutdown();
        resolve();
      }, graceMs);
      t.unref();
      this.server.tryShutdown(() => {
        clearTimeout(t);
        resolve();
      });
    });
  }
}
