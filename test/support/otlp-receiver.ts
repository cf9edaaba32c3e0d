// A local OTLP trace receiver for tests: an HTTP server (POST /v1/traces,
// protobuf bodies) or a gRPC server (opentelemetry.proto.collector.trace.v1.
// TraceService/Export) on a loopback port the OS picks, decoding what the
// router exports with a small protobuf wire-format reader (the OTLP messages
// from opentelemetry-proto's trace.proto, common.proto, resource.proto).
import { createServer, type Server } from 'node:http';
import * as grpc from '@grpc/grpc-js';
import type { Test } from 'tap';

export type AttrValue = string | number | boolean | null;

export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  /** 1 internal, 2 server, 3 client */
  kind: number;
  startNs: bigint;
  endNs: bigint;
  attributes: Record<string, AttrValue>;
  events: string[];
  /** 0 unset, 1 ok, 2 error */
  statusCode: number;
  /** the resource's service.name */
  service: string;
}

class Reader {
  pos = 0;
  constructor(readonly buf: Buffer, readonly end = buf.length) {}
  varint(): bigint {
    let r = 0n;
    let shift = 0n;
    for (;;) {
      const b = this.buf[this.pos++]!;
      r |= BigInt(b & 0x7f) << shift;
      if ((b & 0x80) === 0) return r;
      shift += 7n;
    }
  }
  /** Calls fn(field, wireType, reader) for each field; length-delimited fields get a sub-reader. */
  fields(fn: (field: number, wire: number, r: Reader) => void): void {
    while (this.pos < this.end) {
      const key = Number(this.varint());
      const field = key >>> 3;
      const wire = key & 7;
      if (wire === 2) {
        const len = Number(this.varint());
        const sub = new Reader(this.buf.subarray(this.pos, this.pos + len));
        this.pos += len;
        fn(field, wire, sub);
      } else if (wire === 0) {
        const v = this.varint();
        fn(field, wire, Object.assign(new Reader(Buffer.alloc(0)), { value: v }) as Reader);
      } else if (wire === 1) {
        const sub = new Reader(this.buf.subarray(this.pos, this.pos + 8));
        this.pos += 8;
        fn(field, wire, sub);
      } else if (wire === 5) {
        this.pos += 4;
      } else throw new Error(`unsupported wire type ${wire}`);
    }
  }
  get str(): string {
    return this.buf.toString('utf8');
  }
  get hex(): string {
    return this.buf.toString('hex');
  }
}
type V = Reader & { value?: bigint };

function anyValue(r: Reader): AttrValue {
  let out: AttrValue = null;
  r.fields((f, _w, x) => {
    const v = x as V;
    if (f === 1) out = x.str;
    else if (f === 2) out = v.value === 1n;
    else if (f === 3) out = Number(BigInt.asIntN(64, v.value!));
    else if (f === 4) out = x.buf.readDoubleLE(0);
  });
  return out;
}

function keyValue(r: Reader, into: Record<string, AttrValue>): void {
  let k = '';
  let val: AttrValue = null;
  r.fields((f, _w, x) => {
    if (f === 1) k = x.str;
    else if (f === 2) val = anyValue(x);
  });
  into[k] = val;
}

/** Decodes an ExportTraceServiceRequest into spans. */
export function decodeExportRequest(buf: Buffer): ReceivedSpan[] {
  const spans: ReceivedSpan[] = [];
  new Reader(buf).fields((f, _w, rs) => {
    if (f !== 1) return; // resource_spans
    const resource: Record<string, AttrValue> = {};
    const scopeSpans: Reader[] = [];
    rs.fields((g, _w2, x) => {
      if (g === 1) x.fields((h, _w3, kv) => h === 1 && keyValue(kv, resource));
      else if (g === 2) scopeSpans.push(x);
    });
    for (const ss of scopeSpans) {
      ss.fields((g, _w2, sp) => {
        if (g !== 2) return;
        const s: ReceivedSpan = {
          traceId: '',
          spanId: '',
          parentSpanId: '',
          name: '',
          kind: 0,
          startNs: 0n,
          endNs: 0n,
          attributes: {},
          events: [],
          statusCode: 0,
          service: String(resource['service.name'] ?? ''),
        };
        sp.fields((h, _w3, x) => {
          const v = x as V;
          if (h === 1) s.traceId = x.hex;
          else if (h === 2) s.spanId = x.hex;
          else if (h === 4) s.parentSpanId = x.hex;
          else if (h === 5) s.name = x.str;
          else if (h === 6) s.kind = Number(v.value);
          else if (h === 7) s.startNs = x.buf.readBigUInt64LE(0);
          else if (h === 8) s.endNs = x.buf.readBigUInt64LE(0);
          else if (h === 9) keyValue(x, s.attributes);
          else if (h === 11) x.fields((e, _w4, y) => e === 2 && s.events.push(y.str));
          else if (h === 15) x.fields((e, _w4, y) => e === 3 && (s.statusCode = Number((y as V).value)));
        });
        spans.push(s);
      });
    }
  });
  return spans;
}

