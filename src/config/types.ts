// The resolved switchyard/v1 Router config as the router uses it (every
// default filled in): what validateConfig (schema.ts) returns. Each block with
// a module of its own (batch, ha, ext_proc, sessions, ...) declares its type
// there; this file puts them together.
import type { AdapterConfig, AdapterLoadingConfig, AdapterQueueConfig, RewriteRule } from './models.js';
import { ACCELERATOR_NAMES, type AcceleratorName } from '../accelerators.js';
import type { AdminConfig } from './admin.js';
import type { AuthConfig } from './auth.js';
import type { RateLimitsConfig } from './rate-limits.js';
import type { ServerConfig } from './server.js';
import type { BatchConfig } from './batch.js';
import type { DisaggregationConfig } from './disaggregation.js';
import type { DiscoveryConfig } from './discovery.js';
import type { ExtProcConfig } from './extproc.js';
import type { FlowControlConfig } from './flow-control.js';
import type { HaConfig } from './ha.js';
import type { PluginSpec, ScorerSpec } from './plugin-spec.js';
import type { KvEventsEndpointConfig, PoolPrefixConfig, TierWeightsConfig } from './prefix-mode.js';
import type { ResponsesConfig } from './responses.js';
import type { SessionsConfig } from './sessions.js';
import type { TracingConfig } from './tracing.js';

export const API_VERSION = 'switchyard/v1';
export const ENGINES = ['vllm', 'sglang'] as const;
/** Accelerator profile names (src/accelerators.ts): vendor labels and named parts with their speed and cost. */
export const ACCELERATORS = ACCELERATOR_NAMES;
export const ROLES = ['both', 'prefill', 'decode', 'encode'] as const;
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

export type Engine = (typeof ENGINES)[number];
export type Accelerator = AcceleratorName;
export type Role = (typeof ROLES)[number];

export interface CapacityConfig {
  /** Prefix-index blocks (of `scheduling.prefixBlockSize` bytes) per tier. */
  gpuBlocks: number;
  cpuBlocks: number;
  diskBlocks: number;
}

export interface EndpointConfig {
  name: string;
  url: string;
  role: Role;
  revision?: string;
  /** SGLang prefill endpoints: the engine's bootstrap port (default: disaggregation.bootstrapPort). */
  bootstrapPort?: number;
  capacity?: CapacityConfig;
  /** Where the engine publishes KV events (precise prefix mode, src/config/prefix-mode.ts). */
  kvEvents?: KvEventsEndpointConfig;
}

export interface PoolConfig {
  name: string;
  engine: Engine;
  accelerator: Accelerator;
  models: string[];
  endpoints: EndpointConfig[];
  /** Requests each endpoint runs at once (vLLM --max-num-seqs), when the operator knows it; else learned from the engine's metrics. */
  batchLimit?: number;
  /** Prefix matching of this pool: approximate (default) or precise from KV events (src/config/prefix-mode.ts). */
  prefix?: PoolPrefixConfig;
  /** Cost factors against the reference speed, overriding the accelerator profile's (the latency model's priors). */
  speed?: { prefillCostFactor?: number; decodeCostFactor?: number };
  /** Relative cost of one endpoint per unit of time, overriding the accelerator profile's. */
  cost?: number;
  /** Endpoints discovered at runtime (Kubernetes pods), beside the static list (src/config/discovery.ts). */
  discovery?: DiscoveryConfig;
  /** Name of an environment variable holding the engines' API key (sent as `Authorization: Bearer`); absent = no Authorization upstream. */
  upstreamAuth?: string;
  /** LoRA adapters declared for the pool's models (src/config/models.ts). */
  adapters?: AdapterConfig[];
  /** Loading adapters on engines that lack them; absent = off. */
  adapterLoading?: AdapterLoadingConfig;
}

export interface SchedulingConfig {
  filters: PluginSpec[];
  scorers: ScorerSpec[];
  picker: PluginSpec;
  /** Bytes per block of the native prefix index. */
  prefixBlockSize: number;
  /** What a matched block is worth by tier (default: src/config/prefix-mode.ts). */
  tierWeights?: TierWeightsConfig;
}

