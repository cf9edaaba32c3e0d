// The `extProc` block of the router config: the Envoy ext_proc endpoint-picker
// listener (docs/operations.md "Envoy ext_proc"). Type, defaults and zod
// schema; schema.ts adds it to the Router config.
import { int, nonEmpty, strict } from './schema-kit.js';

export interface ExtProcConfig {
  host: string;
  /** gRPC port for envoy.service.ext_proc.v3.ExternalProcessor and grpc.health.v1.Health (0: one the OS picks). */
  port: number;
  /** The dynamic-metadata namespace of the picked endpoint (Gateway API Inference Extension: envoy.lb). */
  metadataNamespace: string;
  /** Other candidates of the pick sent after it (`ip:port,ip:port,...`), best first, for the proxy's retries; 0: the pick alone. */
  fallbacks: number;
}

export const EXT_PROC_DEFAULTS = { host: '127.0.0.1', port: 9002, metadataNamespace: 'envoy.lb', fallbacks: 0 };

export const extProcSchema = strict(
  {
    host: nonEmpty().default(EXT_PROC_DEFAULTS.host),
    port: int(0, 65535).default(EXT_PROC_DEFAULTS.port).describe('gRPC listen port (0: one the OS picks)'),
    metadataNamespace: nonEmpty().default(EXT_PROC_DEFAULTS.metadataNamespace).describe('dynamic-metadata namespace of the picked endpoint'),
    fallbacks: int(0, 7).default(EXT_PROC_DEFAULTS.fallbacks).describe('other candidates sent after the pick for the proxy to retry on (0: the pick alone)'),
  },
  'must be a mapping',
);
