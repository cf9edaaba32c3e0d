// The switchyard/v1 Router config: types, defaults and its zod schema.
// Validation collects every problem (with its field path) before failing, so a
// user fixes a file in one pass. docs/config.md documents each field;
// schema/switchyard-v1.schema.json is generated from `routerConfigSchema`
// (npm run schema). Why zod: see schema-kit.ts (transforms, cross-field
// refinements that still run when a field failed, our own messages, and JSON
// Schema output, all from one declaration).
import { isIP } from 'node:net';
import { ConfigError } from '../errors.js';
import { flowControlSchema, type FlowControlConfig } from './flow-control.js';
import { SESSION_DEFAULTS, sessionsSchema, type SessionsConfig } from './sessions.js';
import { responsesSchema, type ResponsesConfig } from './responses.js';
import { kvEventsEndpointSchema, poolPrefixSchema, preciseRules, tierWeightsSchema, type KvEventsEndpointConfig, type PoolPrefixConfig, type TierWeightsConfig } from './prefix-mode.js';
import { extProcSchema, haSchema, type ExtProcConfig, type HaConfig } from './ha.js';
import { ALWAYS, isMapping, strict, toConfigIssues, z } from './schema-kit.js';
import { tracingSchema, type TracingConfig } from './tracing.js';
import { batchSchema, type BatchConfig } from './batch.js';
import { discoverySchema, type DiscoveryConfig } from './discovery.js';
import { ACCELERATOR_NAMES, type AcceleratorName } from '../accelerators.js';

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
}

export interface PluginSpec {
  type: string;
  /** Plugin-specific parameters; the registry's factory fills defaults. */
  params: Record<string, unknown>;
}

export interface ScorerSpec extends PluginSpec {
  weight: number;
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
}

export const UPSTREAM_CLIENTS = ['auto', 'h1', 'native', 'undici'] as const;

export interface ProxyConfig {
  /** Upstream HTTP client: the lean built-in HTTP/1.1 client, the native (addon) HTTP/1.1 client, or undici. */
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
}

export interface RouterConfig {
  apiVersion: typeof API_VERSION;
  kind: 'Router';
  listen: { host: string; port: number };
  pools: PoolConfig[];
  scheduling: SchedulingConfig;
  dataLayer: DataLayerConfig;
  proxy: ProxyConfig;
  limits: LimitsConfig;
  logging: { level: (typeof LOG_LEVELS)[number] };
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
  /** Prefill/decode disaggregation (docs/disaggregation.md); undefined: every request goes to one endpoint. */
  disaggregation?: DisaggregationConfig;
  /** Hot standby over a Redis lease (src/ha/); undefined: a single router. */
  ha?: HaConfig;
  /** The Envoy ext_proc gRPC listener (src/extproc/); undefined: none. */
  extProc?: ExtProcConfig;
  /** The async processor (docs/batch.md); undefined when the config has none. */
  batch?: BatchConfig;
}

export const PD_MODES = ['auto', 'nixl', 'sglang'] as const;

export interface DisaggregationConfig {
  /** nixl: prefill then decode (vLLM); sglang: both at once with bootstrap fields; auto: by the pool's engine. */
  mode: (typeof PD_MODES)[number];
  /** Disaggregate when the prompt's uncached tokens on the chosen decode endpoint reach this. */
  thresholdTokens: number;
  /** A prefill leg that has not answered by then is abandoned: the decode endpoint prefills itself. */
  prefillTimeoutMs: number;
  /** SGLang bootstrap port of the prefill engines. */
  bootstrapPort: number;
  /** The prefill profile (the decode leg uses `scheduling`). */
  prefill: { filters: PluginSpec[]; scorers: ScorerSpec[]; picker: PluginSpec };
  /** The decode profile: scorers and picker of the decode pick in pools with prefill endpoints (absent: `scheduling`'s). */
  decode?: { scorers: ScorerSpec[]; picker: PluginSpec };
}

export interface AdminConfig {
  host: string;
  port: number;
  /** Bearer token the admin API requires (required when host is not a loopback address). */
  token?: string;
  /** Environment variable holding the token (instead of `token`). */
  tokenEnv?: string;
  /** How long a drain (admin API, reload) lets in-flight requests finish before the endpoint is removed anyway. */
  drainGraceMs: number;
}

