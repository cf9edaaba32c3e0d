// The `tracing` block of the router config: OpenTelemetry spans exported over
// OTLP. Off by default; docs/observability.md documents each field.
import { got, int, strict, z } from './schema-kit.js';

export const OTLP_PROTOCOLS = ['http/protobuf', 'grpc'] as const;
export type OtlpProtocol = (typeof OTLP_PROTOCOLS)[number];

export interface TracingConfig {
  enabled: boolean;
  /** OTLP transport: HTTP with protobuf bodies, or gRPC. */
  protocol: OtlpProtocol;
  /** Collector URL: for http/protobuf the full traces URL (…/v1/traces), for gRPC host:port as http://host:port. */
  endpoint: string;
  /** Head sampling: the fraction of new traces recorded, in [0, 1]. A client's sampled flag wins when `parentBased`. */
  sampleRatio: number;
  /** Follow the incoming traceparent's sampled flag (W3C parent-based sampling). */
  parentBased: boolean;
  /** service.name of the exported spans. */
  serviceName: string;
  /** Extra headers (HTTP) or metadata (gRPC) on every export, e.g. an API key. */
  headers: Record<string, string>;
  /** Finished spans held for export; beyond, spans are dropped and counted. */
  maxQueueSize: number;
  /** Spans per export request. */
  maxExportBatchSize: number;
  /** How often held spans are exported. */
  exportIntervalMs: number;
  /** How long one export may take before it counts as failed. */
  exportTimeoutMs: number;
}

export const TRACING_DEFAULTS: TracingConfig = {
  enabled: false,
  protocol: 'http/protobuf',
  endpoint: 'http://127.0.0.1:4318/v1/traces',
  sampleRatio: 0.01,
  parentBased: true,
  serviceName: 'switchyard',
  headers: {},
  maxQueueSize: 2048,
  maxExportBatchSize: 512,
  exportIntervalMs: 5000,
  exportTimeoutMs: 10_000,
};

const bool = () => z.boolean({ error: (i) => `must be true or false (got ${got(i.input)})` });
const d = TRACING_DEFAULTS;

function endpointUrl(s: string): boolean {
  try {
    const u = new URL(s);
    return (u.protocol === 'http:' || u.protocol === 'https:') && u.hostname !== '';
  } catch {
    return false;
  }
}

export const tracingSchema = strict(
  {
    enabled: bool().default(d.enabled),
    protocol: z
      .enum(OTLP_PROTOCOLS, { error: (i) => `must be one of: ${OTLP_PROTOCOLS.join(', ')} (got ${got(i.input)})` })
      .default(d.protocol),
    endpoint: z
      .string({ error: (i) => `must be a URL (got ${got(i.input)})` })
      .refine(endpointUrl, { error: (i) => `must be an http(s) URL such as http://collector:4318/v1/traces (got ${got(i.input)})` })
      .optional()
      .describe('default http://127.0.0.1:4318/v1/traces (http/protobuf) or http://127.0.0.1:4317 (grpc)'),
    sampleRatio: z
      .number({ error: (i) => `must be a number in [0, 1] (got ${got(i.input)})` })
      .gte(0, { error: (i) => `must be a number in [0, 1] (got ${got(i.input)})` })
      .lte(1, { error: (i) => `must be a number in [0, 1] (got ${got(i.input)})` })
      .default(d.sampleRatio)
      .describe('head sampling: fraction of new traces recorded'),
    parentBased: bool().default(d.parentBased).describe("follow the incoming traceparent's sampled flag"),
    serviceName: z.string({ error: (i) => `must be a non-empty string (got ${got(i.input)})` }).min(1, { error: 'must be a non-empty string' }).default(d.serviceName),
    headers: z
      .record(z.string(), z.string({ error: (i) => `must be a string (got ${got(i.input)})` }), { error: 'must be a mapping of header name to value' })
      .default({})
      .describe('sent with every export (HTTP headers or gRPC metadata)'),
    maxQueueSize: int(1, 1_000_000).default(d.maxQueueSize).describe('finished spans held for export; more are dropped and counted'),
    maxExportBatchSize: int(1, 100_000).default(d.maxExportBatchSize),
    exportIntervalMs: int(10, 3_600_000).default(d.exportIntervalMs),
    exportTimeoutMs: int(10, 3_600_000).default(d.exportTimeoutMs),
  },
  'must be a mapping',
)
  .prefault({})
  .transform(
    (v): TracingConfig => ({
      ...v,
      endpoint: v.endpoint ?? (v.protocol === 'grpc' ? 'http://127.0.0.1:4317' : d.endpoint),
    }),
  );
