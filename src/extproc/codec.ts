// The ext_proc wire: the .proto files parsed once with protobufjs, the gRPC
// service definitions (ExternalProcessor/Process, Health/Check and Watch),
// the message shapes as the server reads them, and the constant answers.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type * as grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';

export const DESTINATION_HEADER = 'x-gateway-destination-endpoint';
export const SERVED_KEY = 'x-gateway-destination-endpoint-served';
export const FULL_DUPLEX_STREAMED = 4;

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

export const encoder = (t: protobuf.Type) => (v: unknown) => (Buffer.isBuffer(v) ? v : Buffer.from(t.encode(t.fromObject(v as Record<string, unknown>)).finish()));
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

export interface HeaderValue {
  key?: string;
  value?: string;
  raw_value?: Buffer;
}
export interface StructValue {
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

/** The constant answers, encoded once (encodeConstants, called by the server's constructor). */
export const CONTINUE = {} as {
  REQUEST_HEADERS: Buffer;
  RESPONSE_HEADERS: Buffer;
  REQUEST_BODY: Buffer;
  RESPONSE_BODY: Buffer;
  REQUEST_TRAILERS: Buffer;
  RESPONSE_TRAILERS: Buffer;
};

export function encodeConstants(): void {
  if (CONTINUE.REQUEST_HEADERS !== undefined) return;
  const enc = encoder(extProcCodec().response);
  CONTINUE.REQUEST_HEADERS = enc({ request_headers: { response: {} } });
  CONTINUE.RESPONSE_HEADERS = enc({ response_headers: { response: {} } });
  CONTINUE.REQUEST_BODY = enc({ request_body: { response: {} } });
  CONTINUE.RESPONSE_BODY = enc({ response_body: { response: {} } });
  CONTINUE.REQUEST_TRAILERS = enc({ request_trailers: {} });
  CONTINUE.RESPONSE_TRAILERS = enc({ response_trailers: {} });
}

export function headerText(h: HeaderValue): string {
  const raw = h.raw_value;
  return raw !== undefined && raw.length > 0 ? raw.toString('latin1') : (h.value ?? '');
}

export function setHeader(key: string, value: string) {
  return { header: { key, raw_value: Buffer.from(value, 'latin1') }, append_action: 2 /* OVERWRITE_IF_EXISTS_OR_ADD */ };
}

/** One endpoint's decision, encoded once: as the body answer (BUFFERED) and as the headers answer (FULL_DUPLEX_STREAMED). */
export interface Destination {
  body: Buffer;
  headers: Buffer;
  /** The answer to request trailers that ended the body (the metadata only: a trailers answer cannot set request headers). */
  trailers: Buffer;
}