export interface Receiver {
  readonly url: string;
  readonly spans: ReceivedSpan[];
  /** Export requests received. */
  requests: number;
  /** Resolves when at least `n` spans have arrived (or rejects after `ms`). */
  waitFor(n: number, ms?: number): Promise<ReceivedSpan[]>;
  close(): Promise<void>;
}

function waiter(spans: ReceivedSpan[]) {
  const waits: { n: number; resolve: () => void }[] = [];
  return {
    notify() {
      for (let i = waits.length - 1; i >= 0; i--) if (spans.length >= waits[i]!.n) waits.splice(i, 1)[0]!.resolve();
    },
    waitFor(n: number, ms = 10_000): Promise<ReceivedSpan[]> {
      if (spans.length >= n) return Promise.resolve(spans);
      return new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`timed out waiting for ${n} spans (got ${spans.length})`)), ms);
        waits.push({
          n,
          resolve: () => {
            clearTimeout(t);
            resolve(spans);
          },
        });
      });
    },
  };
}

/** An OTLP/HTTP (protobuf) receiver; its url is the full …/v1/traces URL. */
export async function startHttpReceiver(t: Test): Promise<Receiver> {
  const spans: ReceivedSpan[] = [];
  const w = waiter(spans);
  const r: Receiver = {
    url: '',
    spans,
    requests: 0,
    waitFor: w.waitFor,
    close: () => new Promise<void>((res) => srv.close(() => res())),
  };
  const srv: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.method !== 'POST' || req.url !== '/v1/traces' || req.headers['content-type'] !== 'application/x-protobuf') {
        res.writeHead(400).end();
        return;
      }
      r.requests++;
      spans.push(...decodeExportRequest(Buffer.concat(chunks)));
      w.notify();
      res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
    });
  });
  await new Promise<void>((res) => srv.listen(0, '127.0.0.1', res));
  const port = (srv.address() as { port: number }).port;
  (r as { url: string }).url = `http://127.0.0.1:${port}/v1/traces`;
  t.teardown(() => {
    srv.closeAllConnections();
    return r.close();
  });
  return r;
}

/** An OTLP/gRPC receiver; its url is http://127.0.0.1:PORT. */
export async function startGrpcReceiver(t: Test): Promise<Receiver & { metadata: grpc.Metadata[] }> {
  const spans: ReceivedSpan[] = [];
  const metadata: grpc.Metadata[] = [];
  const w = waiter(spans);
  const server = new grpc.Server();
  const raw = (b: Buffer) => b;
  server.addService(
    {
      Export: {
        path: '/opentelemetry.proto.collector.trace.v1.TraceService/Export',
        requestStream: false,
        responseStream: false,
        requestSerialize: raw,
        requestDeserialize: raw,
        responseSerialize: raw,
        responseDeserialize: raw,
      },
    },
    {
      Export: (call: grpc.ServerUnaryCall<Buffer, Buffer>, cb: grpc.sendUnaryData<Buffer>) => {
        r.requests++;
        metadata.push(call.metadata);
        spans.push(...decodeExportRequest(call.request));
        w.notify();
        cb(null, Buffer.alloc(0));
      },
    },
  );
  const port = await new Promise<number>((res, rej) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? rej(err) : res(p))),
  );
  const r = {
    url: `http://127.0.0.1:${port}`,
    spans,
    metadata,
    requests: 0,
    waitFor: w.waitFor,
    close: () => new Promise<void>((res) => server.tryShutdown(() => res())),
  };
  t.teardown(() => server.forceShutdown());
  return r;
}
