// The `extProc` block of the router config: the Envoy ext_proc endpoint-picker
// listener (docs/operations.md "Envoy ext_proc") and its bounds. Type, defaults
// and zod schema; schema.ts adds it to the Router config.
import { int, nonEmpty, strict } from './schema-kit.js';

export interface ExtProcConfig {
  host: string;
  /** gRPC port for envoy.service.ext_proc.v3.ExternalProcessor and grpc.health.v1.Health (0: one the OS picks). */
  port: number;
  /** The dynamic-metadata namespace of the picked endpoint (Gateway API Inference Extension: envoy.lb). */
  metadataNamespace: string;
  /** Other candidates of the pick sent after it (`ip:port,ip:port,...`), best first, for the proxy's retries; 0: the pick alone. */
  fallbacks: number;
  /** A stream whose response has not completed this long after its decision: the decision is released (in-flight slot, as a client abort) and the stream ended, ms. */
  decisionTimeoutMs?: number;
  /** A stream with no message for this long is ended (and its decision released), ms. */
  idleTimeoutMs?: number;
  /** Streams open at once; more are refused with RESOURCE_EXHAUSTED. */
  maxStreams?: number;
  /** Request bytes buffered awaiting a decision over all streams; a body beyond it answers 503. */
  maxBufferedBytes?: number;
}

export const EXT_PROC_DEFAULTS = { host: '127.0.0.1', port: 9002, metadataNamespace: 'envoy.lb', fallbacks: 0, decisionTimeoutMs: 600_000, idleTimeoutMs: 300_000, maxStreams: 10_000, maxBufferedBytes: 512 * 1024 * 1024 };

export const extProcSchema = strict(
  {
    host: nonEmpty().default(EXT_PROC_DEFAULTS.host),
    port: int(0, 65535).default(EXT_PROC_DEFAULTS.port).describe('gRPC listen port (0: one the OS picks)'),
    metadataNamespace: nonEmpty().default(EXT_PROC_DEFAULTS.metadataNamespace).describe('dynamic-metadata namespace of the picked endpoint'),
    fallbacks: int(0, 7).default(EXT_PROC_DEFAULTS.fallbacks).describe('other candidates sent after the pick for the proxy to retry on (0: the pick alone)'),
    decisionTimeoutMs: int(50, 86_400_000).default(EXT_PROC_DEFAULTS.decisionTimeoutMs).describe("a decision whose response has not completed this long after it is released and its stream ended (ms)"),
    idleTimeoutMs: int(50, 86_400_000).default(EXT_PROC_DEFAULTS.idleTimeoutMs).describe('a stream with no message this long is ended, its decision released (ms)'),
    maxStreams: int(1, 1_000_000).default(EXT_PROC_DEFAULTS.maxStreams).describe('ext_proc streams open at once; more are refused (RESOURCE_EXHAUSTED)'),
    maxBufferedBytes: int(1024, 64 * 1024 * 1024 * 1024).default(EXT_PROC_DEFAULTS.maxBufferedBytes).describe('request body bytes buffered awaiting a decision over all streams; beyond it 503'),
  },
  'must be a mapping',
);
