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
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import { join } from 'node:path';
import protobuf from 'protobufjs';
import type { Rejected } from '../admission.js';
import type { ExtProcConfig } from '../config/ha.js';
import { KIND_CHAT, KIND_COMPLETION, type DecisionPort, type Director, type Flight } from '../director/director.js';
import type { Endpoint, EndpointSet } from '../endpoints/endpoint.js';
import { errorBody } from '../proxy/error-shape.js';
import type { Logger } from 'pino';

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
}

export const DESTINATION_HEADER = 'x-gateway-destination-endpoint';
export const SERVED_KEY = 'x-gateway-destination-endpoint-served';
const FULL_DUPLEX_STREAMED = 4;

function protoDir(): string {
  // src/extproc → ../../proto; dist/src/extproc → ../../../proto
  for (const rel of ['../../proto/', '../../../proto/']) {
    const dir = fileURLToPath(new URL(rel, import.meta.url));
    if (existsSync(`${dir}envoy/service/ext_proc/v3/external_processor.proto`)) return dir;
  }
  throw new Error('the ext_proc .proto files (proto/ at the package root) are missing');
}

/** The ext_proc and health message types, parsed from the repo's proto/ with protobufjs (once). */
export interface ExtProcCodec {
  request: protobuf.Type;
  response: protobuf.Type;
  healthRequest: protobuf.Type;
  healthResponse: protobuf.Type;
}

let codec: ExtProcCodec | null = null;
export function extProcCodec(): ExtProcCodec {
  if (codec !== null) return codec;
  const dir = protoDir();
  const root = new protobuf.Root();
  // google/protobuf/* are protobufjs's bundled well-known types
  root.resolvePath = (_origin, target) => (target.startsWith('google/protobuf/') ? target : join(dir, target));
  root.loadSync(['envoy/service/ext_proc/v3/external_processor.proto', 'grpc/health/v1/health.proto'], { keepCase: true });
  root.resolveAll();
  return (codec = {
    request: root.lookupType('envoy.service.ext_proc.v3.ProcessingRequest'),
    response: root.lookupType('envoy.service.ext_proc.v3.ProcessingResponse'),
    healthRequest: root.lookupType('grpc.health.v1.HealthCheckRequest'),
    healthResponse: root.lookupType('grpc.health.v1.HealthCheckResponse'),
  });
}

const encoder = (t: protobuf.Type) => (v: unknown) => (Buffer.isBuffer(v) ? v : Buffer.from(t.encode(t.fromObject(v as Record<string, unknown>)).finish()));
const TO_OBJECT = { oneofs: true, longs: String, enums: Number } as const;

/**
 * The two services' gRPC definitions. The server side (`server: true`)
 * decodes requests into protobufjs messages (fields read in place, no
 * toObject copy) and passes pre-encoded Buffers through as answers; a client
 * (the tests, the benchmark) gets plain objects.
 */
export function extProcServices(server: boolean): { extProc: grpc.ServiceDefinition; health: grpc.ServiceDefinition } {
  const c = extProcCodec();
  const plain = (t: protobuf.Type) => (b: Buffer) => t.toObject(t.decode(b), TO_OBJECT);
  return {
    extProc: {
      Process: {
        path: '/envoy.service.ext_proc.v3.ExternalProcessor/Process',
        requestStream: true,
        responseStream: true,
        requestSerialize: encoder(c.request),
        requestDeserialize: server ? (b: Buffer) => c.request.decode(b) : plain(c.request),
        responseSerialize: encoder(c.response),
        responseDeserialize: plain(c.response),
      },
    },
    health: {
      Check: {
        path: '/grpc.health.v1.Health/Check',
        requestStream: false,
        responseStream: false,
        requestSerialize: encoder(c.healthRequest),
        requestDeserialize: plain(c.healthRequest),
        responseSerialize: encoder(c.healthResponse),
        responseDeserialize: plain(c.healthResponse),
      },
      Watch: {
        path: '/grpc.health.v1.Health/Watch',
        requestStream: false,
        responseStream: true,
        requestSerialize: encoder(c.healthRequest),
        requestDeserialize: plain(c.healthRequest),
        responseSerialize: encoder(c.healthResponse),
        responseDeserialize: plain(c.healthResponse),
      },
    },
  };
}