export const DEFAULT_SCORERS: ScorerSpec[] = [
  { type: 'prefix-cache', weight: 3, params: {} },
  { type: 'queue', weight: 2, params: {} },
  { type: 'kv-cache-utilization', weight: 2, params: {} },
];
export const DEFAULT_FILTERS: PluginSpec[] = [
  { type: 'model', params: {} },
  { type: 'healthy', params: {} },
  { type: 'role', params: {} },
  // last: it narrows to a session's pinned endpoint among those that passed (a request without a session key passes untouched)
  { type: 'session-affinity', params: {} },
];

export const DEFAULTS = {
  listen: { host: '127.0.0.1', port: 8000 },
  scheduling: { picker: 'max-score', prefixBlockSize: 64 },
  dataLayer: {
    scrapeIntervalMs: 50,
    staleAfterMs: 2000,
    healthIntervalMs: 1000,
    healthTimeoutMs: 1000,
    breakerFailures: 3,
    breakerCooldownMs: 5000,
  } satisfies DataLayerConfig,
  proxy: {
    client: 'auto' as (typeof UPSTREAM_CLIENTS)[number],
    maxRetries: 2,
    connectionsPerEndpoint: 256,
    connectTimeoutMs: 2000,
    headersTimeoutMs: 300_000,
    bodyTimeoutMs: 300_000,
  } satisfies ProxyConfig,
  limits: {
    maxBodyBytes: 16 * 1024 * 1024,
    requestBodyTimeoutMs: 30_000,
    maxJsonDepth: 128,
    parseOffloadBytes: 256 * 1024,
    parseWorkers: 2,
  } satisfies LimitsConfig,
  logging: { level: 'info' as const },
  admin: { host: '127.0.0.1', port: 8001, drainGraceMs: 30_000 },
  disaggregation: { thresholdTokens: 256, prefillTimeoutMs: 30_000, bootstrapPort: 8998 },
};

export const DEFAULT_PREFILL_FILTERS: PluginSpec[] = [
  { type: 'model', params: {} },
  { type: 'healthy', params: {} },
  { type: 'role', params: { roles: ['prefill'], preferBoth: false } },
];
export const DEFAULT_DECODE_SCORERS: ScorerSpec[] = [
  { type: 'kv-cache-utilization', weight: 2, params: {} },
  { type: 'running-requests', weight: 2, params: {} },
];
export const DEFAULT_PREFILL_SCORERS: ScorerSpec[] = [
  { type: 'prefix-cache', weight: 3, params: {} },
  { type: 'queue', weight: 2, params: {} },
];

/** True for a loopback listen address (127.0.0.0/8, ::1, localhost). */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  return h === 'localhost' || h === '::1' || /^127\.\d+\.\d+\.\d+$/.test(h) || h === '::ffff:127.0.0.1';
}

/** True when an http URL's host is an IP address literal (what `proxy.client: auto` hands to the native client). */
export function hostIsIp(url: string): boolean {
  try {
    return isIP(new URL(url).hostname.replace(/^\[|\]$/g, '')) !== 0;
  } catch {
    return false;
  }
}

/** True when an http URL's host is an IP address literal or localhost (what the native client can connect to). */
export function hostIsAddress(url: string): boolean {
  try {
    const host = new URL(url).hostname.replace(/^\[|\]$/g, '');
    return host === 'localhost' || isIP(host) !== 0;
  } catch {
    return false;
  }
}

/**
 * The origin (`scheme://host[:port]`, scheme lower-cased) of an http(s) URL
 * without path, query, fragment or credentials, or null. The clients and the
 * data layer take the stored URL as is: `HTTP://h` failed in the h1 client,
 * and a `#fragment` made the data layer's undici client throw at startup.
 */
function httpOrigin(s: string): string | null {
  try {
    const u = new URL(s);
    const ok =
      (u.protocol === 'http:' || u.protocol === 'https:') && u.hostname !== '' && (u.pathname === '/' || u.pathname === '') &&
      !u.search && !u.hash && !s.includes('#') && !u.username && !u.password;
    return ok ? `${u.protocol}//${u.host}` : null;
  } catch {
    return null;
  }
}

