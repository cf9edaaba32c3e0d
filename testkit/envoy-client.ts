// A gRPC client that plays Envoy's part against Switchyard's ext_proc server
// (src/extproc/server.ts): for the tests and the ext_proc benchmark. It sends
// what Envoy's ext_proc filter sends for one HTTP request (request headers,
// the body in BUFFERED or FULL_DUPLEX_STREAMED mode, then the response
// headers with the served endpoint in the envoy.lb metadata) and reads the
// answers.
import * as grpc from '@grpc/grpc-js';
import { DESTINATION_HEADER, SERVED_KEY, extProcServices } from '../src/extproc/server.js';

type Ctor = grpc.ServiceClientConstructor;

let ctors: { extProc: Ctor; health: Ctor } | null = null;
function ctor(which: 'extProc' | 'health'): Ctor {
  if (ctors === null) {
    const d = extProcServices(false);
    ctors = { extProc: grpc.makeGenericClientConstructor(d.extProc as grpc.ServiceDefinition<grpc.UntypedServiceImplementation>, 'ExternalProcessor'), health: grpc.makeGenericClientConstructor(d.health as grpc.ServiceDefinition<grpc.UntypedServiceImplementation>, 'Health') };
  }
  return ctors[which];
}

export interface Answer {
  /** 'request_headers', 'request_body', 'response_headers', 'response_body', 'immediate_response', ... */
  response: string;
  [k: string]: unknown;
}

/** One Process stream with a queue of the server's answers. */
export class EnvoyStream {
  readonly call: grpc.ClientDuplexStream<unknown, Answer>;
  readonly #queue: Answer[] = [];
  readonly #waiters: ((a: Answer | Error) => void)[] = [];
  error: Error | null = null;
  ended = false;