// ---- message shapes (as proto-loader decodes them: keepCase, oneofs) ----------------------

interface HeaderValue {
  key?: string;
  value?: string;
  raw_value?: Buffer;
}
interface StructValue {
  fields?: Record<string, { stringValue?: string; structValue?: StructValue; kind?: string }>;
}
export interface ProcessingRequest {
  request?: string;
  request_headers?: { headers?: { headers?: HeaderValue[] }; end_of_stream?: boolean };
  response_headers?: { headers?: { headers?: HeaderValue[] }; end_of_stream?: boolean };
  request_body?: { body?: Buffer; end_of_stream?: boolean };
  response_body?: { body?: Buffer; end_of_stream?: boolean };
  request_trailers?: unknown;
  response_trailers?: unknown;
  metadata_context?: { filter_metadata?: Record<string, StructValue> };
  observability_mode?: boolean;
  protocol_config?: { request_body_mode?: number; response_body_mode?: number };
}

// the constant answers, encoded once (ExtProcServer's constructor fills them)
let CONTINUE_REQUEST_HEADERS: Buffer;
let CONTINUE_RESPONSE_HEADERS: Buffer;
let CONTINUE_REQUEST_BODY: Buffer;
let CONTINUE_RESPONSE_BODY: Buffer;
let CONTINUE_REQUEST_TRAILERS: Buffer;
let CONTINUE_RESPONSE_TRAILERS: Buffer;

function encodeConstants(): void {
  if (CONTINUE_REQUEST_HEADERS !== undefined) return;
  const enc = encoder(extProcCodec().response);
  CONTINUE_REQUEST_HEADERS = enc({ request_headers: { response: {} } });
  CONTINUE_RESPONSE_HEADERS = enc({ response_headers: { response: {} } });
  CONTINUE_REQUEST_BODY = enc({ request_body: { response: {} } });
  CONTINUE_RESPONSE_BODY = enc({ response_body: { response: {} } });
  CONTINUE_REQUEST_TRAILERS = enc({ request_trailers: {} });
  CONTINUE_RESPONSE_TRAILERS = enc({ response_trailers: {} });
}

function headerText(h: HeaderValue): string {
  const raw = h.raw_value;
  return raw !== undefined && raw.length > 0 ? raw.toString('latin1') : (h.value ?? '');
}

function setHeader(key: string, value: string) {
  return { header: { key, raw_value: Buffer.from(value, 'latin1') }, append_action: 2 /* OVERWRITE_IF_EXISTS_OR_ADD */ };
}

/** `host:port` of an endpoint URL, as the proxy addresses it. */
export function hostPort(url: string): string {
  const u = new URL(url);
  return u.port !== '' ? u.host : `${u.host}:${u.protocol === 'https:' ? 443 : 80}`;
}

/** One endpoint's decision, encoded once: as the body answer (BUFFERED) and as the headers answer (FULL_DUPLEX_STREAMED). */
interface Destination {
  body: Buffer;
  headers: Buffer;
  /** The answer to request trailers that ended the body (the metadata only: a trailers answer cannot set request headers). */
  trailers: Buffer;
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
  /** Open Health/Watch calls, each with the last status it was sent. */
  readonly #watches = new Map<grpc.ServerWritableStream<{ service?: string }, unknown>, number>();
  #watchTimer: NodeJS.Timeout | null = null;
  /** Streams ended on a message the server could not make sense of. */
  malformed = 0;