/** Control characters (C0 and DEL): not allowed in an endpoint name, which goes into a response header. */
const CONTROL_CHARS = /[\x00-\x1f\x7f]/;

// ---- the schema (zod 4; see schema-kit.ts for why zod). Messages keep the
// router config's style: "must be ... (got <value>)", "is required".

const got = (v: unknown) => JSON.stringify(v);
const listError = (i: { input?: unknown }) => (i.input === undefined ? 'is required' : 'must be a list');

const nonEmpty = () =>
  z.string({ error: (i) => (i.input === undefined ? 'is required' : 'must be a non-empty string') }).min(1, { error: 'must be a non-empty string' });

function oneOf<const T extends readonly [string, ...string[]]>(allowed: T) {
  return z.enum(allowed, {
    error: (i) => (i.input === undefined ? `is required (one of: ${allowed.join(', ')})` : `must be one of: ${allowed.join(', ')} (got ${got(i.input)})`),
  });
}

function int(min: number, max = Number.MAX_SAFE_INTEGER) {
  const error = (i: { input?: unknown }) => `must be an integer in [${min}, ${max}] (got ${got(i.input)})`;
  return z.int({ error }).gte(min, { error }).lte(max, { error });
}

function num(min: number, max: number) {
  const error = (i: { input?: unknown }) => `must be a number in [${min}, ${max}] (got ${got(i.input)})`;
  return z.number({ error }).gte(min, { error }).lte(max, { error });
}

const urlMessage = (s: unknown) => `must be an http(s) URL with no path, query, fragment or credentials, e.g. http://10.0.0.5:8000 (got ${got(s)})`;

export const endpointConfigSchema = strict(
  {
    name: nonEmpty()
      .refine((s) => !CONTROL_CHARS.test(s), {
        error: (i) => `must not contain control characters (it is sent in the x-switchyard-endpoint header; got ${got(i.input)})`,
      })
      .optional()
      .describe('unique across all pools; default host:port of url'),
    url: nonEmpty()
      .transform((s, ctx) => {
        const origin = httpOrigin(s);
        if (origin === null) {
          ctx.addIssue({ code: 'custom', message: urlMessage(s), input: s });
          return z.NEVER;
        }
        return origin;
      })
      .describe('http://host:port or https://host:port, no path, query, fragment or credentials'),
    role: oneOf(ROLES).default('both'),
    revision: nonEmpty().optional(),
    bootstrapPort: int(1, 65535).optional().describe("SGLang prefill endpoints: the engine's bootstrap port (default disaggregation.bootstrapPort)"),
    capacity: strict(
      { gpuBlocks: int(0, 2 ** 31 - 1).default(0), cpuBlocks: int(0, 2 ** 31 - 1).default(0), diskBlocks: int(0, 2 ** 31 - 1).default(0) },
      'must be a mapping',
    )
      .optional()
      .describe('prefix-index blocks (of scheduling.prefixBlockSize bytes) per tier; default: learnt from the engine'),
    kvEvents: kvEventsEndpointSchema.optional().describe("the engine's KV-event publisher (pools with prefix.mode precise)"),
  },
  'must be a mapping',
).transform((e): EndpointConfig => ({
  name: e.name ?? safeName(e.url),
  url: e.url,
  role: e.role,
  ...(e.revision ? { revision: e.revision } : {}),
  ...(e.bootstrapPort !== undefined ? { bootstrapPort: e.bootstrapPort } : {}),
  ...(e.capacity ? { capacity: e.capacity } : {}),
  ...(e.kvEvents ? { kvEvents: e.kvEvents } : {}),
}));