  constructor(client: grpc.Client) {
    this.call = (client as unknown as { Process(): grpc.ClientDuplexStream<unknown, Answer> }).Process();
    this.call.on('data', (a: Answer) => {
      const w = this.#waiters.shift();
      if (w) w(a);
      else this.#queue.push(a);
    });
    const fail = (e: Error) => {
      this.error ??= e;
      for (const w of this.#waiters.splice(0)) w(this.error);
    };
    this.call.on('error', fail);
    this.call.on('end', () => {
      this.ended = true;
      fail(new Error('stream ended'));
    });
  }

  send(m: unknown): void {
    this.call.write(m);
  }

  next(): Promise<Answer> {
    const a = this.#queue.shift();
    if (a) return Promise.resolve(a);
    if (this.error) return Promise.reject(this.error);
    return new Promise((resolve, reject) => this.#waiters.push((x) => (x instanceof Error ? reject(x) : resolve(x))));
  }

  end(): void {
    this.call.end();
  }
}

export function headerMap(h: Record<string, string>) {
  return { headers: Object.entries(h).map(([key, v]) => ({ key, raw_value: Buffer.from(v) })) };
}

/** The header a HeadersResponse/BodyResponse sets, or undefined. */
export function setHeaderValue(a: Answer, key: string): string | undefined {
  const body = (a[a.response] as { response?: { header_mutation?: { set_headers?: { header: { key: string; raw_value?: Buffer; value?: string } }[] } } }) ?? {};
  for (const s of body.response?.header_mutation?.set_headers ?? []) {
    if (s.header.key === key) return s.header.raw_value && s.header.raw_value.length > 0 ? s.header.raw_value.toString() : s.header.value;
  }
  return undefined;
}

/** The picked endpoint in the answer's dynamic metadata (`ns` namespace). */
export function metadataDestination(a: Answer, ns = 'envoy.lb'): string | undefined {
  const md = a.dynamic_metadata as { fields?: Record<string, { structValue?: { fields?: Record<string, { stringValue?: string }> } }> } | undefined;
  return md?.fields?.[ns]?.structValue?.fields?.[DESTINATION_HEADER]?.stringValue;
}

export type Decision =
  | { picked: true; endpoint: string; metadata: string | undefined; stream: EnvoyStream }
  | { picked: false; status: number; body: string; headers: Record<string, string>; details: string; stream: EnvoyStream };

export interface DecideOptions {
  path?: string;
  headers?: Record<string, string>;
  /** FULL_DUPLEX_STREAMED (4) or BUFFERED (2, default). */
  duplex?: boolean;
}

/** Sends one request's headers and body as Envoy does and reads the decision. */
export async function decide(client: grpc.Client, body: string | Buffer, o: DecideOptions = {}): Promise<Decision> {
  const s = new EnvoyStream(client);
  const mode = o.duplex ? 4 : 2;
  s.send({
    request_headers: { headers: headerMap({ ':method': 'POST', ':path': o.path ?? '/v1/chat/completions', 'content-type': 'application/json', ...o.headers }), end_of_stream: false },
    protocol_config: { request_body_mode: mode, response_body_mode: 0 },
  });
  if (!o.duplex) {
    const h = await s.next();
    if (h.response === 'immediate_response') return immediate(h, s);
    if (h.response !== 'request_headers') throw new Error(`expected a request_headers answer, got ${h.response}`);
  }
  s.send({ request_body: { body: Buffer.isBuffer(body) ? body : Buffer.from(body), end_of_stream: true } });
  const a = await s.next();
  if (a.response === 'immediate_response') return immediate(a, s);
  const endpoint = setHeaderValue(a, DESTINATION_HEADER);
  if (endpoint === undefined) throw new Error(`no ${DESTINATION_HEADER} in ${JSON.stringify(a)}`);
  if (o.duplex) {
    const echoed = await s.next();
    if (echoed.response !== 'request_body') throw new Error(`expected the body back, got ${echoed.response}`);
  }
  return { picked: true, endpoint, metadata: metadataDestination(a), stream: s };
}

function immediate(a: Answer, stream: EnvoyStream): Decision {
  const ir = a.immediate_response as { status?: { code?: number }; body?: Buffer; details?: string; headers?: { set_headers?: { header: { key: string; raw_value?: Buffer } }[] } };
  const headers: Record<string, string> = {};
  for (const s of ir.headers?.set_headers ?? []) headers[s.header.key] = s.header.raw_value?.toString() ?? '';
  return { picked: false, status: ir.status?.code ?? 0, body: ir.body?.toString() ?? '', headers, details: ir.details ?? '', stream };
}

/** Reports the response as Envoy does (status, served endpoint in envoy.lb), then ends the stream. */
export async function respond(s: EnvoyStream, status: number, served: string | null, ns = 'envoy.lb'): Promise<void> {
  const metadata_context = served === null ? undefined : { filter_metadata: { [ns]: { fields: { [SERVED_KEY]: { stringValue: served } } } } };
  s.send({ response_headers: { headers: headerMap({ ':status': String(status) }), end_of_stream: true }, metadata_context });
  const a = await s.next();
  if (a.response !== 'response_headers') throw new Error(`expected a response_headers answer, got ${a.response}`);
  s.end();
}

export function extProcClient(address: string): grpc.Client {
  const C = ctor('extProc');
  return new C(address, grpc.credentials.createInsecure());
}

export function healthCheck(address: string, service: string): Promise<number> {
  const C = ctor('health');
  const c = new C(address, grpc.credentials.createInsecure()) as unknown as {
    Check(req: unknown, cb: (err: grpc.ServiceError | null, r: { status?: number }) => void): void;
    close(): void;
  };
  return new Promise((resolve, reject) =>
    c.Check({ service }, (err, r) => {
      c.close();
      if (err) reject(err);
      else resolve(r.status ?? 0);
    }),
  );
}

/** grpc.health.v1.Health/Watch: every status the server streams goes to `onStatus`; cancel() ends the call. */
export function healthWatch(address: string, service: string, onStatus: (status: number) => void): { cancel(): void; ended: Promise<void> } {
  const C = ctor('health');
  const c = new C(address, grpc.credentials.createInsecure()) as unknown as {
    Watch(req: unknown): grpc.ClientReadableStream<{ status?: number }>;
    close(): void;
  };
  const call = c.Watch({ service });
  call.on('data', (r: { status?: number }) => onStatus(r.status ?? 0));
  const ended = new Promise<void>((resolve) => {
    call.on('error', () => resolve());
    call.on('end', () => resolve());
  });
  void ended.then(() => c.close());
  return { cancel: () => call.cancel(), ended };
}