  private constructor(core: ExtProcHost, cfg: ExtProcConfig) {
    this.#core = core;
    this.host = cfg.host;
    this.#ns = cfg.metadataNamespace;
    this.fallbacks = cfg.fallbacks ?? 0;
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
      Check: (call: grpc.ServerUnaryCall<{ service?: string }, unknown>, cb: grpc.sendUnaryData<unknown>) => this.#check(call, cb),
      Watch: (call: grpc.ServerWritableStream<{ service?: string }, unknown>) => this.#watch(call),
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
    return (this.#dest[ep.id] ??= this.#encodeDestination(hostPort(ep.url)));
  }

  /** The answers naming `list` (the pick, then its fallbacks), encoded for this decision. */
  destinationList(list: readonly Endpoint[]): Destination {
    let value = hostPort(list[0].url);
    for (let i = 1; i < list.length; i++) value += ',' + hostPort(list[i].url);
    return this.#encodeDestination(value);
  }

  /**
   * The header and the envoy.lb metadata carry the same value (the protocol
   * forbids them to differ): one `ip:port`, or with fallbacks `ip:port,ip:port,...`
   * (the first is the pick; a proxy with retries goes down the list).
   */
  #encodeDestination(value: string): Destination {
    const enc = this.#enc;
    const response = { header_mutation: { set_headers: [setHeader(DESTINATION_HEADER, value)] }, clear_route_cache: true };
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

  /** SERVING 1, NOT_SERVING 2, SERVICE_UNKNOWN 3 (grpc.health.v1). */
  #status(name: string): number {
    // liveness: this process answers; readiness (and the ext_proc service): leading and not draining
    if (name === 'liveness' || name === '') return 1;
    if (name === 'readiness' || name === 'envoy.service.ext_proc.v3.ExternalProcessor') return this.ready ? 1 : 2;
    return 3;
  }