const poolSchema = strict(
  {
    name: nonEmpty(),
    engine: oneOf(ENGINES).default('vllm'),
    accelerator: oneOf(ACCELERATORS).default('nvidia'),
    models: z
      .array(nonEmpty(), { error: listError })
      .min(1, { error: 'must list at least one model' })
      .superRefine((models, ctx) => {
        // listed twice, each endpoint of the pool would be a candidate twice for the model
        const seen = new Set<unknown>();
        models.forEach((m, j) => {
          if (typeof m === 'string' && m !== '' && seen.has(m)) ctx.addIssue({ code: 'custom', path: [j], message: `duplicate model "${m}" in this pool`, input: m });
          seen.add(m);
        });
      }, ALWAYS),
    // at least one unless the pool has discovery (checked in crossFieldRules)
    endpoints: z.array(endpointConfigSchema, { error: listError }).default([]),
    batchLimit: int(1, 65_536)
      .optional()
      .describe("requests each endpoint runs at once (vLLM --max-num-seqs, SGLang --max-running-requests); default: learned from the engine's running/waiting counts"),
    prefix: poolPrefixSchema.describe('prefix matching of this pool (docs/prefix-index.md)'),
    speed: strict(
      {
        prefillCostFactor: num(0.01, 1000).optional().describe('multiplies the reference per-token prefill cost; default: the accelerator profile\'s'),
        decodeCostFactor: num(0.01, 1000).optional().describe('multiplies the reference inter-token latency; default: the accelerator profile\'s'),
      },
      'must be a mapping {prefillCostFactor, decodeCostFactor}',
    )
      .optional()
      .describe("the pool's speed against the reference: seeds the latency model of its endpoints"),
    cost: num(0, 1e6).optional().describe("relative cost of one endpoint per unit of time; default: the accelerator profile's"),
    discovery: discoverySchema.optional().describe('endpoints from Kubernetes pods (docs/operations.md); absent = the endpoints list only'),
  },
  'must be a mapping',
);

const paramsSchema = z
  .record(z.string(), z.unknown(), { error: 'must be a mapping' })
  .prefault({})
  .describe("the plugin's parameters, checked by its factory");

function pluginSpecSchema(withWeight: boolean) {
  const message = withWeight ? 'must be a mapping {type, weight, params}' : 'must be a plugin type name or a mapping {type, params}';
  const byName = z
    .string({ error: message })
    .min(1, { error: message })
    .transform((type) => ({ type, weight: 1, params: {} as Record<string, unknown> }));
  const mapping = strict({ type: nonEmpty(), weight: num(0, 1e6).default(1), params: paramsSchema }, message);
  const full = withWeight ? mapping : strict({ type: nonEmpty(), params: paramsSchema }, message).transform((s) => ({ ...s, weight: 1 }));
  return z.union([byName, full], { error: message });
}

const filterSpec = pluginSpecSchema(false).transform(({ type, params }): PluginSpec => ({ type, params }));
const scorerSpec = pluginSpecSchema(true).transform(({ type, weight, params }): ScorerSpec => ({ type, weight, params }));

const schedulingSchema = strict(
  {
    filters: z
      .array(filterSpec, { error: listError })
      .default(() => DEFAULT_FILTERS.map((s) => ({ ...s, params: { ...s.params } })))
      .describe('applied in order; a type name or {type, params}'),
    scorers: z
      .array(scorerSpec, { error: listError })
      .default(() => DEFAULT_SCORERS.map((s) => ({ ...s, params: { ...s.params } })))
      .describe('{type, weight, params}; [] = no scoring'),
    picker: filterSpec.default(() => ({ type: DEFAULTS.scheduling.picker, params: {} })),
    prefixBlockSize: int(1, 1 << 20).default(DEFAULTS.scheduling.prefixBlockSize).describe('bytes per prefix-index block'),
    tierWeights: tierWeightsSchema,
  },
  'must be a mapping',
).prefault({});

const d = DEFAULTS.dataLayer;
const dataLayerSchema = strict(
  {
    scrapeIntervalMs: int(0, 3_600_000).default(d.scrapeIntervalMs),
    staleAfterMs: int(1, 3_600_000).default(d.staleAfterMs).describe('the one staleness setting: metrics older than this are ignored by scorers and flow control'),
    healthIntervalMs: int(0, 3_600_000).default(d.healthIntervalMs),
    healthTimeoutMs: int(1, 3_600_000).default(d.healthTimeoutMs),
    breakerFailures: int(1, 1_000_000).default(d.breakerFailures),
    breakerCooldownMs: int(1, 3_600_000).default(d.breakerCooldownMs),
  },
  'must be a mapping',
).prefault({});