export interface DataLayerConfig {
  scrapeIntervalMs: number;
  staleAfterMs: number;
  healthIntervalMs: number;
  healthTimeoutMs: number;
  breakerFailures: number;
  breakerCooldownMs: number;
  /** How often each endpoint's GET /v1/models is read to check it serves its pool's models (0: never; absent: 30 s). */
  modelCheckIntervalMs?: number;
}

export const UPSTREAM_CLIENTS = ['auto', 'h1', 'native', 'undici'] as const;

export interface ProxyConfig {
  /** Upstream HTTP client: the native (addon) HTTP/1.1 client, or undici (https); `h1` is an older name of `native`. */
  client: (typeof UPSTREAM_CLIENTS)[number];
  maxRetries: number;
  connectionsPerEndpoint: number;
  connectTimeoutMs: number;
  headersTimeoutMs: number;
  bodyTimeoutMs: number;
}

export interface LimitsConfig {
  maxBodyBytes: number;
  requestBodyTimeoutMs: number;
  /** Deepest nesting of arrays/objects a request body may have (400 beyond, before parsing). */
  maxJsonDepth: number;
  /** Bodies larger than this are parsed in a worker thread, off the event loop. */
  parseOffloadBytes: number;
  /** Worker threads for that. */
  parseWorkers: number;
  /** How an inference body is read: 'native' (the addon's scan, JSON.parse only for bodies it refuses) or 'javascript' (JSON.parse always). */
  bodyScan: 'native' | 'javascript';
}

export interface LoggingConfig {
  level: (typeof LOG_LEVELS)[number];
  /** One info line per finished request (docs/observability.md); off by default. */
  access: boolean;
  /** The share of requests the access log writes (0–1; 1: every request). */
  accessSample: number;
}

export interface ShutdownConfig {
  /** How long in-flight requests get to finish after a signal; then streams end with an SSE error, others with a 503. */
  graceMs: number;
  /** After the signal, /readyz answers 503 but the router keeps accepting this long (balancers notice), then stops accepting. */
  drainDelayMs: number;
}

export interface RouterConfig {
  apiVersion: typeof API_VERSION;
  kind: 'Router';
  listen: { host: string; port: number };
  pools: PoolConfig[];
  scheduling: SchedulingConfig;
  dataLayer: DataLayerConfig;
  proxy: ProxyConfig;
  /** The HTTP front end (docs/front-end.md); absent in a hand-built config: the defaults. */
  server?: ServerConfig;
  limits: LimitsConfig;
  logging: LoggingConfig;
  /** How SIGTERM/SIGINT drain the router (docs/operations.md). */
  shutdown: ShutdownConfig;
  /** OpenTelemetry spans over OTLP (docs/observability.md); off by default. */
  tracing: TracingConfig;
  /** The validated, defaulted flowControl block; undefined when the config has none. */
  flowControl?: FlowControlConfig;
  /** Session identification, pins and turn tracking (docs/responses.md). */
  sessions: SessionsConfig;
  /** The Responses API and its store (docs/responses.md). */
  responses: ResponsesConfig;
  /** The admin API (docs/operations.md); undefined when the config has none (no admin listener). */
  admin?: AdminConfig;
  /** Bounds on the router's metric series (docs/observability.md). */
  metrics: { maxLabelValues: number };
  /** API-key authentication (docs/security.md); undefined: none (tenants from flowControl.tenants, if any). */
  auth?: AuthConfig;
  /** Rate limits and token quotas per tenant and per key (docs/security.md); undefined: none. */
  rateLimits?: RateLimitsConfig;
  /** Prefill/decode disaggregation (docs/disaggregation.md); undefined: every request goes to one endpoint. */
  disaggregation?: DisaggregationConfig;
  /** Hot standby over a Redis lease (src/ha/); undefined: a single router. */
  ha?: HaConfig;
  /** The Envoy ext_proc gRPC listener (src/extproc/); undefined: none. */
  extProc?: ExtProcConfig;
  /** The async processor (docs/batch.md); undefined when the config has none. */
  batch?: BatchConfig;
  /** Model rewrites with weighted targets (docs/models.md); absent in a hand-built config: none. */
  modelRewrites?: RewriteRule[];
  /** The router-side hold of adapter requests (docs/models.md); undefined: the defaults (on). */
  adapterQueue?: AdapterQueueConfig;
}