  #check(call: grpc.ServerUnaryCall<{ service?: string }, unknown>, cb: grpc.sendUnaryData<unknown>): void {
    const name = call.request?.service ?? '';
    const st = this.#status(name);
    if (st !== 3) cb(null, { status: st });
    else cb({ code: grpc.status.NOT_FOUND, details: `unknown health service "${name}" (liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor)` });
  }

  /**
   * Health/Watch: the current status at once, then each change (as the lease
   * moves to or from this router, or it starts draining). An unknown service
   * is SERVICE_UNKNOWN, not an error (grpc doc/health-checking.md). Changes
   * are noticed by one 50 ms check while any watch is open.
   */
  #watch(call: grpc.ServerWritableStream<{ service?: string }, unknown>): void {
    const st = this.#status(call.request?.service ?? '');
    this.#watches.set(call, st);
    call.write({ status: st });
    const drop = () => {
      this.#watches.delete(call);
      if (this.#watches.size === 0 && this.#watchTimer !== null) {
        clearInterval(this.#watchTimer);
        this.#watchTimer = null;
      }
    };
    call.on('cancelled', drop);
    call.on('close', drop);
    call.on('error', drop);
    if (this.#watchTimer === null) {
      this.#watchTimer = setInterval(() => this.#pushWatches(), 50);
      this.#watchTimer.unref();
    }
  }

  #pushWatches(): void {
    for (const [call, last] of this.#watches) {
      const st = this.#status(call.request?.service ?? '');
      if (st === last) continue;
      this.#watches.set(call, st);
      call.write({ status: st });
    }
  }

  #process(call: grpc.ServerDuplexStream<ProcessingRequest, unknown>): void {
    const st = new ExtProcStream(this, call);
    this.#streams.add(st);
    call.on('data', (m: ProcessingRequest) => {
      try {
        st.onMessage(m);
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
    // watches are open-ended: tell them NOT_SERVING and end them, or shutdown would wait for them
    if (this.#watchTimer !== null) clearInterval(this.#watchTimer);
    this.#watchTimer = null;
    for (const call of this.#watches.keys()) {
      call.write({ status: 2 });
      call.end();
    }
    this.#watches.clear();
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

const KINDS: Record<string, number> = { '/v1/chat/completions': KIND_CHAT, '/v1/completions': KIND_COMPLETION };

/** One ext_proc stream: one HTTP request and its response, as the proxy reports them. */
class ExtProcStream implements DecisionPort {
  readonly #s: ExtProcServer;
  readonly #call: grpc.ServerDuplexStream<ProcessingRequest, unknown>;
  #duplex = false;
  #duplexResponse = false;
  #kind = -1;
  #headers: HeaderValue[] = [];
  #body: Buffer[] = [];
  #bodyBytes = 0;
  #flight: Flight | null = null;
  /** The request headers answer is still owed (duplex mode: it carries the decision). */
  #headersOwed = false;
  #deciding = false;
  #decided = false;
  /** The body ended with request trailers (their answer carries the decision's metadata). */
  #byTrailers = false;
  #status = 0;
  #servedBy: Endpoint | null = null;
  #ended = false;
  #closed = false;

  constructor(s: ExtProcServer, call: grpc.ServerDuplexStream<ProcessingRequest, unknown>) {
    this.#s = s;
    this.#call = call;
  }

  #send(m: unknown): void {
    if (this.#closed) return;
    this.#call.write(m);
  }

  /** Ends the stream with a gRPC error (the proxy then fails the request or goes on, by its failure_mode_allow). */
  abort(code: grpc.status, details: string): void {
    if (this.#closed) return;
    this.#s.malformed++;
    this.#closed = true;
    this.#flight?.clientAborted();
    // grpc-js: an 'error' on a server stream becomes its status, then the stream ends
    this.#call.emit('error', Object.assign(new Error(details), { code, details }));
  }

  onMessage(m: ProcessingRequest): void {
    if (this.#closed) return;
    if (m.protocol_config) {
      this.#duplex = m.protocol_config.request_body_mode === FULL_DUPLEX_STREAMED;
      this.#duplexResponse = m.protocol_config.response_body_mode === FULL_DUPLEX_STREAMED;
    }
    switch (m.request) {
      case 'request_headers':
        return this.#requestHeaders(m);
      case 'request_body':
        return this.#requestBody(m);
      case 'request_trailers':
        if (this.#kind < 0 || this.#decided) this.#send(CONTINUE_REQUEST_TRAILERS);
        else {
          // trailers end the body; their answer follows the decision
          this.#byTrailers = true;
          this.#endOfRequest();
        }
        return;
      case 'response_headers':
        return this.#responseHeaders(m);
      case 'response_body':
        return this.#responseBody(m);
      case 'response_trailers':
        this.#send(CONTINUE_RESPONSE_TRAILERS);
        this.#complete();
        return;
      default:
        this.abort(grpc.status.INVALID_ARGUMENT, 'a ProcessingRequest with none of request_headers, request_body, request_trailers, response_headers, response_body, response_trailers');
    }
  }

  #requestHeaders(m: ProcessingRequest): void {
    if (this.#kind >= 0 || this.#headersOwed) return this.abort(grpc.status.INVALID_ARGUMENT, 'request_headers sent twice on one stream');
    const hs = m.request_headers?.headers?.headers ?? [];
    let path = '';
    let method = '';
    for (const h of hs) {
      if (h.key === ':path') path = headerText(h);
      else if (h.key === ':method') method = headerText(h);
    }
    const q = path.indexOf('?');
    const kind = KINDS[q >= 0 ? path.slice(0, q) : path];
    if (kind === undefined || method !== 'POST') {
      // not an inference request: the proxy routes it as it would without us
      this.#send(CONTINUE_REQUEST_HEADERS);
      return;
    }
    this.#kind = kind;
    this.#headers = hs;
    if (m.request_headers?.end_of_stream) {
      this.#immediate(400, `POST ${path} needs a JSON body`, null, null);
      return;
    }
    if (this.#duplex) this.#headersOwed = true;
    else this.#send(CONTINUE_REQUEST_HEADERS);
  }

  #requestBody(m: ProcessingRequest): void {
    const b = m.request_body;
    if (this.#kind < 0 || this.#deciding) {
      // a body we do not route on (or a chunk after the end): pass it on unchanged
      this.#send(this.#duplex ? { request_body: { response: { body_mutation: { streamed_response: { body: b?.body ?? Buffer.alloc(0), end_of_stream: b?.end_of_stream === true } } } } } : CONTINUE_REQUEST_BODY);
      return;
    }
    const chunk = b?.body;
    if (chunk !== undefined && chunk.length > 0) {
      this.#bodyBytes += chunk.length;
      const max = this.#s.core.limits.maxBodyBytes;
      if (this.#bodyBytes > max) {
        this.#immediate(413, `request body of more than ${max} bytes exceeds the limit`, null, null);
        return;
      }
      this.#body.push(chunk);
    }
    if (b?.end_of_stream) this.#endOfRequest();
    else if (!this.#duplex) this.#send(CONTINUE_REQUEST_BODY); // STREAMED mode: every chunk is answered
  }

  #endOfRequest(): void {
    if (this.#deciding) return;
    this.#deciding = true;
    const core = this.#s.core;
    const names = core.gate.headerNames;
    const gateHeaders: Record<string, string> = {};
    for (const n of names) gateHeaders[n] = '';
    let id = '';
    let auth = '';
    for (const h of this.#headers) {
      const k = h.key ?? '';
      if (k === 'x-request-id') id = headerText(h);
      else if (k === 'authorization') auth = headerText(h);
      if (k in gateHeaders) gateHeaders[k] = headerText(h);
    }
    if (id === '' || id.length > 256) id = core.newRequestId();
    const body = this.#body.length === 1 ? this.#body[0] : Buffer.concat(this.#body);
    this.#body = [];
    if (this.#duplex) this.#echo = body; // goes back to the proxy with the decision
    this.#flight = core.director.decide(this, this.#kind, id, auth, gateHeaders, body);
  }

  // ---- DecisionPort ---------------------------------------------------------------------

  picked(f: Flight): void {
    if (this.#closed) return;
    this.#decided = true;
    const d = this.#s.destinationFor(f);
    if (this.#duplex) {
      // the headers answer carries the decision; then the body goes back unchanged, whole
      this.#headersOwed = false;
      this.#send(d.headers);
      const body = this.#echo ?? Buffer.alloc(0);
      this.#echo = null;
      this.#send({ request_body: { response: { body_mutation: { streamed_response: { body, end_of_stream: !this.#byTrailers } } } } });
      if (this.#byTrailers) this.#send(CONTINUE_REQUEST_TRAILERS);
    } else this.#send(this.#byTrailers ? d.trailers : d.body);
  }

  /** Duplex mode: the request body, sent back with the decision. */
  #echo: Buffer | null = null;

  head(): void {}
  write(): void {}
  end(): void {}
  fail(): void {}

  error(status: number, message: string, param: string | null, _endpoint: Endpoint | undefined, rejection: Rejected | null): void {
    this.#immediate(status, message, param, rejection);
  }

  done(): void {
    this.#flight = null;
  }

  // ---- answers ------------------------------------------------------------------------

  #immediate(status: number, message: string, param: string | null, rejection: Rejected | null): void {
    const set_headers = [setHeader('content-type', 'application/json')];
    let details = `switchyard: ${status}`;
    if (rejection !== null) {
      if (rejection.reason) {
        set_headers.push(setHeader('x-switchyard-dropped-reason', rejection.reason));
        details = `switchyard: ${rejection.reason}`;
      }
      const ra = rejection.retryAfterSeconds ?? 0;
      if (ra > 0) set_headers.push(setHeader('retry-after', String(Math.ceil(ra))));
    }
    this.#headersOwed = false;
    this.#decided = true;
    this.#send({ immediate_response: { status: { code: status }, headers: { set_headers }, body: Buffer.from(errorBody(status, message, param)), details } });
  }

  // ---- the response path ------------------------------------------------------------------

  #responseHeaders(m: ProcessingRequest): void {
    for (const h of m.response_headers?.headers?.headers ?? []) {
      if (h.key === ':status') {
        const n = Number(headerText(h));
        this.#status = Number.isInteger(n) && n >= 100 && n <= 999 ? n : 0;
      }
    }
    const served = m.metadata_context?.filter_metadata?.[this.#s.namespace]?.fields?.[SERVED_KEY]?.stringValue;
    if (served !== undefined) this.#servedBy = this.#s.endpointAt(served.split(',')[0].trim()) ?? null;
    this.#send(CONTINUE_RESPONSE_HEADERS);
    if (m.response_headers?.end_of_stream) this.#complete();
  }

  #responseBody(m: ProcessingRequest): void {
    const b = m.response_body;
    if (this.#duplexResponse) this.#send({ response_body: { response: { body_mutation: { streamed_response: { body: b?.body ?? Buffer.alloc(0), end_of_stream: b?.end_of_stream === true } } } } });
    else this.#send(CONTINUE_RESPONSE_BODY);
    if (b?.end_of_stream) this.#complete();
  }

  /** The response is over: the decision completes with its status. */
  #complete(): void {
    const f = this.#flight;
    if (f === null) return;
    f.served(this.#status, this.#servedBy);
  }

  /** The stream ended (the proxy is done with the request, or the client left). */
  onEnd(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#closed = true;
    const f = this.#flight;
    if (f === null) return;
    if (this.#status > 0) f.served(this.#status, this.#servedBy);
    else f.clientAborted();
  }
}