const p = DEFAULTS.proxy;
const proxySchema = strict(
  {
    client: oneOf(UPSTREAM_CLIENTS).default(p.client),
    maxRetries: int(0, 10).default(p.maxRetries),
    connectionsPerEndpoint: int(1, 65536).default(p.connectionsPerEndpoint),
    connectTimeoutMs: int(1, 3_600_000).default(p.connectTimeoutMs),
    headersTimeoutMs: int(1, 86_400_000).default(p.headersTimeoutMs),
    bodyTimeoutMs: int(0, 86_400_000).default(p.bodyTimeoutMs),
  },
  'must be a mapping',
).prefault({});

/** What a user writes in a switchyard/v1 Router config (the published JSON Schema is generated from it). */
export const routerConfigSchema = strict(
  {
    apiVersion: z.literal(API_VERSION, { error: (i) => `must be "${API_VERSION}" (got ${got(i.input)})` }),
    kind: z.literal('Router', { error: (i) => `must be "Router" (got ${got(i.input)})` }),
    listen: strict(
      { host: nonEmpty().default(DEFAULTS.listen.host), port: int(0, 65535).default(DEFAULTS.listen.port) },
      'must be a mapping',
    ).prefault({}),
    pools: z.array(poolSchema, { error: listError }).min(1, { error: 'must list at least one pool' }),
    scheduling: schedulingSchema,
    dataLayer: dataLayerSchema,
    proxy: proxySchema,
    limits: strict(
      {
        maxBodyBytes: int(1, 2 ** 31 - 1).default(DEFAULTS.limits.maxBodyBytes),
        requestBodyTimeoutMs: int(1, 3_600_000).default(DEFAULTS.limits.requestBodyTimeoutMs),
        maxJsonDepth: int(1, 10_000).default(DEFAULTS.limits.maxJsonDepth).describe('deepest nesting of arrays/objects in a request body'),
        parseOffloadBytes: int(0, 2 ** 31 - 1)
          .default(DEFAULTS.limits.parseOffloadBytes)
          .describe('bodies larger than this are parsed in a worker thread (0: every body)'),
        parseWorkers: int(1, 64).default(DEFAULTS.limits.parseWorkers).describe('worker threads for parsing large bodies'),
      },
      'must be a mapping',
    ).prefault({}),
    logging: strict({ level: oneOf(LOG_LEVELS).default(DEFAULTS.logging.level) }, 'must be a mapping').prefault({}),
    tracing: tracingSchema.describe('OpenTelemetry tracing over OTLP (docs/observability.md); off by default'),
    flowControl: flowControlSchema.optional().describe('flow control (docs/flow-control.md); absent = first come, first served'),
    sessions: sessionsSchema.describe('conversations: identification, pins to endpoints, turn priority (docs/responses.md)'),
    responses: responsesSchema.describe('the Responses API and its store (docs/responses.md)'),
    disaggregation: strict(
      {
        mode: oneOf(PD_MODES).default('auto').describe('nixl (vLLM, sequential), sglang (bootstrap, both legs at once), auto (by pool engine)'),
        thresholdTokens: int(0, 10_000_000)
          .default(DEFAULTS.disaggregation.thresholdTokens)
          .describe("disaggregate when the prompt's uncached tokens on the chosen decode endpoint reach this"),
        prefillTimeoutMs: int(1, 3_600_000).default(DEFAULTS.disaggregation.prefillTimeoutMs),
        bootstrapPort: int(1, 65535).default(DEFAULTS.disaggregation.bootstrapPort),
        prefill: strict(
          {
            filters: z
              .array(filterSpec, { error: listError })
              .default(() => DEFAULT_PREFILL_FILTERS.map((s) => ({ ...s, params: { ...s.params } }))),
            scorers: z
              .array(scorerSpec, { error: listError })
              .default(() => DEFAULT_PREFILL_SCORERS.map((s) => ({ ...s, params: { ...s.params } }))),
            picker: filterSpec.default(() => ({ type: DEFAULTS.scheduling.picker, params: {} })),
          },
          'must be a mapping',
        )
          .prefault({})
          .describe('the prefill profile: filters, scorers, picker (the decode leg uses scheduling)'),
        decode: strict(
          {
            scorers: z
              .array(scorerSpec, { error: listError })
              .default(() => DEFAULT_DECODE_SCORERS.map((s) => ({ ...s, params: { ...s.params } }))),
            picker: filterSpec.default(() => ({ type: DEFAULTS.scheduling.picker, params: {} })),
          },
          'must be a mapping',
        )
          .optional()
          .describe("the decode profile: scorers and picker of decode picks in pools with prefill endpoints (filters: scheduling's); absent: scheduling's scorers"),
      },
      'must be a mapping',
    )
      .optional()
      .describe('prefill/decode disaggregation (docs/disaggregation.md); absent = off'),
    admin: strict(
      {
        host: nonEmpty().default(DEFAULTS.admin.host).describe('listen address of the admin API (loopback by default)'),
        port: int(0, 65535).default(DEFAULTS.admin.port),
        token: nonEmpty().optional().describe('bearer token the admin API requires; required when host is not loopback'),
        tokenEnv: nonEmpty().optional().describe('name of an environment variable holding the token'),
        drainGraceMs: int(0, 86_400_000).default(DEFAULTS.admin.drainGraceMs).describe('how long a drain lets in-flight requests finish'),
      },
      'must be a mapping',
    )
      .optional()
      .describe('the admin API on its own listener (docs/operations.md); absent = none'),
    ha: haSchema.optional().describe('hot standby over a Redis lease (docs/operations.md); absent = a single router'),
    extProc: extProcSchema.optional().describe('Envoy ext_proc endpoint-picker listener (docs/operations.md); absent = none'),
    batch: batchSchema.optional().describe('the async processor over a Redis stream (docs/batch.md); absent = off'),
  },
  'the config must be a YAML mapping',
  'unknown top-level field',
);

type RouterInput = z.output<typeof routerConfigSchema>;

/** A plugin spec as far as it parsed (the raw value when its own checks failed), or null. */
function specOf(v: unknown): PluginSpec | null {
  if (typeof v === 'string') return v === '' ? null : { type: v, params: {} };
  if (!isMapping(v) || typeof v.type !== 'string' || v.type === '') return null;
  return { type: v.type, params: isMapping(v.params) ? v.params : {} };
}

/** The name an endpoint will have, from its raw or parsed value ('' when it has none). */
function endpointName(e: unknown): string {
  if (!isMapping(e)) return '';
  if (typeof e.name === 'string') return e.name;
  const origin = typeof e.url === 'string' ? httpOrigin(e.url) : null;
  return origin ? safeName(origin) : '';
}

/**
 * Rules across fields: unique pool and endpoint names, one prefix-cache
 * scorer, the plugins' own parameter checks, and what the upstream client can
 * reach. They run on whatever parsed, so they are reported with the rest.
 */
function crossFieldRules(validatePlugin?: PluginCheck) {
  return (v: RouterInput, ctx: z.core.$RefinementCtx<RouterInput>) => {
    const add = (path: PropertyKey[], message: string) => ctx.addIssue({ code: 'custom', path, message, input: undefined });
    const pools: unknown[] = Array.isArray(v.pools) ? v.pools : [];
    const poolNames = new Set<string>();
    const epNames = new Set<string>();
    pools.forEach((pool, i) => {
      if (!isMapping(pool)) return;
      if (typeof pool.name === 'string' && pool.name !== '') {
        if (poolNames.has(pool.name)) add(['pools', i, 'name'], `duplicate pool name "${pool.name}"`);
        poolNames.add(pool.name);
      }
      if ((pool.endpoints === undefined || (Array.isArray(pool.endpoints) && pool.endpoints.length === 0)) && pool.discovery === undefined)
        add(['pools', i, 'endpoints'], 'is required: at least one endpoint (or give the pool discovery)');
      if (pool.discovery !== undefined && isMapping(pool.prefix) && pool.prefix.mode === 'precise')
        add(['pools', i, 'prefix', 'mode'], 'precise mode needs each endpoint\'s kvEvents publisher: not available for discovered endpoints (use approximate)');
      if (!Array.isArray(pool.endpoints)) return;
      pool.endpoints.forEach((e, j) => {
        const name = endpointName(e);
        if (name === '' || CONTROL_CHARS.test(name)) return;
        if (epNames.has(name)) add(['pools', i, 'endpoints', j, 'name'], `duplicate endpoint name "${name}" (names are unique across pools)`);
        epNames.add(name);
      });
    });

    // the precise pools share one index and one subscription per publisher (what buildPrecise relies on)
    preciseRules(pools, add, endpointName);

    const s = isMapping(v.scheduling) ? v.scheduling : undefined;
    if (s) {
      const scorers: unknown[] = Array.isArray(s.scorers) ? s.scorers : [];
      // a decision carries one prefix-cache scorer's block counts (the request path uses them to
      // forget what a failed pick recorded): a second one would overwrite them
      const prefixAt = scorers.map((x, i) => (specOf(x)?.type === 'prefix-cache' ? i : -1)).filter((i) => i >= 0);
      if (prefixAt.length > 1) add(['scheduling', 'scorers', prefixAt[1]!], 'at most one prefix-cache scorer (give it a larger weight instead)');
      if (validatePlugin) {
        const check = (kind: 'filter' | 'scorer' | 'picker', x: unknown, path: PropertyKey[]) => {
          const spec = specOf(x);
          if (spec) for (const m of validatePlugin(kind, spec)) add(path, m);
        };
        if (Array.isArray(s.filters)) s.filters.forEach((x, i) => check('filter', x, ['scheduling', 'filters', i]));
        scorers.forEach((x, i) => check('scorer', x, ['scheduling', 'scorers', i]));
        check('picker', s.picker, ['scheduling', 'picker']);
      }
    }
    const pdp = isMapping(v.disaggregation) && isMapping(v.disaggregation.prefill) ? v.disaggregation.prefill : undefined;
    if (pdp && validatePlugin) {
      const check = (kind: 'filter' | 'scorer' | 'picker', x: unknown, path: PropertyKey[]) => {
        const spec = specOf(x);
        if (spec) for (const m of validatePlugin(kind, spec)) add(path, m);
      };
      const base = ['disaggregation', 'prefill'];
      if (Array.isArray(pdp.filters)) pdp.filters.forEach((x, i) => check('filter', x, [...base, 'filters', i]));
      if (Array.isArray(pdp.scorers)) pdp.scorers.forEach((x, i) => check('scorer', x, [...base, 'scorers', i]));
      check('picker', pdp.picker, [...base, 'picker']);
    }
    const pdd = isMapping(v.disaggregation) && isMapping(v.disaggregation.decode) ? v.disaggregation.decode : undefined;
    if (pdd && validatePlugin) {
      const check = (kind: 'scorer' | 'picker', x: unknown, path: PropertyKey[]) => {
        const spec = specOf(x);
        if (spec) for (const m of validatePlugin(kind, spec)) add(path, m);
      };
      const base = ['disaggregation', 'decode'];
      if (Array.isArray(pdd.scorers)) pdd.scorers.forEach((x, i) => check('scorer', x, [...base, 'scorers', i]));
      check('picker', pdd.picker, [...base, 'picker']);
    }

    // a revision of a pool that prefills must also decode (a prefill leg pairs only within its revision)
    pools.forEach((pool, i) => {
      if (!isMapping(pool) || !Array.isArray(pool.endpoints)) return;
      const roles = new Map<string, { prefill: number; decode: boolean }>();
      pool.endpoints.forEach((e, j) => {
        if (!isMapping(e)) return;
        const rev = typeof e.revision === 'string' ? e.revision : '';
        const r = roles.get(rev) ?? { prefill: -1, decode: false };
        if (e.role === 'prefill' && r.prefill < 0) r.prefill = j;
        if (e.role === 'decode' || e.role === 'both') r.decode = true;
        roles.set(rev, r);
      });
      for (const [rev, r] of roles) {
        if (r.prefill >= 0 && !r.decode)
          add(
            ['pools', i, 'endpoints', r.prefill, 'role'],
            `a disaggregated pool needs decode endpoints: this pool has prefill endpoints${rev ? ` of revision "${rev}"` : ''} but no endpoint of role decode (or both)${rev ? ' in that revision' : ''}`,
          );
      }
    });

    if (isMapping(v.admin) && typeof v.admin.host === 'string' && !isLoopback(v.admin.host) && v.admin.token === undefined && v.admin.tokenEnv === undefined)
      add(['admin', 'token'], `required when admin.host is not a loopback address (${v.admin.host}): set token or tokenEnv`);

    const client = isMapping(v.proxy) ? v.proxy.client : undefined;
    if (client === 'h1' || client === 'native') {
      pools.forEach((pool, i) => {
        if (!isMapping(pool) || !Array.isArray(pool.endpoints)) return;
        pool.endpoints.forEach((e, j) => {
          const url = isMapping(e) && typeof e.url === 'string' ? httpOrigin(e.url) : null;
          if (url === null) return; // reported by the url field
          if (url.startsWith('https:')) add(['pools', i, 'endpoints', j, 'url'], 'https endpoints need proxy.client: undici (or auto)');
          else if (client === 'native' && !hostIsAddress(url))
            add(['pools', i, 'endpoints', j, 'url'], 'proxy.client: native needs an IP address or localhost as host (it does no DNS lookups); use h1 or auto');
        });
      });
    }
  };
}

type PluginCheck = (kind: 'filter' | 'scorer' | 'picker', spec: PluginSpec) => string[];

/**
 * A YAML key with no value (`listen:`) is null: outside flowControl and
 * plugin params (whose own rules decide), null means absent.
 */
function dropNulls(v: unknown, top = true): unknown {
  if (Array.isArray(v)) return v.map((x) => dropNulls(x, false));
  if (!isMapping(v)) return v;
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v)) {
    if (x === null) continue;
    out[k] = (top && k === 'flowControl') || k === 'params' ? x : dropNulls(x, false);
  }
  return out;
}

/**
 * Validates a parsed config document and fills defaults. Throws ConfigError
 * listing every problem. `validatePlugin` (optional) checks plugin types and
 * parameters against the registry and returns problems as messages.
 */
/**
 * Session pins live where the Responses store lives: with `responses.store`
 * on Redis and no `sessions.store` given, pins and turn ends go to the same
 * Redis (so a conversation continued through another router replica keeps
 * its pin). An explicit `sessions.store` (memory included) wins.
 */
function sessionsFollowingResponses(doc: unknown, sessions: SessionsConfig, responses: ResponsesConfig): SessionsConfig {
  const given = isMapping(doc) && isMapping((doc as Record<string, unknown>).sessions) && ((doc as Record<string, Record<string, unknown>>).sessions).store !== undefined;
  if (given || responses.store.type !== 'redis' || responses.store.url === undefined) return sessions;
  return { ...sessions, store: { url: responses.store.url, keyPrefix: SESSION_DEFAULTS.keyPrefix, timeoutMs: SESSION_DEFAULTS.timeoutMs } };
}

export function validateConfig(doc: unknown, validatePlugin?: PluginCheck, source?: string): RouterConfig {
  if (!isMapping(doc)) throw new ConfigError([{ path: '', message: 'the config must be a YAML mapping' }], source);
  const r = routerConfigSchema.superRefine(crossFieldRules(validatePlugin), ALWAYS).safeParse(dropNulls(doc));
  if (!r.success) throw new ConfigError(toConfigIssues(r.error.issues), source);
  const v = r.data;
  const cfg: RouterConfig = {
    apiVersion: API_VERSION,
    kind: 'Router',
    listen: v.listen,
    pools: v.pools,
    scheduling: v.scheduling,
    dataLayer: v.dataLayer,
    proxy: v.proxy,
    limits: v.limits,
    logging: v.logging,
    sessions: sessionsFollowingResponses(doc, v.sessions, v.responses),
    responses: v.responses,
    tracing: v.tracing,
  };
  if (v.flowControl !== undefined) cfg.flowControl = v.flowControl;
  if (v.admin !== undefined) cfg.admin = v.admin;
  if (v.disaggregation !== undefined) cfg.disaggregation = v.disaggregation;
  if (v.ha !== undefined) cfg.ha = v.ha;
  if (v.extProc !== undefined) cfg.extProc = v.extProc;
  if (v.batch !== undefined) cfg.batch = { ...v.batch, consumer: v.batch.consumer ?? '', checkIntervalMs: v.batch.checkIntervalMs ?? v.dataLayer.scrapeIntervalMs } as BatchConfig;
  return cfg;
}


/** An endpoint name derived from its URL (host:port), used when `name` is omitted. */
export function safeName(url: string): string {
  try {
    const u = new URL(url);
    return u.host;
  } catch {
    return url;
  }
}
